package main

import (
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/netwatch"
)

// objKey names one kernel object for fight damping: a route by its key, a
// rule by its value (rules have no key).
type objKey struct {
	isRule bool
	route  netwatch.RouteKey
	rule   netwatch.Rule
}

func keyOf(op netwatch.Op) objKey {
	if op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete {
		return objKey{isRule: true, rule: op.Rule}
	}
	return objKey{route: op.Route.Key()}
}

// sameOp reports whether a and b make the same change to the same object.
func sameOp(a, b netwatch.Op) bool {
	if a.Kind != b.Kind || a.Repair != b.Repair {
		return false
	}
	if a.Kind == netwatch.RuleAdd || a.Kind == netwatch.RuleDelete {
		return a.Rule == b.Rule
	}
	return a.Route.Equal(b.Route)
}

// dampConfig tunes fight damping.
type dampConfig struct {
	// Settle is how long after an operation the cache may still show the
	// object as it was, until the watcher delivers the kernel's event for
	// our own change (observe). Meanwhile the same operation is not sent
	// again; after Settle without that event, it counts as undone.
	Settle time.Duration
	// Free is how many undos of one object in an episode are repaired at
	// once; from the next one on, repairs are delayed by the back-off.
	Free int
	// Reset ends an episode: an object not undone for this long starts
	// afresh (no delay, a new warning when it is fought over again).
	Reset time.Duration
	// BackOff returns the per-object back-off of repairs once damped.
	BackOff func() backoff.BackOff
}

func defaultDampConfig() dampConfig {
	return dampConfig{
		Settle: time.Second,
		Free:   5,
		Reset:  10 * time.Minute,
		BackOff: func() backoff.BackOff {
			return backoff.NewExponentialBackOff(
				backoff.WithInitialInterval(500*time.Millisecond),
				backoff.WithMultiplier(2),
				backoff.WithMaxInterval(5*time.Minute),
				backoff.WithMaxElapsedTime(0))
		},
	}
}

// fight is reported once per episode, when an object's repairs start being
// delayed.
type fight struct {
	op    netwatch.Op
	undos int           // how often it was undone in this episode
	since time.Duration // from the first undo of the episode to now
	next  time.Duration // the delay of this repair
}

// damper remembers the last operation applied to each object. When a
// pass needs that same operation again, someone undid it: an undo. The
// first Free undos of an episode are repaired at once; later ones wait
// for the object's exponential back-off, so a fight with another program
// never becomes a hot loop. It is not safe for concurrent use.
type damper struct {
	cfg  dampConfig
	objs map[objKey]*objState
}

type objState struct {
	last      netwatch.Op // the last operation applied to the object
	appliedAt time.Time
	confirmed bool // the cache has shown the object as last made it

	undos               int
	firstUndo, lastUndo time.Time
	pending             bool      // an undo was counted and not yet repaired
	notBefore           time.Time // the pending repair waits until then
	warned              bool
	bo                  backoff.BackOff
}

func newDamper(cfg dampConfig) *damper {
	return &damper{cfg: cfg, objs: make(map[objKey]*objState)}
}

// verdict is what filter decided for the operations of a pass.
type verdict struct {
	todo    []int         // indexes of the operations to apply now
	settled int           // operations just applied and not yet visible in the cache
	damped  int           // operations delayed by fight damping
	wake    time.Time     // when to look again; zero when nothing waits
	fights  []fight       // new fights, to warn about once
	delayed []netwatch.Op // repairs delayed by this call (counted once each)
}

// filter decides, for the planned operations of a pass at time now, which
// to apply now. Operations withheld are either the cache lagging behind a
// change just made (settled), or repairs of a fought-over object waiting
// for its back-off (damped); wake says when to look again.
func (d *damper) filter(ops []netwatch.Op, now time.Time) verdict {
	var v verdict
	wake := func(t time.Time) {
		if v.wake.IsZero() || t.Before(v.wake) {
			v.wake = t
		}
	}
	needed := make(map[objKey]bool, len(ops))
	for i, op := range ops {
		k := keyOf(op)
		s := d.objs[k]
		if s == nil || !sameOp(s.last, op) {
			v.todo = append(v.todo, i)
			continue
		}
		needed[k] = true
		if !s.confirmed && now.Sub(s.appliedAt) < d.cfg.Settle {
			v.settled++
			wake(s.appliedAt.Add(d.cfg.Settle))
			continue
		}
		if !s.pending {
			d.undo(s, op, now, &v)
		}
		if now.Before(s.notBefore) {
			v.damped++
			wake(s.notBefore)
			continue
		}
		v.todo = append(v.todo, i)
	}
	for k, s := range d.objs {
		if needed[k] {
			continue
		}
		// The cache shows the object as last made (or the policy wants
		// something else now): nothing is pending for it.
		s.confirmed, s.pending, s.notBefore = true, false, time.Time{}
		if now.Sub(s.appliedAt) > d.cfg.Reset && now.Sub(s.lastUndo) > d.cfg.Reset {
			delete(d.objs, k)
		}
	}
	return v
}

// undo counts an undo of s and decides whether its repair waits.
func (d *damper) undo(s *objState, op netwatch.Op, now time.Time, v *verdict) {
	s.pending = true
	if s.undos > 0 && now.Sub(s.lastUndo) > d.cfg.Reset {
		s.undos, s.warned = 0, false
		if s.bo != nil {
			s.bo.Reset()
		}
	}
	if s.undos == 0 {
		s.firstUndo = now
	}
	s.undos++
	s.lastUndo = now
	s.notBefore = time.Time{}
	if s.undos <= d.cfg.Free {
		return
	}
	if s.bo == nil {
		s.bo = d.cfg.BackOff()
	}
	delay := s.bo.NextBackOff()
	if delay == backoff.Stop {
		delay = d.cfg.Reset
	}
	s.notBefore = now.Add(delay)
	v.delayed = append(v.delayed, op)
	if !s.warned {
		s.warned = true
		v.fights = append(v.fights, fight{op: op, undos: s.undos, since: now.Sub(s.firstUndo), next: delay})
	}
}

// observe confirms the last operation applied to the event's object when
// the event shows the object as that operation made it: the cache has
// caught up with our own change.
func (d *damper) observe(ev netwatch.Event) {
	var k objKey
	switch ev.Kind {
	case netwatch.KindRule:
		k = objKey{isRule: true, rule: ev.Rule}
	case netwatch.KindRoute:
		k = objKey{route: ev.Route.Key()}
	default:
		return
	}
	s := d.objs[k]
	if s == nil || s.confirmed {
		return
	}
	var ok bool
	switch s.last.Kind {
	case netwatch.RuleAdd:
		ok = ev.Op == netwatch.EventNew
	case netwatch.RuleDelete:
		ok = ev.Op == netwatch.EventDel
	case netwatch.RouteReplace:
		ok = ev.Op == netwatch.EventNew && sameRoute(ev.Route, s.last.Route)
	case netwatch.RouteDelete:
		ok = ev.Op == netwatch.EventDel && sameRoute(ev.Route, s.last.Route)
	}
	if ok {
		s.confirmed = true
	}
}

// confirmAll confirms every operation: after events were lost, the next
// passes judge from the cache alone.
func (d *damper) confirmAll() {
	for _, s := range d.objs {
		s.confirmed = true
	}
}

// sameRoute compares routes as Plan does: without the flags only the
// kernel sets.
func sameRoute(a, b netwatch.Route) bool {
	a.Flags &^= netwatch.KernelRouteFlags
	b.Flags &^= netwatch.KernelRouteFlags
	if a.NextHops != nil || b.NextHops != nil {
		a.NextHops, b.NextHops = cleanHops(a.NextHops), cleanHops(b.NextHops)
	}
	return a.Equal(b)
}

func cleanHops(nhs []netwatch.NextHop) []netwatch.NextHop {
	out := make([]netwatch.NextHop, len(nhs))
	for i, nh := range nhs {
		nh.Flags &^= netwatch.KernelRouteFlags
		out[i] = nh
	}
	return out
}

// applied records that op was applied at now.
func (d *damper) applied(op netwatch.Op, now time.Time) {
	k := keyOf(op)
	s := d.objs[k]
	if s == nil {
		s = &objState{}
		d.objs[k] = s
	}
	s.last, s.appliedAt = op, now
	s.confirmed, s.pending, s.notBefore = false, false, time.Time{}
}
