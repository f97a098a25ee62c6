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
// line when it cannot start or a pass fails. Its log goes to stderr: a
// line per change with run, and the watcher's own lines only when they
// warn.
func (p *Program) Run(ctx context.Context, args []string, stdout, stderr io.Writer, build func() (func(netwatch.View) (reconcile.Desired, bool), error)) int {
	policy, err := p.parse(args, build)
	switch {
	case errors.Is(err, flag.ErrHelp):
		p.usage(stdout)
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "%s: %s\n", p.Name, oneLine(err))
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	wlog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := p.serve(ctx, policy, stdout, log, wlog); err != nil {
		fmt.Fprintf(stderr, "%s: %s\n", p.Name, oneLine(err))
		return exitFailure
	}
	return exitOK
}

// serve runs the subcommand in the program's namespace.
func (p *Program) serve(ctx context.Context, policy func(netwatch.View) (reconcile.Desired, bool), stdout io.Writer, log, wlog *slog.Logger) error {
	ns := p.NetNS
	if p.netns != "" {
		var err error
		if ns, err = netwatch.OpenNetNS(p.netns); err != nil {
			return err
		}
		defer ns.Close() // after the watcher and the applier, which use it
	}
	if p.cmd != cmdPlan {
		// One owner of the table and the priority in the namespace.
		lk, err := Claim(ns, p.Name, p.Table, p.Priority)
		if err != nil {
			return err
		}
		defer lk.Release()
		if w := lk.Warning(); w != "" {
			log.Warn(w)
		}
	}
	opts := netwatch.Options{RouteTables: p.Cache, Logger: wlog, NetNS: ns}
	if p.Table != 0 {
		opts.RouteTables = append([]netwatch.Table{netwatch.Table(p.Table)}, p.Cache...)
	}
	r := p.Reconciler
	if r == nil {
		r = &reconcile.Reconciler{}
	}
	w := netwatch.New(opts)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { cancel(); <-done }()
	if p.cmd == cmdPlan {
		return p.plan(ctx, w, policy, r.Describe, stdout)
	}

	a, err := netwatch.DialApplier(ns)
	if err != nil {
		return err
	}
	defer a.Close()
	r.Watcher, r.Applier, r.Policy, r.Resync = w, a, policy, p.Resync
	if r.Logger == nil {
		r.Logger = log
	}
	if p.cmd == cmdRun {
		log.Info(p.Name+": started", "table", p.Table, "priority", p.Priority, "protocol", p.Protocol)
		return r.Run(ctx)
	}
	if p.cmd == cmdCleanup {
		own := reconcile.Own(p.Table, p.Priority)
		r.Policy = func(netwatch.View) (reconcile.Desired, bool) { return reconcile.Desired{Own: own}, true }
	}
	return once(ctx, r, stdout)
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
		fmt.Fprintln(stdout, line)
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
	sctx, cancel := context.WithTimeout(ctx, stallTimeout)
	defer cancel()
	if err := w.WaitSynced(sctx); err != nil {
		return fmt.Errorf("the rtnetlink cache did not sync: %w", err)
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
			lines = append(lines, fmt.Sprintf("%-13s %s", kind, describe(op, v.Link)))
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
