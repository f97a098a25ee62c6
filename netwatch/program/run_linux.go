//go:build linux

package program

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/marksplit/marksplit/internal/textsafe"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// stallTimeout ends once and cleanup when they wait this long for the
// cache, the policy or a change: a pass over a full table changes
// something every few milliseconds.
const stallTimeout = time.Minute

// Main runs the program on the command line and exits as Run says. The
// first SIGINT or SIGTERM ends the program as Run's context ending does;
// a second one ends it at once, with status 1 and one line.
func (p *Program) Main(build func() (func(netwatch.View) (reconcile.Desired, bool), error)) {
	ctx, stop := SignalContext(p.Name)
	code := p.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, build)
	stop()
	os.Exit(code)
}

// Run is the whole program: it parses args (a subcommand, then flags),
// calls build for the policy, and runs the subcommand:
//
//   - run (the default) keeps the kernel at the policy until ctx ends;
//   - once makes passes until one finds nothing to do, printing each
//     change on stdout;
//   - plan prints on stdout what a pass would change, and changes nothing;
//   - cleanup removes every route and rule the program owns, printing
//     each change on stdout.
//
// It returns the exit code: 0 when run's ctx ends, once or cleanup
// converged, or plan printed (and for --help, after the help on stdout);
// 2 with one line for a bad command line or an error of build; 1 with one
// line (in Logger when set) when it cannot start, a pass fails or the
// watcher stops. Its log goes to stderr unless build set Logger: a line
// per change with run, and the watcher's own lines only when they warn.
func (p *Program) Run(ctx context.Context, args []string, stdout, stderr io.Writer, build func() (func(netwatch.View) (reconcile.Desired, bool), error)) int {
	policy, err := p.parse(args, build)
	switch {
	case errors.Is(err, flag.ErrHelp):
		p.usage(stdout)
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "%s: %s\n", p.Name, oneLine(err))
		return exitUsage
	case p.vers:
		fmt.Fprintln(stdout, p.Name, p.Version)
		return exitOK
	}
	log, wlog := p.Logger, p.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(stderr, nil))
		wlog = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if p.own != nil && !p.own.Watch {
		err = p.own.Run(ctx, &Session{Command: p.cmd, Logger: log, Stdout: stdout})
	} else {
		err = p.serve(ctx, policy, stdout, stderr, log, wlog)
	}
	switch {
	case err == nil:
		return exitOK
	case p.Logger != nil:
		// The program's own log (JSON, say) holds its end too.
		p.Logger.Error(p.cmd + " failed: " + oneLine(err))
	default:
		fmt.Fprintf(stderr, "%s: %s\n", p.Name, oneLine(err))
	}
	return exitFailure
}

// serve runs the subcommand in the program's namespace.
func (p *Program) serve(ctx context.Context, policy func(netwatch.View) (reconcile.Desired, bool), stdout, stderr io.Writer, log, wlog *slog.Logger) error {
	ns := p.NetNS
	if p.netns != "" {
		var err error
		if ns, err = netwatch.OpenNetNS(p.netns); err != nil {
			return err
		}
		defer ns.Close() // after the watcher and the applier, which use it
	}
	var held *HeldError
	if p.cmd == cmdRun || p.cmd == cmdOnce || p.cmd == cmdCleanup {
		// One owner of the table and the priority in the namespace.
		lk, err := Claim(ns, p.Name, p.Table, p.Priority)
		switch {
		case err == nil:
			defer lk.Release()
			if w := lk.Warning(); w != "" {
				log.Warn(w)
			}
		case p.cmd == cmdCleanup && errors.As(err, &held):
		default:
			return err
		}
	}
	opts := netwatch.Options{RouteTables: p.Cache, Logger: wlog, NetNS: ns}
	if p.Table != 0 {
		opts.RouteTables = append([]netwatch.Table{netwatch.Table(p.Table)}, p.Cache...)
	}
	w := netwatch.New(opts)
	var a *netwatch.Applier
	if p.cmd != cmdPlan && held == nil {
		var err error
		if a, err = netwatch.DialApplier(ns); err != nil {
			return err
		}
	}
	s := &Session{Command: p.cmd, Watcher: w, Applier: a, Logger: log, Stdout: stdout}
	wctx, cancel := context.WithCancel(ctx)
	// A watcher that stops before the subcommand ends it ends the
	// subcommand with its error: the cache would stand still.
	ctx, stopped := context.WithCancelCause(ctx)
	defer stopped(nil)
	done := make(chan error, 1)
	go func() {
		err := w.Run(wctx)
		if wctx.Err() == nil {
			stopped(watcherError{fmt.Errorf("the rtnetlink watcher stopped: %v", err)})
		}
		done <- err
	}()
	defer func() {
		cancel()
		p.stop(s, log)
		<-done
		if a != nil {
			a.Close()
		}
	}()
	if held != nil {
		return p.cleanupBeside(ctx, w, held, stderr)
	}
	r := p.Reconciler
	if r == nil {
		r = &reconcile.Reconciler{}
	}
	r.Watcher, r.Applier, r.Policy, r.Resync = w, a, policy, p.Resync
	if r.Logger == nil {
		r.Logger = log
	}
	if p.cmd == cmdCleanup {
		own := reconcile.Own(p.Table, p.Priority)
		r.Policy = func(netwatch.View) (reconcile.Desired, bool) { return reconcile.Desired{Own: own}, true }
	} else if p.Start != nil {
		wait, err := p.Start(wctx, s)
		if err != nil {
			return err
		}
		if wait != nil && p.cmd != cmdRun {
			if err := wait(ctx); err != nil {
				return err
			}
		}
	}
	switch {
	case p.own != nil:
		if err := synced(ctx, w); err != nil {
			return err
		}
		return p.own.Run(ctx, s)
	case p.cmd == cmdPlan:
		return p.plan(ctx, w, policy, r.Describe, stdout)
	case p.cmd == cmdRun:
		log.Info(p.Name+": started", "table", p.Table, "priority", p.Priority, "protocol", p.Protocol)
		if err := r.Run(ctx); err != nil {
			return err
		}
		if err := watcherStopped(ctx); err != nil {
			return err
		}
		log.Info(p.Name + ": stopped; routes and rules stay in place")
		return nil
	}
	if err := once(ctx, r, stdout); err != nil {
		if werr := watcherStopped(ctx); werr != nil {
			return werr
		}
		return err
	}
	return nil
}

// watcherError is the cause of a subcommand's end by its watcher's.
type watcherError struct{ error }

// watcherStopped is the watcher's error when it ended ctx.
func watcherStopped(ctx context.Context) error {
	var we watcherError
	if errors.As(context.Cause(ctx), &we) {
		return we.error
	}
	return nil
}

// stopTimeout bounds the wait for a Session's goroutines once its
// subcommand ended: a program exits within 5 s of SIGTERM even if
// something hangs.
const stopTimeout = 3 * time.Second

// stop waits for s's goroutines, for stopTimeout at most.
func (p *Program) stop(s *Session, log *slog.Logger) {
	ended := make(chan struct{})
	go func() { s.g.Wait(); close(ended) }()
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-ended:
	case <-t.C:
		log.Warn(p.Name + ": stopping without waiting any longer for what Start started")
	}
}

// synced waits for w's first sync, for stallTimeout at most.
func synced(ctx context.Context, w *netwatch.Watcher) error {
	ctx, cancel := context.WithTimeout(ctx, stallTimeout)
	defer cancel()
	if err := w.WaitSynced(ctx); err != nil {
		return fmt.Errorf("the rtnetlink cache did not sync within %s", stallTimeout)
	}
	return nil
}

// cleanupBeside is cleanup when a running program holds the table or the
// priority: it never removes anything there, as the holder would put it
// back at once (and take the cleanup for a fight). It changes nothing, and
// succeeds when nothing owned is left, with a note on stderr; else it is
// refused, saying how many routes and rules it would have removed.
func (p *Program) cleanupBeside(ctx context.Context, w *netwatch.Watcher, held *HeldError, stderr io.Writer) error {
	if err := synced(ctx, w); err != nil {
		return err
	}
	var n int
	var err error
	w.Read(func(v netwatch.View) {
		var ops []netwatch.Op
		ops, err = reconcile.Plan(v, reconcile.Desired{Own: reconcile.Own(p.Table, p.Priority)})
		n = len(ops)
	})
	switch {
	case err != nil:
		return err
	case n == 0:
		fmt.Fprintf(stderr, "%s: note: %v; it has nothing left that cleanup would remove\n", p.Name, held)
		return nil
	}
	how := p.StopHolder
	if how == "" {
		how = "stop it first"
	}
	what := "the route or rule"
	if n > 1 {
		what = fmt.Sprintf("the %d routes and rules", n)
	}
	return fmt.Errorf("%w; it would put back at once %s cleanup would remove, so nothing was removed: %s", held, what, how)
}

// once is the once and cleanup subcommands: passes until one finds nothing
// to do, each change printed on stdout, ended by stallTimeout without one.
func once(ctx context.Context, r *reconcile.Reconciler, stdout io.Writer) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(stallTimeout, func() { cancel(fmt.Errorf("no change for %s", stallTimeout)) })
	defer stall.Stop()
	onChange := r.OnChange
	r.OnChange = func(op netwatch.Op, line string) {
		stall.Reset(stallTimeout)
		fmt.Fprintln(stdout, textsafe.Terminal(line))
		if onChange != nil {
			onChange(op, line)
		}
	}
	defer func() { r.OnChange = onChange }()
	return r.Once(ctx)
}

// errNoPlan is plan's error when the policy cannot tell.
var errNoPlan = errors.New("nothing planned: the policy cannot tell yet")

// plan is the plan subcommand: the operations a pass would make, one per
// line, kind first.
func (p *Program) plan(ctx context.Context, w *netwatch.Watcher, policy func(netwatch.View) (reconcile.Desired, bool), describe func(netwatch.Op, func(uint32) (netwatch.Link, bool)) string, stdout io.Writer) error {
	if err := synced(ctx, w); err != nil {
		return err
	}
	if describe == nil {
		describe = netwatch.Op.Describe
	}
	var lines []string
	ok := false
	var err error
	w.Read(func(v netwatch.View) {
		var d reconcile.Desired
		if d, ok = policy(v); !ok {
			return
		}
		var ops []netwatch.Op
		if ops, err = reconcile.Plan(v, d); err != nil {
			return
		}
		for _, op := range ops {
			kind := op.Kind.String()
			if op.Repair {
				kind = "route-repair"
			}
			lines = append(lines, fmt.Sprintf("%-13s %s", kind, textsafe.Terminal(describe(op, v.Link))))
		}
	})
	switch {
	case err != nil:
		return err
	case !ok:
		return errNoPlan
	}
	for _, l := range lines {
		fmt.Fprintln(stdout, l)
	}
	return nil
}

// oneLine is err's text on one line.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }
