//go:build linux

package netwatch

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Reconciler keeps the kernel at a policy's desired state: after every
// change of the watcher's cache it reads a View, asks the policy for the
// desired state, plans the difference and applies it, logging one line per
// change. A failed pass is retried with backoff; nothing is planned from a
// view that is not synced.
//
// It is the loop a small program around a policy needs:
//
//	r := &netwatch.Reconciler{Watcher: w, Applier: a, Policy: policy, Resync: time.Minute, Logger: log}
//	return r.Run(ctx) // with w.Run(ctx) running
type Reconciler struct {
	// Watcher is the cache the policy reads; its Run must be running
	// for as long as the Reconciler's.
	Watcher *Watcher
	// Applier makes the changes. The Reconciler uses it from Run's
	// goroutine alone.
	Applier *Applier
	// Policy returns the desired state for a view. When ok is false it
	// cannot tell yet (it waits for something outside the view), and
	// nothing is changed. It is called inside Read: it must not block.
	Policy func(View) (d Desired, ok bool)
	// Resync, when positive, asks the watcher for a full re-dump this
	// often, as a safety net for what events miss.
	Resync time.Duration
	// Logger receives an Info line per applied operation, its
	// description, and a Warn line per failed pass; nil discards.
	Logger *slog.Logger
	// Describe renders an applied operation as its log line; nil means
	// Op.Describe.
	Describe func(op Op, links func(index uint32) (Link, bool)) string
	// OnPass, when set, is called after each pass that had something to
	// do, with the operations that succeeded and the pass's error (for
	// metrics, and for tests to wait on). It runs on Run's goroutine.
	OnPass func(applied []Op, err error)
	// Backoff paces the retries of a failed pass; default exponential
	// from 100 ms to 30 s, never giving up.
	Backoff func() backoff.BackOff
}

// settleTimeout bounds the wait for the cache to hold what a pass applied.
const settleTimeout = time.Second

// errIncomplete is Run's error when a required field is missing.
var errIncomplete = errors.New("netwatch: reconciler needs a Watcher, an Applier and a Policy")

// Run runs a pass at once, then after every change of the cache, after a
// failed pass (with backoff) and at every Resync, until ctx ends; then it
// returns nil. It returns an error only when the Reconciler is incomplete.
func (r *Reconciler) Run(ctx context.Context) error {
	if r.Watcher == nil || r.Applier == nil || r.Policy == nil {
		return errIncomplete
	}
	log := r.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var bo backoff.BackOff
	if r.Backoff != nil {
		bo = r.Backoff()
	} else {
		bo = backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(100*time.Millisecond),
			backoff.WithMaxInterval(30*time.Second),
			backoff.WithMaxElapsedTime(0))
	}
	retry := time.NewTimer(0)
	<-retry.C
	defer retry.Stop()
	var tick <-chan time.Time
	if r.Resync > 0 {
		t := time.NewTicker(r.Resync)
		defer t.Stop()
		tick = t.C
	}
	for {
		applied, err := r.pass(log)
		if len(applied) > 0 {
			r.settle(ctx)
		}
		switch {
		case err != nil:
			d := bo.NextBackOff()
			log.Warn("netwatch: reconcile pass failed; retrying", "err", err, "in", d)
			retry.Reset(d)
		case len(applied) > 0:
			continue // look again now, at a view with the changes
		default:
			bo.Reset()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			r.Watcher.Resync() // its result arrives on Notify; this pass has nothing new
		case <-r.Watcher.Notify():
		case <-retry.C:
		}
	}
}

// plan reads the cache and returns the operations the policy asks for,
// and each one's log line when describe is set.
func (r *Reconciler) plan(describe func(Op, func(uint32) (Link, bool)) string) (ops []Op, lines []string, err error) {
	r.Watcher.Read(func(v View) {
		if !v.Synced() {
			return // the watcher notifies when it is
		}
		d, ok := r.Policy(v)
		if !ok {
			return
		}
		if ops, err = Plan(v, d); err != nil || len(ops) == 0 || describe == nil {
			return
		}
		lines = make([]string, len(ops))
		for i, op := range ops {
			lines[i] = describe(op, v.Link)
		}
	})
	return ops, lines, err
}

// pass plans from the cache and applies the plan, logging each change. It
// returns the operations that succeeded.
func (r *Reconciler) pass(log *slog.Logger) ([]Op, error) {
	describe := r.Describe
	if describe == nil {
		describe = Op.Describe
	}
	ops, lines, err := r.plan(describe)
	if err != nil || len(ops) == 0 {
		if err != nil && r.OnPass != nil {
			r.OnPass(nil, err)
		}
		return nil, err
	}
	res, err := r.Applier.Apply(ops)
	var applied []Op
	for i, res := range res {
		if res.Err == nil {
			log.Info(lines[i])
			applied = append(applied, res.Op)
		}
	}
	if r.OnPass != nil {
		r.OnPass(applied, err)
	}
	return applied, err
}

// settle waits, at most settleTimeout, until the cache holds the changes a
// pass applied (Barrier): a pass planned from a view that lags behind them
// would make, and log, the same changes again.
func (r *Reconciler) settle(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	r.Watcher.Barrier(ctx) // on failure the next pass sees what it sees
}
