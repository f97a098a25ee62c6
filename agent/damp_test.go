package main

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/netwatch"
)

// testDampConfig is the default with a back-off without jitter.
func testDampConfig() dampConfig {
	cfg := defaultDampConfig()
	cfg.BackOff = func() backoff.BackOff {
		return backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(500*time.Millisecond),
			backoff.WithMultiplier(2),
			backoff.WithRandomizationFactor(0),
			backoff.WithMaxInterval(5*time.Minute),
			backoff.WithMaxElapsedTime(0))
	}
	return cfg
}

var (
	testRule = netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable,
		Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 109}
	addRule  = netwatch.Op{Kind: netwatch.RuleAdd, Rule: testRule}
	ruleNew  = netwatch.Event{Op: netwatch.EventNew, Kind: netwatch.KindRule, Rule: testRule}
	t0       = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	addRoute = netwatch.Op{Kind: netwatch.RouteReplace, Route: netwatch.Route{
		Family: netwatch.IPv4, Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/16"), Index: 2, MTU: 1355,
		Protocol: 109, Type: netwatch.RouteUnicast}}
)

// restore runs one pass that needs op at now and reports whether it was
// let through; if so it is applied and its event observed.
func restore(d *damper, op netwatch.Op, now time.Time) (verdict, bool) {
	v := d.filter([]netwatch.Op{op}, now)
	if len(v.todo) != 1 {
		return v, false
	}
	d.applied(op, now)
	switch op.Kind {
	case netwatch.RuleAdd:
		d.observe(netwatch.Event{Op: netwatch.EventNew, Kind: netwatch.KindRule, Rule: op.Rule})
	case netwatch.RouteReplace:
		d.observe(netwatch.Event{Op: netwatch.EventNew, Kind: netwatch.KindRoute, Route: op.Route})
	}
	return v, true
}

func TestDamperSettle(t *testing.T) {
	d := newDamper(testDampConfig())
	d.applied(addRule, t0)

	// The cache has not shown our own change yet: not sent again.
	v := d.filter([]netwatch.Op{addRule}, t0.Add(5*time.Millisecond))
	if len(v.todo) != 0 || v.settled != 1 || !v.wake.Equal(t0.Add(time.Second)) {
		t.Fatalf("before our event: %+v, want one settled op waking at +1s", v)
	}
	// An event for another object confirms nothing.
	d.observe(netwatch.Event{Op: netwatch.EventNew, Kind: netwatch.KindRoute, Route: addRoute.Route})
	if v := d.filter([]netwatch.Op{addRule}, t0.Add(6*time.Millisecond)); v.settled != 1 {
		t.Fatalf("after an unrelated event: %+v, want still settling", v)
	}
	// Our event arrives; someone deletes the rule right after: an undo,
	// repaired at once.
	d.observe(ruleNew)
	v = d.filter([]netwatch.Op{addRule}, t0.Add(7*time.Millisecond))
	if len(v.todo) != 1 || v.settled != 0 || v.damped != 0 {
		t.Fatalf("after our event: %+v, want the op let through", v)
	}
	if s := d.objs[keyOf(addRule)]; s.undos != 1 {
		t.Errorf("undos = %d, want 1", s.undos)
	}

	// Without our event, Settle bounds the wait: then it counts as undone.
	d2 := newDamper(testDampConfig())
	d2.applied(addRule, t0)
	if v := d2.filter([]netwatch.Op{addRule}, t0.Add(time.Second)); len(v.todo) != 1 {
		t.Fatalf("after Settle: %+v, want the op let through", v)
	}
}

func TestDamperFight(t *testing.T) {
	cfg := testDampConfig()
	d := newDamper(cfg)
	now := t0
	d.applied(addRule, now)
	d.observe(ruleNew)

	// The first Free undos are repaired at once, without a warning.
	for i := 1; i <= cfg.Free; i++ {
		now = now.Add(time.Second)
		v, ok := restore(d, addRule, now)
		if !ok || len(v.fights) != 0 || len(v.delayed) != 0 {
			t.Fatalf("undo %d: %+v, want an immediate repair", i, v)
		}
	}
	// The next one waits 500 ms and warns once, naming the count.
	now = now.Add(time.Second)
	v, ok := restore(d, addRule, now)
	if ok || v.damped != 1 || !v.wake.Equal(now.Add(500*time.Millisecond)) {
		t.Fatalf("undo %d: %+v, want damped until +500ms", cfg.Free+1, v)
	}
	if len(v.fights) != 1 || v.fights[0].undos != cfg.Free+1 || v.fights[0].since != time.Duration(cfg.Free)*time.Second ||
		v.fights[0].next != 500*time.Millisecond || len(v.delayed) != 1 {
		t.Fatalf("fights %+v delayed %d, want one fight: %d undos in %ds, next in 500ms", v.fights, len(v.delayed), cfg.Free+1, cfg.Free)
	}
	// Passes in between change nothing and count nothing again.
	if v, ok := restore(d, addRule, now.Add(100*time.Millisecond)); ok || len(v.fights) != 0 || len(v.delayed) != 0 {
		t.Fatalf("pass during the delay: %+v", v)
	}
	now = now.Add(500 * time.Millisecond)
	if v, ok := restore(d, addRule, now); !ok {
		t.Fatalf("at the wake time: %+v, want the repair", v)
	}
	// The next undo waits twice as long; no second warning.
	now = now.Add(time.Second)
	v, _ = restore(d, addRule, now)
	if v.damped != 1 || !v.wake.Equal(now.Add(time.Second)) || len(v.fights) != 0 || len(v.delayed) != 1 {
		t.Fatalf("undo %d: %+v, want damped 1s, no new warning", cfg.Free+2, v)
	}
	// Someone else puts it back meanwhile: nothing pending.
	d.filter(nil, now.Add(10*time.Millisecond))
	// After Reset without undos, an episode starts afresh.
	now = now.Add(cfg.Reset + time.Second)
	for i := 1; i <= cfg.Free; i++ {
		now = now.Add(time.Second)
		if v, ok := restore(d, addRule, now); !ok {
			t.Fatalf("new episode, undo %d: %+v, want an immediate repair", i, v)
		}
	}
	if v, _ := restore(d, addRule, now.Add(time.Second)); len(v.fights) != 1 || v.fights[0].undos != cfg.Free+1 {
		t.Fatalf("new episode, undo %d: %+v, want a new warning", cfg.Free+1, v)
	}
}

// A different operation on an object (the tunnel MTU changed) is not an
// undo, and objects are damped independently.
func TestDamperPolicyChangeAndIndependence(t *testing.T) {
	cfg := testDampConfig()
	d := newDamper(cfg)
	now := t0
	d.applied(addRule, now)
	d.observe(ruleNew)
	for i := 1; i <= cfg.Free; i++ {
		now = now.Add(time.Second)
		restore(d, addRule, now)
	}
	// The next undo of the rule is damped; the route is not.
	now = now.Add(time.Second)
	v := d.filter([]netwatch.Op{addRule, addRoute}, now)
	if len(v.todo) != 1 || v.todo[0] != 1 || v.damped != 1 {
		t.Fatalf("%+v, want the route through and the rule damped", v)
	}
	d.applied(addRoute, now)
	d.observe(netwatch.Event{Op: netwatch.EventNew, Kind: netwatch.KindRoute, Route: addRoute.Route})
	changed := addRoute
	changed.Route.MTU = 1420
	if v := d.filter([]netwatch.Op{changed}, now.Add(time.Millisecond)); len(v.todo) != 1 {
		t.Fatalf("a changed route: %+v, want it through", v)
	}
	if s := d.objs[keyOf(addRoute)]; s.undos != 0 {
		t.Errorf("the changed route counts %d undos, want 0", s.undos)
	}
}

func TestDamperForgets(t *testing.T) {
	cfg := testDampConfig()
	d := newDamper(cfg)
	d.applied(addRule, t0)
	d.observe(ruleNew)
	d.filter(nil, t0.Add(cfg.Reset+time.Second))
	if len(d.objs) != 0 {
		t.Errorf("%d objects remembered after Reset, want 0", len(d.objs))
	}
}
