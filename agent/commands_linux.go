//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/marksplit/marksplit/internal/ciliumnode"
	"github.com/marksplit/marksplit/internal/metricsserver"
	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/internal/textsafe"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/program"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// Timeouts of the one-shot commands.
const (
	// readyTimeout bounds the wait of once, plan and verify for their
	// inputs: with --encryption=auto, the first good read of the
	// CiliumNode (program.Program bounds the rest).
	readyTimeout = 30 * time.Second
)

// serviceAccountDirEnv overrides the service-account directory, for tests
// that run the agent outside a pod.
const serviceAccountDirEnv = "MARKSPLIT_SERVICEACCOUNT_DIR"

const defaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func newLogger(w io.Writer, format string) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}

// run is the agent: a program.Program around the mark-split policy, the
// encryption mode and the peers, and the agent's servers. It returns the
// exit code.
func run(args []string, stdout, stderr io.Writer) int {
	// SIGINT or SIGTERM stops the agent; a second one, at once.
	ctx, stop := program.SignalContext("marksplit")
	defer stop()
	var o options
	a := newAgent(&o, os.Getenv, stderr)
	return a.p.Run(ctx, args, stdout, stderr, a.build)
}

// agent is one run of the agent's Program: its options, and what build
// made of them for Start.
type agent struct {
	p      *program.Program
	o      *options
	getenv func(string) string
	stderr io.Writer
	log    *slog.Logger
	srcs   *sources
	l      *loop
	stdout io.Writer // Start's Session's: where once prints its own lines
}

// newAgent is the agent's Program, with its flags filling o.
func newAgent(o *options, getenv func(string) string, stderr io.Writer) *agent {
	def := mtupolicy.DefaultConfig()
	*o = options{policy: def}
	p := &program.Program{Name: "marksplit", Version: version, Usage: usage, Help: helpText,
		Table: reconcile.OwnTable(def.Table), Priority: reconcile.OwnPriority(def.Priority), Protocol: reconcile.OwnProtocol(def.Protocol),
		Resync: defaultResync, Cache: []netwatch.Table{netwatch.TableMain}}
	agentFlags(p.Flags(), o, getenv)
	a := &agent{p: p, o: o, getenv: getenv, stderr: stderr}
	p.Commands = []program.Command{
		{Name: cmdVerify, Usage: verifyUsage, Watch: true,
			Flags: func(fs *flag.FlagSet) { verifyFlags(fs, o) },
			Run:   func(_ context.Context, s *program.Session) error { return runVerify(*o, s, a.l) }},
		{Name: cmdHealth, Usage: healthUsage,
			Flags: func(fs *flag.FlagSet) { healthFlags(fs, o) },
			Run:   func(_ context.Context, s *program.Session) error { return runHealth(*o, s.Stdout) }},
	}
	p.Start = a.start
	return a
}

// check completes the options from the Program's and checks them.
func (a *agent) check() error {
	o, p := a.o, a.p
	o.cmd = p.Command()
	o.policy.Table, o.policy.Priority, o.policy.Protocol = netwatch.Table(p.Table), uint32(p.Priority), netwatch.Protocol(p.Protocol)
	if o.cmd == cmdHealth {
		return nil
	}
	if err := o.check(p.Flags(), a.getenv); err != nil {
		return err
	}
	p.AllowShared = o.allowShared
	if o.cmd == cmdRun && p.Flags().Lookup("netns").Value.String() != "" {
		return usageErrorf("--netns: run works in the network namespace it runs in, whose path MTUs, counters and probes it also reads (ip netns exec NAME marksplit run …)")
	}
	return nil
}

// build checks the command line, sets the Program's log, and makes the
// sources and the loop; the policy is the loop's.
func (a *agent) build() (func(netwatch.View) (reconcile.Desired, bool), error) {
	o, p := a.o, a.p
	if err := a.check(); err != nil || o.cmd == cmdHealth {
		return nil, err
	}
	a.log = newLogger(a.stderr, o.logFormat)
	p.Logger = a.log
	if soft := setMemoryLimit(); soft > 0 {
		a.log.Debug("memory: Go's soft limit set from the memory cgroup's", "bytes", soft)
	}
	var err error
	if a.srcs, err = newSources(*o, a.log); err != nil {
		return nil, err
	}
	a.l = newLoop(nil, nil, o.policy, a.log, a.emit, nil)
	a.l.pmtu = pathmtu.NewStore(o.pathMTU)
	if o.cmd == cmdOnce {
		// Program prints each change of once; the loop's own lines
		// ("node encryption: no") go there through emit.
		a.l.repairs = newRepairLog(func(string) {})
	}
	if cm := o.uninstallConfigMap; cm != "" {
		p.StopHolder = fmt.Sprintf("switch it off first (docs/operations.md, \"Uninstall\": kubectl -n kube-system create configmap %s) or stop it", cm)
	}
	p.Reconciler = a.l.r
	return a.l.r.Policy, nil
}

// emit is the loop's line: logged with run, printed with once; plan and
// verify say only what they were asked.
func (a *agent) emit(line string) {
	switch a.o.cmd {
	case cmdRun:
		a.log.Info(line)
	case cmdOnce:
		fmt.Fprintln(a.stdout, textsafe.Terminal(line))
	}
}

// start starts the sources and, with run, the agent's servers. once, plan
// and verify wait for the inputs their command needs, readyTimeout at most.
func (a *agent) start(ctx context.Context, s *program.Session) (func(context.Context) error, error) {
	a.stdout = s.Stdout
	if s.Command != cmdRun {
		known := a.srcs.start(ctx, s, a.l)
		what := a.srcs.waiting()
		return func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, readyTimeout)
			defer cancel()
			select {
			case <-known:
				return nil
			case <-ctx.Done():
				return fmt.Errorf("%s within %s (see the log)", what, readyTimeout)
			}
		}, nil
	}
	return nil, a.startRun(ctx, s)
}

// goer runs goroutines: a program.Session, or a test's group.
type goer interface{ Go(func()) }

// modeSource reports the encryption mode: static, or from the CiliumNode.
type modeSource struct {
	static mtupolicy.Mode     // with on or off
	src    *ciliumnode.Source // with auto
}

func newModeSource(o options, log *slog.Logger) (*modeSource, error) {
	m := &modeSource{}
	switch o.encryption {
	case encOn:
		m.static = mtupolicy.ModeOn
	case encOff:
		m.static = mtupolicy.ModeOff
	default:
		cfg, err := inClusterConfig(o.nodeName, log)
		if err != nil {
			return nil, usageErrorf("--encryption=auto reads the CiliumNode from inside a pod: %v (or use --encryption=on or off)", err)
		}
		if m.src, err = ciliumnode.New(cfg); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// run reports modes to report until ctx ends.
func (m *modeSource) run(ctx context.Context, report func(mtupolicy.Mode)) {
	if m.src == nil {
		report(m.static)
		return
	}
	m.src.Run(ctx, func(cm ciliumnode.Mode) {
		switch cm {
		case ciliumnode.Encrypting:
			report(mtupolicy.ModeOn)
		case ciliumnode.NotEncrypting:
			report(mtupolicy.ModeOff)
		}
	})
}

// startRun is the rest of `marksplit run`: the health socket, the
// metrics and their servers, the path MTU's prober and learner, Events
// and the Node condition, started on s once the Program has claimed the
// table and the priority and its watcher runs.
func (a *agent) startRun(ctx context.Context, s *program.Session) error {
	o, l, srcs, log := *a.o, a.l, a.srcs, a.log
	w := s.Watcher
	var hln *net.UnixListener
	var err error
	if o.healthSocket != "" {
		if hln, err = listenHealth(o.healthSocket); err != nil {
			return err
		}
	}
	sec, err := listenSecure(o, log)
	if err != nil {
		return err
	}
	met := newMetrics(w, o.policy, srcs.requests, snmpPath)
	l.met = met
	met.addPeers(l, srcs.peers)
	var pr *prober
	if o.policy.Peers {
		met.addPathMTU(l)
		if o.pathProbe {
			if pr, err = newProber(o, l, log); err != nil {
				return err
			}
			pr.register(met)
			l.probe = pr
		}
	}
	met.addAuth(sec.authz)
	l.ev = newNodeEvents(o, log)
	switchWhat := ""
	if srcs.uninstall != nil {
		switchWhat = srcs.uninstall.what
	}
	if l.ev != nil && srcs.uninstall != nil {
		l.ev.uninstall = func() (string, bool) { return switchWhat, l.switchedOff() }
	}
	if l.ev != nil && srcs.nodeEnc != nil {
		l.ev.standingDown = l.standingDown
	}
	cond, err := newNodeCondition(o, l, switchWhat, log)
	if err != nil {
		return err
	}
	met.addEvents(l.ev)
	met.addNodeCondition(cond)
	met.addUninstall(l, srcs.uninstall)
	met.addNodeEncryption(l, srcs.nodeEnc)

	metricsAt := "off"
	var ln net.Listener
	if o.metricsAddr != "" {
		// A port taken now is tried again, and warned about, by listenRetry
		// below: the agent runs without it meanwhile.
		ln, _ = net.Listen("tcp", o.metricsAddr)
		metricsAt = o.metricsAddr
		if ln != nil {
			metricsAt = ln.Addr().String()
		}
	}
	log.Info("marksplit "+version+" running", "tunnel_link", o.policy.TunnelLink,
		"table", uint32(o.policy.Table), "priority", o.policy.Priority, "encryption", o.encryption, "metrics_addr", metricsAt,
		"secure_metrics_addr", sec.addr(), "health_socket", o.healthSocket)
	if o.metricsAddr != "" && !loopbackOnly(o.metricsAddr) {
		log.Warn("metrics, /healthz and /readyz listen on " + metricsAt + ", beyond loopback: whoever reaches this node there can read them (the DaemonSet's probes need only 127.0.0.1)")
	}

	srcs.start(ctx, s, l)
	if pr != nil {
		pr.run(ctx, s)
	}
	if o.policy.Peers && o.pathLearn {
		lr := newLearner(l)
		s.Go(func() { lr.run(ctx) })
	}
	if l.ev != nil {
		s.Go(func() { l.ev.rec.Run(ctx) })
	}
	if cond != nil {
		s.Go(func() { cond.Run(ctx) })
	}
	// A watcher that stops ends the agent (program.Program), so the
	// cache it answers from is running while it answers.
	healthy := func() error {
		if !w.Stats().Synced {
			return errors.New("the rtnetlink cache is not synced")
		}
		return nil
	}
	ready := func() error {
		switch {
		case srcs.peers != nil && !l.peersKnown() && !l.switchedOff() && l.standingDown() == "":
			return errors.New("no list of the CiliumNodes yet: nothing is edited before the first (see the log)")
		case srcs.nodeEnc != nil && !l.nodeEncKnown() && !l.switchedOff():
			return errors.New("node encryption not read from " + srcs.nodeEnc.what + " yet: nothing is edited before it is (see the log)")
		case l.peersIncomplete() != "" && !l.switchedOff() && l.standingDown() == "":
			return errors.New(l.peersIncomplete())
		case !l.r.Converged():
			return errors.New("no converged pass yet (encryption mode unknown, or the last pass failed or waits for a rate-limited repair; see the log)")
		}
		return nil
	}
	if hln != nil {
		s.Go(func() { serveHealth(ctx, hln, healthy, ready, l.pathAnswer, log) })
	}
	if o.metricsAddr != "" {
		s.Go(func() {
			if ln == nil {
				ln = listenRetry(ctx, "metrics-addr", o.metricsAddr, met.listenFailed.WithLabelValues("metrics"), log)
			}
			if ln != nil {
				metricsserver.Serve(ctx, ln, metricsserver.DefaultLimits(), metricsserver.Probes(met.handler(log), healthy, ready), nil, log)
			}
		})
	}
	if sec.addr() != "off" {
		s.Go(func() { serveSecure(ctx, sec, met, log) })
	}
	return nil
}
