//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
)

// desireFunc derives the desired state from a synced view in a mode;
// ok=false means plan nothing (mtupolicy.Desired's contract).
type desireFunc func(v netwatch.View, mode mtupolicy.Mode) (netwatch.Desired, bool)

// policyDesire is what run, once and plan want: the policy.
func policyDesire(cfg mtupolicy.Config) desireFunc {
	return func(v netwatch.View, mode mtupolicy.Mode) (netwatch.Desired, bool) {
		return mtupolicy.Desired(v, cfg, mode)
	}
}

// cleanupDesire is what cleanup wants, whatever the mode: the owned scope
// and nothing in it, so that every owned route and rule goes and nothing
// else is touched (no repairs either).
func cleanupDesire(cfg mtupolicy.Config) desireFunc {
	return func(v netwatch.View, _ mtupolicy.Mode) (netwatch.Desired, bool) {
		d, ok := mtupolicy.Desired(v, cfg, mtupolicy.ModeOff)
		return netwatch.Desired{Own: d.Own}, ok
	}
}

// applier is the part of *netwatch.Applier the loop uses.
type applier interface {
	Apply(ops []netwatch.Op) ([]netwatch.Result, error)
}

// reconciler runs passes: view → desired → plan → apply. Its methods are
// for one goroutine; converged may be read from any.
type reconciler struct {
	w      *netwatch.Watcher
	ap     applier
	desire desireFunc
	log    *slog.Logger
	// emit receives each change's line: the log in run, stdout in once.
	emit func(line string)
	met  *metrics
	damp *damper

	// quiet and window coalesce bursts of triggers: a pass runs quiet
	// after the last trigger, and at most window after the first.
	quiet, window time.Duration
	// resyncEvery is the period of the safety resync.
	resyncEvery time.Duration
	failBo      backoff.BackOff

	mode      mtupolicy.Mode
	converged atomic.Bool

	// onPass, when set, is told of every pass run makes (for tests).
	onPass func(passResult)
}

// subscriptionBuffer is the room for cache events between passes.
const subscriptionBuffer = 4096

const (
	defaultQuiet  = 1 * time.Millisecond
	defaultWindow = 10 * time.Millisecond
	defaultResync = 5 * time.Minute
)

func newReconciler(w *netwatch.Watcher, ap applier, desire desireFunc, log *slog.Logger, emit func(string), met *metrics) *reconciler {
	return &reconciler{
		w: w, ap: ap, desire: desire, log: log, emit: emit, met: met,
		damp:        newDamper(defaultDampConfig()),
		quiet:       defaultQuiet,
		window:      defaultWindow,
		resyncEvery: defaultResync,
		failBo: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(100*time.Millisecond),
			backoff.WithMaxInterval(30*time.Second),
			backoff.WithMaxElapsedTime(0)),
	}
}

// setMode records a new encryption mode and reports whether it changed.
func (r *reconciler) setMode(m mtupolicy.Mode) bool {
	if m == r.mode {
		return false
	}
	r.mode = m
	r.met.setMode(m)
	if m == mtupolicy.ModeOff {
		r.emit("node encryption: no")
	}
	return true
}

// passResult says what a pass did.
type passResult struct {
	planned bool // the view was synced and the mode known: a plan was made
	ops     int  // operations planned
	applied int  // operations applied
	damped  int  // operations withheld by fight damping
	err     error
	// wake is when the next pass should run at the latest; zero when
	// only a trigger needs one.
	wake time.Time
}

// errNoPlan is the error of a pass that could not plan.
var errNoPlan = errors.New("nothing planned")

// plan reads the cache and returns the operations a pass would make, with
// their log lines. planned is false when the view is not synced or the
// mode is unknown.
func (r *reconciler) plan() (ops []netwatch.Op, lines []string, planned bool, err error) {
	r.w.Read(func(v netwatch.View) {
		if !v.Synced() {
			return
		}
		d, ok := r.desire(v, r.mode)
		if !ok {
			return
		}
		planned = true
		if ops, err = netwatch.Plan(v, d); err != nil {
			return
		}
		lines = make([]string, len(ops))
		for i, op := range ops {
			lines[i] = op.Describe(v.Link)
		}
	})
	return ops, lines, planned, err
}

// pass makes one pass: plan, filter through fight damping, apply, log
// each change.
func (r *reconciler) pass() passResult {
	now := time.Now()
	ops, lines, planned, err := r.plan()
	res := passResult{planned: planned, ops: len(ops), err: err}
	if !planned {
		r.met.pass("waiting")
		r.converged.Store(false)
		return res
	}
	if err != nil {
		r.log.Error("cannot plan", "err", err)
		return r.failed(res, now)
	}
	vd := r.damp.filter(ops, now)
	for _, f := range vd.fights {
		r.log.Warn(fmt.Sprintf("fight: another program keeps undoing %q: undone %d times in %s; repairing it with back-off, next in %s",
			f.op.Describe(nil), f.undos, roundDuration(f.since), roundDuration(f.next)),
			"object", objectName(f.op), "undone", f.undos)
	}
	for _, op := range vd.delayed {
		r.met.fightDamped(op)
	}
	res.damped, res.wake = vd.damped, vd.wake
	todo := make([]netwatch.Op, len(vd.todo))
	for i, j := range vd.todo {
		todo[i] = ops[j]
	}
	results, _ := r.ap.Apply(todo)
	for i, x := range results {
		line := lines[vd.todo[i]]
		switch {
		case x.Err == nil:
			res.applied++
			r.damp.applied(x.Op, now)
			r.met.change(x.Op)
			r.emit(line)
		case errors.Is(x.Err, netwatch.ErrSkipped):
		default:
			res.err = x.Err
			r.met.failedOp(x.Op)
			r.log.Error("cannot apply "+line, "err", x.Err)
		}
	}
	if res.err != nil {
		return r.failed(res, now)
	}
	r.failBo.Reset()
	switch {
	case res.damped > 0:
		r.met.pass("damped")
		r.converged.Store(false)
	case res.applied > 0:
		r.met.pass("changed")
		r.succeeded(now)
	default:
		r.met.pass("unchanged")
		r.succeeded(now)
	}
	return res
}

func (r *reconciler) succeeded(now time.Time) {
	r.converged.Store(true)
	r.met.lastPass(now)
}

func (r *reconciler) failed(res passResult, now time.Time) passResult {
	r.met.pass("failed")
	r.converged.Store(false)
	if w := now.Add(r.failBo.NextBackOff()); res.wake.IsZero() || w.Before(res.wake) {
		res.wake = w
	}
	return res
}

// run makes passes until ctx ends: after cache changes, mode changes and
// wake-ups that passes ask for, coalescing bursts; and it asks the
// watcher for a full resync every resyncEvery.
func (r *reconciler) run(ctx context.Context, modes <-chan mtupolicy.Mode) {
	resync := time.NewTicker(r.resyncEvery)
	defer resync.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// The subscription tells the damper when the cache has caught up with
	// our own changes; Notify triggers the passes.
	sub := r.w.Subscribe(subscriptionBuffer, nil)
	defer func() { sub.Close() }()
	var burst, burstDue, wake time.Time
	trigger := func() {
		now := time.Now()
		if burst.IsZero() {
			burst = now
		}
		burstDue = now.Add(r.quiet)
		if lim := burst.Add(r.window); burstDue.After(lim) {
			burstDue = lim
		}
	}
	for {
		next := burstDue
		if next.IsZero() || !wake.IsZero() && wake.Before(next) {
			next = wake
		}
		if next.IsZero() {
			timer.Stop()
		} else {
			timer.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
			return
		case <-r.w.Notify():
			trigger()
		case ev, ok := <-sub.Events():
			if ok {
				r.damp.observe(ev)
				continue
			}
			// Lagged: events were not delivered (a resync of a huge
			// table). The cache itself is complete; only the damper's
			// confirmations are lost.
			r.damp.confirmAll()
			sub = r.w.Subscribe(subscriptionBuffer, nil)
		case m := <-modes:
			if r.setMode(m) {
				trigger()
			}
		case <-resync.C:
			r.w.Resync()
		case <-timer.C:
			if next.IsZero() || time.Now().Before(next) {
				continue
			}
			burst, burstDue = time.Time{}, time.Time{}
			res := r.pass()
			wake = res.wake
			if r.onPass != nil {
				r.onPass(res)
			}
		}
	}
}

// roundDuration rounds d for a log line: to the millisecond below a
// second, else to the second.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// objectName names the object an operation is about, for structured logs.
func objectName(op netwatch.Op) string {
	if op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete {
		head, _, _ := strings.Cut(op.Describe(nil), ":") // "rule 900 (inet6)"
		return head
	}
	r := op.Route
	return r.Family.String() + " route " + r.Dst.String() + " table " + r.Table.String()
}

// errNotConverged is the error of once when the cache still asks for
// changes after a pass.
var errNotConverged = errors.New("not converged")

// waitReady waits until the watcher is synced and the mode known.
func (r *reconciler) waitReady(ctx context.Context, modes <-chan mtupolicy.Mode, needMode bool, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !r.w.Synced() || needMode && r.mode == mtupolicy.ModeUnknown {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.w.Notify():
		case m := <-modes:
			r.setMode(m)
		case <-deadline.C:
			if !r.w.Synced() {
				return fmt.Errorf("the rtnetlink cache did not sync within %s", timeout)
			}
			return fmt.Errorf("no encryption mode within %s (the CiliumNode was not read; see the log)", timeout)
		}
	}
	return nil
}

// once makes one pass and waits until the cache shows the result.
func (r *reconciler) once(ctx context.Context, timeout time.Duration) error {
	res := r.pass()
	switch {
	case res.err != nil:
		return res.err
	case !res.planned:
		return errNoPlan
	case res.damped > 0:
		return fmt.Errorf("%w: %d operations withheld", errNotConverged, res.damped)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ops, lines, planned, err := r.plan()
		switch {
		case err != nil:
			return err
		case !planned:
			return errNoPlan
		case len(ops) == 0:
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.w.Notify():
		case <-deadline.C:
			return fmt.Errorf("%w after %s: %d operations still planned, the first: %s", errNotConverged, timeout, len(ops), lines[0])
		}
	}
}
