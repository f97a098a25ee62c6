//go:build linux

package reconcile

import (
	"hash/maphash"
	"strings"
	"syscall"

	"github.com/marksplit/marksplit/netwatch"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Reconciler keeps the kernel at a policy's desired state. It is the one
// loop every netwatch program runs: after every change of the watcher's
// cache and every Trigger it reads a View, asks the policy for the desired
// state, plans the difference and applies it, logging one line per change
// the kernel did not already have. A burst of changes is coalesced; a failed
// pass is retried with backoff, unless no retry can change its outcome (a
// PlanError, or an operation the kernel refuses with EINVAL): that is
// logged once and waits for the next change; nothing is planned from a view
// that is not synced; a periodic resync catches what events miss.
//
// # Fights
//
// The Reconciler knows who undid what it made: the journal of the cache
// (View.Changes) names the origin of every change. When another program
// deletes or changes an object the Reconciler made (a rule at an owned
// priority, a route in an owned table, a repaired route), that is an undo;
// the kernel's own changes (the IPv4 routes it flushes when a link goes
// down) and differences a resync found never are. Three undos in a row, each
// within a minute of the last, make a fight: one warning per episode names
// the object and the program (further objects the same program undoes
// meanwhile join the episode without a line of their own),
//
//	fight: rule 900: not fwmark 0xe00/0xf00 lookup 900 undone 3 times in 212ms by ip[31968]; repairing at most every 100ms
//
// OnFight is told, and when the object has been left alone for twice the
// longest interval between its undos (at least a second) the fight is over,
// with one more line at Info level. Whatever the origin, every object is
// changed at most RepairBurst times at once and then once per
// RepairInterval: a fight never becomes a hot loop, and a repair waits at
// most RepairInterval.
//
// A repair (Desired.Repairs: a main-table route the policy does not own) is
// never fought over: another program that undoes it three times in a row,
// each within a minute of the last, re-asserts its own value (a route
// reconciler, such as Cilium's, which re-asserts its routes' MTUs about
// every second). The Reconciler steps back, once: one warning names the
// route, the program and the count,
//
//	fight: dhcp route 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 undone 3 times in 1s by ip[31968]: it re-asserts its value; stepping back: this route is not repaired again
//
// OnStepBack is told, and that route is left out of every later pass's
// repairs for as long as the Reconciler runs.
//
// It is the loop a small program around a policy needs:
//
//	go w.Run(ctx)
//	r := &reconcile.Reconciler{Watcher: w, Applier: a, Policy: policy, Resync: 5 * time.Minute, Logger: log}
//	return r.Run(ctx)
//
// Run or Once is called from one goroutine at a time, and its fields are
// not changed while it runs. Trigger and Converged are safe from any
// goroutine. The hooks are called from Run's goroutine, one at a time:
// Policy inside Watcher.Read, holding the cache's read lock, the others
// outside it.
type Reconciler struct {
	// Watcher is the cache the policy reads. The caller runs its Run for
	// as long as the Reconciler's; the first pass waits for its sync.
	Watcher *netwatch.Watcher
	// Applier makes the changes. The Reconciler uses it from Run's
	// goroutine alone.
	Applier *netwatch.Applier
	// Policy returns the desired state for a synced view. ok false means
	// it cannot tell yet (it waits for something outside the view, such as
	// a mode read from elsewhere: call Trigger when that arrives) and
	// nothing is changed; ok true with an empty Desired means remove
	// everything owned. It runs while the cache is read-locked: it must not
	// block or call the Watcher's methods, and must use only the view.
	Policy func(netwatch.View) (d Desired, ok bool)
	// Resync, when positive, asks the watcher for a full re-dump this
	// often, as a safety net for what events miss.
	Resync time.Duration
	// Logger receives an Info line per change (unless OnChange is set), a
	// Warn line per fight and per new kind of failure; nil discards.
	Logger *slog.Logger
	// Describe renders an operation as its log line; nil means
	// Op.Describe.
	Describe func(op netwatch.Op, links func(index uint32) (netwatch.Link, bool)) string
	// OnChange, when set, receives each change the kernel did not already
	// have, with its line, instead of the Logger.
	OnChange func(op netwatch.Op, line string)
	// OnPass, when set, is called after each pass with what it did (for
	// metrics, and for tests to wait on). A pass of more than a thousand
	// operations plans and applies them a chunk at a time, each chunk from
	// a view that holds the ones before, so that its memory does not grow
	// with its size: OnPass is told of each chunk as of a pass.
	OnPass func(Pass)
	// OnFight, when set, is called when a fight starts and when it ends.
	OnFight func(Fight)
	// OnStepBack, when set, is called once per repaired route another
	// program keeps undoing, when the Reconciler stops repairing it.
	OnStepBack func(Fight)

	// Coalesce bounds the passes a burst of changes costs: the first
	// change after a quiet spell is acted on at once; within Coalesce of
	// the last pass, the next waits for the changes to pause for a tenth
	// of Coalesce, and at most until Coalesce has passed. Default 10 ms;
	// negative: no waiting.
	Coalesce time.Duration
	// RepairBurst and RepairInterval limit how often one object is
	// changed: RepairBurst times at once, then once per RepairInterval.
	// Defaults 20 and 100 ms.
	RepairBurst    int
	RepairInterval time.Duration
	// RetryMin and RetryMax pace the retries of a failed pass, doubling
	// from RetryMin to RetryMax. Defaults 100 ms and 1 s. A change of the
	// cache or a Trigger runs a pass at once whatever the backoff.
	RetryMin, RetryMax time.Duration

	trig      trigger
	converged atomic.Bool
}

// Pass is what one pass did.
type Pass struct {
	// Planned is false when nothing could be planned: the view was not
	// synced, or the policy could not tell.
	Planned bool
	// Applied are the operations the kernel carried out; Already those it
	// already had (an add of what existed, a delete of what was gone),
	// which are not logged; Failed the one it refused (Err says why).
	Applied, Already, Failed []netwatch.Op
	// Deferred counts the operations left for a later pass by the
	// per-object rate limit.
	Deferred int
	// Err is why the pass failed: a refused operation, or a Desired that
	// Plan rejects (see PlanError).
	Err error
	// Took is how long the pass took: policy, plan and the kernel's
	// answers.
	Took time.Duration
}

// Fight is an episode of another program undoing what the Reconciler made,
// over one object or many at once (a program flushing a table): one
// Fight when it starts, one when it is over.
type Fight struct {
	// Object names the episode's first object in a few words: "rule
	// 900", "rule 900 inet6", "table 900 10.0.0.0/16".
	Object string
	// Line is that object as the log line names it.
	Line string
	// By is the program.
	By netwatch.Origin
	// Undos counts the undos so far, in Since: at the start, of the first
	// object; at the end, of every object of the episode.
	Undos int
	Since time.Duration
	// Objects counts the objects fought over: 1 at the start, all of the
	// episode's at the end.
	Objects int
	// Over is set when the episode has ended.
	Over bool
}

// Defaults of a Reconciler.
const (
	defaultCoalesce       = 10 * time.Millisecond
	defaultRepairBurst    = 20
	defaultRepairInterval = 100 * time.Millisecond
	defaultRetryMin       = 100 * time.Millisecond
	defaultRetryMax       = time.Second
)

const (
	// settleTimeout bounds the wait for the cache to hold what a pass
	// applied.
	settleTimeout = time.Second
	// fightUndos undos in a row, each within fightGap of the last, make a
	// fight.
	fightUndos = 3
	fightGap   = time.Minute
	// forgetAfter drops what the Reconciler knows of an object it has not
	// touched for this long.
	forgetAfter = 10 * time.Minute
)

// errIncomplete is Run's error when a required field is missing.
var errIncomplete = errors.New("reconcile: reconciler needs a Watcher, an Applier and a Policy")

// Trigger asks for a pass soon, as a change of the cache does: for what
// the policy reads from outside the view. It does not block and may be
// called from any goroutine, before Run too.
func (r *Reconciler) Trigger() { r.trig.fire() }

// Converged reports whether the last pass planned and left nothing to do.
func (r *Reconciler) Converged() bool { return r.converged.Load() }

// Run runs passes until ctx ends, then returns nil: the first once the
// cache is synced, then after every change of the cache, every Trigger,
// every failed pass that a retry may change (with backoff) and every Resync. It returns an error
// only when the Reconciler is incomplete.
func (r *Reconciler) Run(ctx context.Context) error {
	l, err := r.newLoop()
	if err != nil {
		return err
	}
	return l.run(ctx)
}

// ErrNotConverged is Once's error when passes keep finding work.
var ErrNotConverged = errors.New("reconcile: not converged")

// Once waits until the cache is synced and the policy can tell (or ctx
// ends), then runs passes until one finds nothing to do: it returns nil
// then, the first failure of a pass, or ErrNotConverged after a few passes
// that each left work. When ctx ends during a pass, the pass stops after
// its chunk and Once returns ctx's cause: a pass over a full table takes
// seconds, so give ctx room for it (or cancel it on a lack of progress,
// as `marksplit once` does). It is `marksplit once`: the Watcher must be
// running.
func (r *Reconciler) Once(ctx context.Context) error {
	l, err := r.newLoop()
	if err != nil {
		return err
	}
	const passes = 4
	for i := 0; ; {
		p, first, planned, ch := l.pass(ctx, nil)
		switch {
		case p.Err != nil:
			return p.Err
		case ctx.Err() != nil && planned > 0:
			// A pass cut short: what it applied stands, but a view that
			// lags behind it would only plan it again.
			return fmt.Errorf("reconcile: stopped before converging (%d operations planned, from %q): %w", planned, first, context.Cause(ctx))
		case !p.Planned:
			select {
			case <-ctx.Done():
				return fmt.Errorf("reconcile: nothing planned: %w", context.Cause(ctx))
			case <-ch:
			case <-r.trig.c():
			}
			continue
		case planned == 0 && p.Deferred == 0:
			return nil
		}
		if i++; i == passes {
			return fmt.Errorf("%w after %d passes: %s", ErrNotConverged, passes, first)
		}
		if p.Deferred > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(l.interval):
			}
		}
	}
}

// trigger is a wake-up that any goroutine may fire.
type trigger struct {
	once sync.Once
	ch   chan struct{}
}

func (t *trigger) c() chan struct{} {
	t.once.Do(func() { t.ch = make(chan struct{}, 1) })
	return t.ch
}

func (t *trigger) fire() {
	select {
	case t.c() <- struct{}{}:
	default:
	}
}

// loop is a Reconciler's state while it runs.
type loop struct {
	r        *Reconciler
	log      *slog.Logger
	describe func(netwatch.Op, func(uint32) (netwatch.Link, bool)) string
	window   time.Duration
	lastPass time.Time     // when the last pass began
	lastPlan time.Duration // how long its policy and plan took
	burst    int
	interval time.Duration
	bo       backoff.BackOff
	objs     map[objectID]*object   // full objects (objects_linux.go)
	plain    map[uint64]plainObject // plain objects, by objectHash
	seed     maphash.Seed
	mark     uint64              // journal position observed so far
	port     uint32              // the Applier's netlink port
	lastErr  string              // of the last failed pass, logged once
	fights   int                 // objects in a fight now
	episodes map[string]*episode // fights now, by program
	// steppedBack are the main-table routes no longer repaired: another
	// program re-asserts them (fight_linux.go).
	steppedBack map[netwatch.RouteKey]bool
	fightEnd    time.Time       // when the next fight ends if nothing happens
	gcAt        time.Time       // when to forget old objects next
	said        map[string]bool // the policy's notes logged, while they hold
}

func (r *Reconciler) newLoop() (*loop, error) {
	if r.Watcher == nil || r.Applier == nil || r.Policy == nil {
		return nil, errIncomplete
	}
	l := &loop{r: r, log: r.Logger, describe: r.Describe, objs: make(map[objectID]*object), plain: make(map[uint64]plainObject), seed: maphash.MakeSeed(), episodes: make(map[string]*episode), steppedBack: make(map[netwatch.RouteKey]bool), port: r.Applier.Port()}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.describe == nil {
		l.describe = netwatch.Op.Describe
	}
	l.window = or(r.Coalesce, defaultCoalesce)
	if r.Coalesce < 0 {
		l.window = 0
	}
	l.burst = r.RepairBurst
	if l.burst <= 0 {
		l.burst = defaultRepairBurst
	}
	l.interval = or(r.RepairInterval, defaultRepairInterval)
	l.bo = backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(or(r.RetryMin, defaultRetryMin)),
		backoff.WithMaxInterval(or(r.RetryMax, defaultRetryMax)),
		backoff.WithRandomizationFactor(0.2),
		backoff.WithMaxElapsedTime(0))
	return l, nil
}

// Passes whose policy and plan are expensive (a large table: a few hundred
// milliseconds for a change of a link with 100,000 routes through it) are
// spaced so that they take at most a fifth of a CPU, however often the
// kernel changes: the next pass begins planSpacing times their cost after
// the last began. Only a stream of changes waits so: a change after a pause
// longer than that is taken at once. maxSpacing bounds the wait of a repair
// in the middle of such a stream, whatever a pass cost.
const (
	planSpacing = 5
	maxSpacing  = 10 * time.Second
)

// spacing is how long after the last pass began the next may begin without
// waiting for changes to pause: the coalescing window, or longer after an
// expensive plan.
func (l *loop) spacing() time.Duration {
	return max(l.window, min(planSpacing*l.lastPlan, maxSpacing))
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (l *loop) run(ctx context.Context) error {
	var tick <-chan time.Time
	if l.r.Resync > 0 {
		t := time.NewTicker(l.r.Resync)
		defer t.Stop()
		tick = t.C
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		p, _, _, changed := l.pass(ctx, l.r.OnPass)
		wake := l.next(p) // when a pass is due without a trigger
		if l.r.OnPass != nil {
			l.r.OnPass(p)
		}
		if !l.wait(ctx, changed, wake, tick, timer) || !l.coalesce(ctx) {
			return nil
		}
	}
}

// wait waits until a pass is due: a change of the cache after the last
// pass's view, a Trigger, or wake. It asks for the periodic resyncs
// meanwhile, and reports false when ctx ends.
func (l *loop) wait(ctx context.Context, changed <-chan struct{}, wake time.Time, tick <-chan time.Time, timer *time.Timer) bool {
	if !wake.IsZero() {
		timer.Reset(max(time.Until(wake), 0))
		defer timer.Stop()
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			l.r.Watcher.Resync() // its result is a change of the cache
		case <-changed:
			return true
		case <-l.r.trig.c():
			return true
		case <-timer.C:
			if !wake.IsZero() && !time.Now().Before(wake) {
				return true
			}
		}
	}
}

// coalesce runs a pass at once when the last one began at least a window
// ago: the first change after a quiet spell is acted on without delay.
// Within a window of the last pass it waits for the changes to pause for a
// tenth of the window, at most until the window ends: a burst costs one pass
// per window. After an expensive plan it waits until the spacing that plan
// calls for has passed. It reports false when ctx ends.
func (l *loop) coalesce(ctx context.Context) bool {
	if sp := l.spacing(); sp > l.window {
		// An expensive plan: the next pass waits out its spacing,
		// whatever comes meanwhile, and then plans from all of it.
		t := time.NewTimer(time.Until(l.lastPass.Add(sp)))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	end := l.lastPass.Add(l.window)
	if !time.Now().Before(end) {
		return ctx.Err() == nil
	}
	quiet := l.window / 10
	t := time.NewTimer(min(quiet, time.Until(end)))
	defer t.Stop()
	for {
		var ch <-chan struct{}
		l.r.Watcher.Read(func(v netwatch.View) { ch = v.Changed() })
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-ch:
		case <-l.r.trig.c():
		}
		t.Reset(max(0, min(quiet, time.Until(end))))
	}
}

// next returns when the next pass is due without a trigger: a retry, a
// deferred operation, the end of a fight; zero for none.
func (l *loop) next(p Pass) time.Time {
	now := time.Now()
	var wake time.Time
	at := func(t time.Time) {
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	if p.Err != nil && !permanent(p.Err) {
		at(now.Add(l.bo.NextBackOff()))
	} else if p.Err == nil {
		l.bo.Reset()
	}
	if p.Deferred > 0 {
		at(now.Add(l.interval))
	}
	if !l.fightEnd.IsZero() {
		at(l.fightEnd)
	}
	return wake
}

// pass plans from the cache and applies what the rate limit allows,
// reporting each change, a chunk at a time (chunkOps): each chunk is
// planned from a view read after the one before was applied and has
// reached the cache. It returns the pass (of its last chunk: onChunk, when
// set, is told of the others), the line of the first operation planned and
// how many were, and the channel closed at the next change after the view
// it last planned operations from (its own changes close it: a pass that
// changed something is always followed by one that checks).
func (l *loop) pass(ctx context.Context, onChunk func(Pass)) (p Pass, first string, planned int, changed <-chan struct{}) {
	now := time.Now()
	l.lastPass = now
	start := now
	defer func() { p.Took = time.Since(start) }()
	p, pl := l.plan(now)
	l.lastPlan = time.Since(now)
	l.fightEnd = l.sweep(now)
	if p.Planned {
		l.note(pl.notes)
	}
	switch {
	case !p.Planned:
		l.r.converged.Store(false)
		return p, "", 0, pl.changed
	case p.Err != nil:
		l.failed(p.Err, "")
		return p, "", 0, pl.changed
	case len(pl.ops) == 0:
		l.recovered()
		l.r.converged.Store(true)
		return p, "", 0, pl.changed
	}
	l.r.converged.Store(false)
	first = pl.lines[0]
	for {
		planned += len(pl.ops)
		changed = pl.changed
		if !l.apply(ctx, &p, pl, now) || pl.planner.done() || ctx.Err() != nil {
			return p, first, planned, changed
		}
		// The next chunk, planned from a view that holds this one.
		if onChunk != nil {
			p.Took = time.Since(start)
			onChunk(p)
		}
		start, now = time.Now(), time.Now()
		p = Pass{Planned: true}
		l.nextChunk(pl, now)
		if len(pl.ops) == 0 {
			// Nothing was left; but only a pass that plans nothing from
			// the start converges. The channel of the last chunk's view,
			// which that chunk's own changes close, asks for one at once:
			// this view already holds them, and the next change after it
			// may never come.
			return p, first, planned, changed
		}
	}
}

// chunkOps is how many operations a pass plans, describes and applies at
// a time. A chunk's own events (about one an operation) then fit in the
// cache's journal (2048), so that the next chunk sees who changed what.
const chunkOps = 1000

// apply applies what the rate limit allows of a chunk, reports it into p,
// and waits for the cache to hold it. It reports whether the pass goes on:
// nothing failed and nothing was deferred.
func (l *loop) apply(ctx context.Context, p *Pass, pl *passPlan, now time.Time) bool {
	ops := pl.ops
	l.diverging(ops, pl.lines)
	n := l.admit(ops, pl.texts, now)
	p.Deferred = len(ops) - n
	res, err := l.r.Applier.Apply(ops[:n])
	refused := l.report(p, res, ops, pl.lines, now)
	if err != nil {
		p.Err = err
		l.failed(err, refused)
	} else {
		l.recovered()
	}
	if len(p.Applied) > 0 || len(p.Already) > 0 {
		// Plan the next chunk or pass from a view that shows these
		// changes, or it would make (and log) them again.
		sctx, cancel := context.WithTimeout(ctx, settleTimeout)
		l.r.Watcher.Barrier(sctx)
		cancel()
	}
	return err == nil && p.Deferred == 0
}

// passPlan is what a pass takes from the view it plans from: a chunk of
// operations, and the planner for the next.
type passPlan struct {
	planner *planner
	ops     []netwatch.Op
	lines   []string // each op's log line
	texts   []string // each op's object, for fights
	notes   []string // the policy's
	changed <-chan struct{}
}

// plan reads a view, asks the policy and plans the first chunk, setting
// p.Planned and p.Err.
func (l *loop) plan(now time.Time) (p Pass, pl *passPlan) {
	pl = &passPlan{}
	l.r.Watcher.Read(func(v netwatch.View) {
		pl.changed = v.Changed()
		l.observe(v, now)
		if !v.Synced() {
			return // the watcher's sync is a change
		}
		d, ok := l.r.Policy(v)
		if !ok {
			return
		}
		p.Planned, pl.notes = true, d.Notes
		if pl.planner, p.Err = newPlan(v, d); p.Err != nil {
			return
		}
		l.chunk(v, pl)
	})
	return p, pl
}

// nextChunk reads a view and plans the next chunk of pl's planner.
func (l *loop) nextChunk(pl *passPlan, now time.Time) {
	l.r.Watcher.Read(func(v netwatch.View) {
		pl.changed = v.Changed()
		l.observe(v, now)
		l.chunk(v, pl)
	})
}

// chunk plans the next chunk from v and describes its operations while it
// holds the view: their lines name links as that view has them.
func (l *loop) chunk(v netwatch.View, pl *passPlan) {
	pl.ops = l.withoutSteppedBack(pl.planner.next(v, chunkOps))
	pl.lines = make([]string, len(pl.ops))
	pl.texts = make([]string, len(pl.ops))
	for i, op := range pl.ops {
		pl.lines[i] = l.describe(op, v.Link)
		pl.texts[i] = objectText(op, v.Link)
	}
}

// report sorts the results of applying ops into p, records with made the
// objects the kernel now holds as the loop made them (undoing one is then
// an undo of the loop's), and passes each change the kernel did not
// already have to OnChange or the log. It returns the line of the
// operation the kernel refused, if one was.
func (l *loop) report(p *Pass, res []netwatch.Result, ops []netwatch.Op, lines []string, now time.Time) (refused string) {
	for i, x := range res {
		switch {
		case x.Err != nil:
			p.Failed = append(p.Failed, x.Op)
			refused = lines[i]
		case x.Already:
			p.Already = append(p.Already, x.Op)
			l.made(ops[i], now)
		default:
			p.Applied = append(p.Applied, x.Op)
			l.made(ops[i], now)
			if l.r.OnChange != nil {
				l.r.OnChange(x.Op, lines[i])
			} else {
				l.log.Info(lines[i])
			}
		}
	}
	return refused
}

// failed logs a pass's failure, once per kind of failure; change is the
// line of the operation the kernel refused, if one was.
func (l *loop) failed(err error, change string) {
	l.r.converged.Store(false)
	msg := err.Error()
	if msg == l.lastErr {
		return
	}
	l.lastErr = msg
	var ae *netwatch.ApplyError
	switch {
	case isPlanError(err):
		l.log.Error("reconcile: the policy's desired state cannot be planned; waiting for a change", "err", err)
	case permanent(err) && errors.As(err, &ae):
		l.log.Error("reconcile: the kernel refuses a change of the desired state as invalid; waiting for a change", "change", change, "op", ae.Op.Kind.String(), "err", ae.Err)
	case errors.As(err, &ae) && change != "":
		l.log.Warn("reconcile: pass failed; retrying", "change", change, "op", ae.Op.Kind.String(), "err", ae.Err)
	default:
		l.log.Warn("reconcile: pass failed; retrying", "err", err)
	}
}

// note logs each of the policy's notes once, for as long as it holds: a
// note that differs from one of the last pass only in its numbers (an MTU
// that changed while it is still too small) is the same note.
func (l *loop) note(notes []string) {
	if len(notes) == 0 && len(l.said) == 0 {
		return
	}
	now := make(map[string]bool, len(notes))
	for _, n := range notes {
		k := noteKey(n)
		if !l.said[k] {
			l.log.Warn(n)
		}
		now[k] = true
	}
	l.said = now
}

// noteKey is a note without its numbers.
func noteKey(n string) string {
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return '#'
		}
		return r
	}, n)
}

// recovered notes a pass that did not fail.
func (l *loop) recovered() {
	if l.lastErr != "" {
		l.log.Info("reconcile: passes succeed again", "after", l.lastErr)
		l.lastErr = ""
	}
}

func isPlanError(err error) bool {
	var pe *PlanError
	return errors.As(err, &pe)
}

// permanent reports whether a pass that failed with err would fail the same
// way until something changes: the desired state cannot be planned, or the
// kernel refused an operation as invalid (EINVAL), which no retry of the
// same request changes. Such a failure is reported once and waits for the
// next change of the cache or a Trigger, never for a retry timer.
func permanent(err error) bool {
	return isPlanError(err) || errors.Is(err, syscall.EINVAL)
}
