//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
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
	// readyTimeout bounds the first sync and, with --encryption=auto, the
	// first good read of the CiliumNode.
	readyTimeout = 30 * time.Second
	// convergeTimeout bounds how long once or cleanup goes without a
	// change: the wait for a pass to be planned, or for its next change.
	// A pass over a full table takes seconds of changes (100,000 routes:
	// 4 s, and more on a busy node), which no fixed bound would fit; and a
	// slow node may take seconds between two chunks of it (5 s was reached
	// in a loaded 6.1 guest). A minute, as netwatch/program's once: only a
	// hang reaches it.
	convergeTimeout = time.Minute
	// stopTimeout bounds the shutdown after SIGTERM: the process exits
	// within 5 s even if something hangs.
	stopTimeout = 3 * time.Second
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

// execute runs the parsed command and returns the exit code.
func execute(ctx context.Context, o options, stdout, stderr io.Writer) int {
	log := newLogger(stderr, o.logFormat)
	if soft := setMemoryLimit(); soft > 0 {
		log.Debug("memory: Go's soft limit set from the memory cgroup's", "bytes", soft)
	}
	var err error
	switch o.cmd {
	case cmdRun:
		err = runAgent(ctx, o, log)
	case cmdOnce, cmdCleanup:
		err = runOnce(ctx, o, stdout, stderr, log)
	case cmdPlan:
		err = runPlan(ctx, o, stdout, log)
	case cmdVerify:
		err = runVerify(ctx, o, stdout, log)
	}
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "marksplit: %v\n", err)
		return exitUsage
	}
	log.Error(o.cmd + " failed: " + err.Error())
	return exitFailure
}

// group runs goroutines and waits for them, at most for a while.
type group struct{ wg sync.WaitGroup }

func (g *group) Go(fn func()) { g.wg.Go(fn) }

// wait waits for the goroutines, for at most d; it reports whether they
// all ended.
func (g *group) wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

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

func newWatcher(o options, log *slog.Logger) *netwatch.Watcher {
	return netwatch.New(netwatch.Options{
		RouteTables: []netwatch.Table{netwatch.TableMain, o.policy.Table},
		Logger:      log,
	})
}

// runAgent is `marksplit run`.
func runAgent(ctx context.Context, o options, log *slog.Logger) error {
	lk, err := program.Claim(nil, "marksplit", reconcile.OwnTable(o.policy.Table), reconcile.OwnPriority(o.policy.Priority))
	if err != nil {
		return err
	}
	defer lk.Release()
	if w := lk.Warning(); w != "" {
		log.Warn(w)
	}
	srcs, err := newSources(o, log)
	if err != nil {
		return err
	}
	ap, err := netwatch.DialApplier(nil)
	if err != nil {
		return err
	}
	defer ap.Close()
	var hln *net.UnixListener
	if o.healthSocket != "" {
		if hln, err = listenHealth(o.healthSocket); err != nil {
			return err
		}
	}
	sec, err := listenSecure(o, log)
	if err != nil {
		return err
	}
	w := newWatcher(o, log)
	met := newMetrics(w, o.policy, srcs.requests, snmpPath)
	l := newLoop(w, ap, o.policy, false, log, func(line string) { log.Info(line) }, met)
	l.pmtu = pathmtu.NewStore(o.pathMTU)
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

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g group
	var watching atomic.Bool
	watching.Store(true)
	g.Go(func() {
		defer watching.Store(false)
		w.Run(ctx)
	})
	srcs.start(ctx, &g, l)
	if pr != nil {
		pr.run(ctx, &g)
	}
	if o.policy.Peers && o.pathLearn {
		lr := newLearner(l)
		g.Go(func() { lr.run(ctx) })
	}
	if l.ev != nil {
		g.Go(func() { l.ev.rec.Run(ctx) })
	}
	if cond != nil {
		g.Go(func() { cond.Run(ctx) })
	}
	healthy := func() error {
		switch {
		case !watching.Load():
			return errors.New("the rtnetlink watcher is not running")
		case !w.Stats().Synced:
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
		g.Go(func() { serveHealth(ctx, hln, healthy, ready, l.pathAnswer, log) })
	}
	if o.metricsAddr != "" {
		g.Go(func() {
			if ln == nil {
				ln = listenRetry(ctx, "metrics-addr", o.metricsAddr, met.listenFailed.WithLabelValues("metrics"), log)
			}
			if ln != nil {
				metricsserver.Serve(ctx, ln, metricsserver.DefaultLimits(), metricsserver.Probes(met.handler(log), healthy, ready), nil, log)
			}
		})
	}
	if sec.addr() != "off" {
		g.Go(func() { serveSecure(ctx, sec, met, log) })
	}
	l.r.Run(ctx)
	cancel()
	if !g.wait(stopTimeout) {
		log.Warn("stopping without waiting any longer for the watcher, the CiliumNode reader or the metrics server")
	}
	log.Info("stopped; routes and rules stay in place")
	return nil
}

// oneShot is the setup once, cleanup, plan and verify share: a synced
// watcher and, when the command needs it, a known mode.
type oneShot struct {
	w      *netwatch.Watcher
	l      *loop
	cancel context.CancelFunc
	g      group
}

func startOneShot(ctx context.Context, o options, ap *netwatch.Applier, emit func(string), log *slog.Logger) (*oneShot, error) {
	s := &oneShot{w: newWatcher(o, log)}
	s.l = newLoop(s.w, ap, o.policy, o.cmd == cmdCleanup, log, emit, nil)
	s.l.pmtu = pathmtu.NewStore(o.pathMTU)
	srcs, err := newSources(o, log)
	if err != nil {
		return nil, err
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.g.Go(func() { s.w.Run(ctx) })
	known := srcs.start(ctx, &s.g, s.l)
	if err := s.waitReady(ctx, known, srcs.waiting(), readyTimeout); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// waitReady waits until the watcher is synced and the inputs known; what
// says what is missing when they are not.
func (s *oneShot) waitReady(ctx context.Context, known <-chan struct{}, what string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := s.w.WaitSynced(ctx); err != nil {
		return fmt.Errorf("the rtnetlink cache did not sync within %s", timeout)
	}
	select {
	case <-known:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s within %s (see the log)", what, timeout)
	}
}

func (s *oneShot) stop() {
	s.cancel()
	s.g.wait(stopTimeout)
}

// runOnce is `marksplit once` and `marksplit cleanup`: passes until one
// finds nothing to do, each change printed.
func runOnce(ctx context.Context, o options, stdout, stderr io.Writer, log *slog.Logger) error {
	lk, err := program.Claim(nil, "marksplit", reconcile.OwnTable(o.policy.Table), reconcile.OwnPriority(o.policy.Priority))
	var held *program.HeldError
	switch {
	case err == nil:
		defer lk.Release()
		if w := lk.Warning(); w != "" {
			log.Warn(w)
		}
	case o.cmd == cmdCleanup && errors.As(err, &held):
		return cleanupBesideAgent(ctx, o, stderr, held, log)
	default:
		return err
	}
	ap, err := netwatch.DialApplier(nil)
	if err != nil {
		return err
	}
	defer ap.Close()
	var stall atomic.Pointer[time.Timer] // reset by every change
	s, err := startOneShot(ctx, o, ap, func(line string) {
		if t := stall.Load(); t != nil {
			t.Reset(convergeTimeout)
		}
		fmt.Fprintln(stdout, textsafe.Terminal(line))
	}, log)
	if err != nil {
		return err
	}
	defer s.stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := time.AfterFunc(convergeTimeout, func() { cancel(fmt.Errorf("no change for %s", convergeTimeout)) })
	defer t.Stop()
	stall.Store(t)
	return s.l.r.Once(ctx)
}

// cleanupBesideAgent is cleanup when a running agent holds the table or
// the priority: it never removes anything there, as the agent would put it
// back at once (and take the cleanup for a fight). It changes nothing and
// succeeds when the agent has already removed everything (the uninstall
// switch is on, or it runs with --encryption=off), and is refused otherwise.
func cleanupBesideAgent(ctx context.Context, o options, stderr io.Writer, held *program.HeldError, log *slog.Logger) error {
	s, err := startOneShot(ctx, o, nil, func(string) {}, log)
	if err != nil {
		return err
	}
	defer s.stop()
	ops, _, err := s.plan()
	if err != nil {
		return err
	}
	if len(ops) == 0 {
		fmt.Fprintf(stderr, "marksplit: note: %v; it has nothing left that cleanup would remove\n", held)
		return nil
	}
	cm := o.uninstallConfigMap
	if cm == "" {
		cm = defaultUninstallConfigMap
	}
	return fmt.Errorf("%w; it would put back at once the %d routes and rules cleanup would remove, so nothing was removed: switch it off first (docs/operations.md, \"Uninstall\": kubectl -n kube-system create configmap %s) or stop it", held, len(ops), cm)
}

// plan is what a pass would do now (cleanup's pass, for cleanup); lines
// describes each operation.
func (s *oneShot) plan() (ops []netwatch.Op, lines []string, err error) {
	ok := false
	s.w.Read(func(v netwatch.View) {
		var d reconcile.Desired
		if d, ok = s.l.r.Policy(v); !ok {
			return
		}
		if ops, err = reconcile.Plan(v, d); err != nil {
			return
		}
		for _, op := range ops {
			lines = append(lines, op.Describe(v.Link))
		}
	})
	switch {
	case err != nil:
		return nil, nil, err
	case !ok:
		return nil, nil, errNoPlan
	}
	return ops, lines, nil
}

// runPlan is `marksplit plan`: the operations, one per line, kind first.
func runPlan(ctx context.Context, o options, stdout io.Writer, log *slog.Logger) error {
	s, err := startOneShot(ctx, o, nil, func(string) {}, log)
	if err != nil {
		return err
	}
	defer s.stop()
	ops, lines, err := s.plan()
	if err != nil {
		return err
	}
	for i, op := range ops {
		fmt.Fprintf(stdout, "%-13s %s\n", opKindLabel(op), textsafe.Terminal(lines[i]))
	}
	return nil
}

// errNoPlan is the error of plan when the policy cannot tell.
var errNoPlan = errors.New("nothing planned: the policy cannot tell yet")
