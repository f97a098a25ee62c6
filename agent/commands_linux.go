//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/marksplit/marksplit/internal/ciliumnode"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
)

// Timeouts of the one-shot commands.
const (
	// readyTimeout bounds the first sync and, with --encryption=auto, the
	// first good read of the CiliumNode.
	readyTimeout = 30 * time.Second
	// convergeTimeout bounds the wait, after once or cleanup applied a
	// pass, for the cache to show the result.
	convergeTimeout = 5 * time.Second
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
	var err error
	switch o.cmd {
	case cmdRun:
		err = runAgent(ctx, o, log)
	case cmdOnce, cmdCleanup:
		err = runOnce(ctx, o, stdout, log)
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
	static mtupolicy.Mode      // with on or off
	src    *ciliumnode.Source  // with auto
	modes  chan mtupolicy.Mode // the latest mode not yet taken
}

func newModeSource(o options, log *slog.Logger) (*modeSource, error) {
	m := &modeSource{modes: make(chan mtupolicy.Mode, 1)}
	switch o.encryption {
	case encOn:
		m.static = mtupolicy.ModeOn
	case encOff:
		m.static = mtupolicy.ModeOff
	default:
		cfg, err := ciliumnode.InClusterConfig(o.nodeName)
		if err != nil {
			return nil, usageErrorf("--encryption=auto reads the CiliumNode from inside a pod: %v (or use --encryption=on or off)", err)
		}
		dir := os.Getenv(serviceAccountDirEnv)
		if dir == "" {
			dir = defaultServiceAccountDir
		}
		cfg.TokenFile = filepath.Join(dir, "token")
		cfg.CAFile = filepath.Join(dir, "ca.crt")
		cfg.Logger = log
		if m.src, err = ciliumnode.New(cfg); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// report offers the latest mode to the loop; older untaken ones go.
func (m *modeSource) report(mode mtupolicy.Mode) {
	select {
	case <-m.modes:
	default:
	}
	m.modes <- mode
}

// run reports modes until ctx ends.
func (m *modeSource) run(ctx context.Context) {
	if m.src == nil {
		m.report(m.static)
		return
	}
	m.src.Run(ctx, func(cm ciliumnode.Mode) {
		switch cm {
		case ciliumnode.Encrypting:
			m.report(mtupolicy.ModeOn)
		case ciliumnode.NotEncrypting:
			m.report(mtupolicy.ModeOff)
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
	modes, err := newModeSource(o, log)
	if err != nil {
		return err
	}
	ap, err := netwatch.DialApplier(netwatch.KernelDialer{})
	if err != nil {
		return err
	}
	defer ap.Close()
	var ln net.Listener
	if o.metricsAddr != "" {
		if ln, err = net.Listen("tcp", o.metricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	w := newWatcher(o, log)
	met := newMetrics(w, modes.src, snmpPath)
	r := newReconciler(w, ap, policyDesire(o.policy), log, func(line string) { log.Info(line) }, met)

	log.Info("marksplit "+version+" running", "tunnel_link", o.policy.TunnelLink,
		"table", uint32(o.policy.Table), "priority", o.policy.Priority, "encryption", o.encryption)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var g group
	var watching atomic.Bool
	watching.Store(true)
	g.Go(func() {
		defer watching.Store(false)
		w.Run(ctx)
	})
	g.Go(func() { modes.run(ctx) })
	if ln != nil {
		healthy := func() error {
			switch {
			case !watching.Load():
				return errors.New("the rtnetlink watcher is not running")
			case !w.Synced():
				return errors.New("the rtnetlink cache is not synced")
			}
			return nil
		}
		ready := func() error {
			if !r.converged.Load() {
				return errors.New("no converged pass yet (encryption mode unknown, or the last pass failed or is damped; see the log)")
			}
			return nil
		}
		g.Go(func() { serveHTTP(ctx, ln, met, healthy, ready, log) })
	}
	r.run(ctx, modes.modes)
	cancel()
	if !g.wait(stopTimeout) {
		log.Warn("stopping without waiting any longer for the watcher, the CiliumNode reader or the metrics server")
	}
	log.Info("stopped; routes and rules stay in place")
	return nil
}

// oneShot is the setup once, cleanup and plan share: a synced watcher
// and, when the command needs it, a known mode.
type oneShot struct {
	w      *netwatch.Watcher
	r      *reconciler
	cancel context.CancelFunc
	g      group
}

func startOneShot(ctx context.Context, o options, ap applier, desire desireFunc, emit func(string), log *slog.Logger) (*oneShot, error) {
	s := &oneShot{w: newWatcher(o, log)}
	s.r = newReconciler(s.w, ap, desire, log, emit, nil)
	var modes *modeSource
	if o.usesMode() {
		var err error
		if modes, err = newModeSource(o, log); err != nil {
			return nil, err
		}
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.g.Go(func() { s.w.Run(ctx) })
	var ch chan mtupolicy.Mode
	if modes != nil {
		s.g.Go(func() { modes.run(ctx) })
		ch = modes.modes
	}
	if err := s.r.waitReady(ctx, ch, modes != nil, readyTimeout); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func (s *oneShot) stop() {
	s.cancel()
	s.g.wait(stopTimeout)
}

// runOnce is `marksplit once` and `marksplit cleanup`: one pass, each
// change printed, then wait until the cache shows it converged.
func runOnce(ctx context.Context, o options, stdout io.Writer, log *slog.Logger) error {
	ap, err := netwatch.DialApplier(netwatch.KernelDialer{})
	if err != nil {
		return err
	}
	defer ap.Close()
	desire := policyDesire(o.policy)
	if o.cmd == cmdCleanup {
		desire = cleanupDesire(o.policy)
	}
	s, err := startOneShot(ctx, o, ap, desire, func(line string) { fmt.Fprintln(stdout, line) }, log)
	if err != nil {
		return err
	}
	defer s.stop()
	return s.r.once(ctx, convergeTimeout)
}

// runPlan is `marksplit plan`: the operations, one per line, kind first.
func runPlan(ctx context.Context, o options, stdout io.Writer, log *slog.Logger) error {
	s, err := startOneShot(ctx, o, nil, policyDesire(o.policy), func(string) {}, log)
	if err != nil {
		return err
	}
	defer s.stop()
	ops, lines, planned, err := s.r.plan()
	switch {
	case err != nil:
		return err
	case !planned:
		return errNoPlan
	}
	for i, op := range ops {
		fmt.Fprintf(stdout, "%-13s %s\n", opKindLabel(op), lines[i])
	}
	return nil
}

// errVerify is the error of a verify whose answers show no split.
var errVerify = errors.New("the split is not in place")

// runVerify is `marksplit verify`: RTM_GETROUTE for the peer without and
// with the mark, judged against the table and the tunnel link's MTU.
func runVerify(ctx context.Context, o options, stdout io.Writer, log *slog.Logger) error {
	ap, err := netwatch.DialApplier(netwatch.KernelDialer{})
	if err != nil {
		return err
	}
	defer ap.Close()
	s, err := startOneShot(ctx, o, nil, policyDesire(o.policy), func(string) {}, log)
	if err != nil {
		return err
	}
	defer s.stop()
	unmarked, err := ap.RouteGet(o.peer, 0)
	if err != nil {
		return err
	}
	marked, err := ap.RouteGet(o.peer, o.policy.Mark)
	if err != nil {
		return err
	}
	var (
		tun    netwatch.Link
		hasTun bool
		lines  [2]string
		mtus   [2]uint32
	)
	s.w.Read(func(v netwatch.View) {
		tun, hasTun = v.LinkByName(o.policy.TunnelLink)
		for i, rt := range []netwatch.Route{unmarked, marked} {
			mtus[i] = rt.MTU
			src := ""
			if rt.MTU == 0 {
				if l, ok := v.Link(rt.Index); ok {
					mtus[i], src = l.MTU, " (the link's)"
				}
			}
			words := getRouteWords(rt)
			hop := strings.TrimPrefix(words.Describe(v.Link), words.Dst.String())
			lines[i] = fmt.Sprintf("%v%s table %v mtu %d%s", o.peer, hop, rt.Table, mtus[i], src)
		}
	})
	fmt.Fprintf(stdout, "unmarked:  %s\n", lines[0])
	fmt.Fprintf(stdout, "mark %v: %s\n", o.policy.Mark, lines[1])
	var problems []string
	switch {
	case !hasTun:
		problems = append(problems, fmt.Sprintf("tunnel link %s does not exist", o.policy.TunnelLink))
	default:
		if unmarked.Table != o.policy.Table {
			problems = append(problems, fmt.Sprintf("unmarked traffic uses table %v, not %v", unmarked.Table, o.policy.Table))
		}
		if mtus[0] != tun.MTU {
			problems = append(problems, fmt.Sprintf("unmarked traffic has MTU %d, not %s's %d", mtus[0], tun.Name, tun.MTU))
		}
	}
	if marked.Table == o.policy.Table {
		problems = append(problems, fmt.Sprintf("marked traffic uses table %v too", marked.Table))
	}
	if len(problems) > 0 {
		fmt.Fprintf(stdout, "FAIL: %s\n", strings.Join(problems, "; "))
		return errVerify
	}
	fmt.Fprintf(stdout, "ok: unmarked traffic to %v uses table %v at %s's MTU %d; marked traffic does not use table %v (MTU %d)\n",
		o.peer, o.policy.Table, tun.Name, tun.MTU, o.policy.Table, mtus[1])
	return nil
}

// getRouteWords shapes a route-get answer for Route.Describe: the peer
// replaces the destination and its type, table and MTU are printed apart,
// and the answer's scope and metric say nothing here.
func getRouteWords(r netwatch.Route) netwatch.Route {
	r.MTU, r.Metric, r.Scope, r.Type = 0, 0, netwatch.ScopeUniverse, netwatch.RouteUnicast
	return r
}
