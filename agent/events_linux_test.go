//go:build linux

package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// capture is a nodeEvents whose records the test reads as "Type Reason: note".
func capture() (*nodeEvents, *[]string) {
	var got []string
	e := &nodeEvents{cfg: mtupolicy.DefaultConfig(), hadRule: -1}
	e.cfg.Table, e.cfg.Priority, e.cfg.Mark, e.cfg.Mask = 900, 900, 0xe00, 0xf00
	e.recordGroup = func(group, typ, reason, action, note string) {
		got = append(got, typ+" "+reason+" ["+group+"]: "+note)
	}
	return e, &got
}

// What the loop's hooks see becomes a few Events: a transition each, never
// one per pass or per repair.
func TestNodeEvents(t *testing.T) {
	e, got := capture()
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	// step is a pass that found the rule there or not (before) and made ops
	// changes; it converged when it had nothing to do.
	step := func(before bool, ops int, mode mtupolicy.Mode) {
		e.haveRule.Store(before)
		now = now.Add(time.Second)
		e.pass(reconcile.Pass{Planned: true, Applied: make([]netwatch.Op, ops)}, ops == 0, mode, now)
	}
	// The mode is learnt: no Event; the split installed: one.
	e.setMode(mtupolicy.ModeUnknown, mtupolicy.ModeOn)
	e.pass(reconcile.Pass{}, false, mtupolicy.ModeOn, now) // not planned
	step(false, 3, mtupolicy.ModeOn)
	step(true, 0, mtupolicy.ModeOn)
	step(true, 0, mtupolicy.ModeOn)
	// A fight: one Event at its start, none per repair, none at its end.
	e.fight(reconcile.Fight{Object: "rule 900", Line: "rule 900: not fwmark 0xe00/0xf00 lookup 900", By: netwatch.Origin{Kind: netwatch.OriginProgram, PID: 42, Comm: "ip"}, Undos: 3})
	for range 100 {
		step(false, 1, mtupolicy.ModeOn)
		step(true, 0, mtupolicy.ModeOn)
	}
	e.fight(reconcile.Fight{Line: "rule 900: not fwmark 0xe00/0xf00 lookup 900", Over: true})
	// Opted out: the mode change and the split removed.
	e.setMode(mtupolicy.ModeOn, mtupolicy.ModeOff)
	step(true, 3, mtupolicy.ModeOff)
	step(false, 0, mtupolicy.ModeOff)
	e.setMode(mtupolicy.ModeOff, mtupolicy.ModeOn)
	// The tunnel link goes missing: one Event while it lasts.
	e.tunnelGone.Store(true)
	step(false, 0, mtupolicy.ModeOn)
	step(false, 0, mtupolicy.ModeOn)
	e.tunnelGone.Store(false)
	step(false, 3, mtupolicy.ModeOn)
	step(true, 0, mtupolicy.ModeOn)

	const (
		installed = "split installed: rule 900 (not fwmark 0xe00/0xf00 lookup 900): host traffic to the split destinations takes table 900 at cilium_wg0's MTU"
		removed   = "split removed: rule 900 and table 900's routes are gone (the node does not encrypt)"
		tunnel    = "tunnel link cilium_wg0 does not exist while the node encrypts: nothing is split"
	)
	want := []string{
		"Normal SplitInstalled [" + installed + "]: " + installed,
		"Warning SplitFight [rule 900]: rule 900: not fwmark 0xe00/0xf00 lookup 900 is undone again and again (first by ip[42]); the agent repairs it, rate-limited; its log names each program",
		"Normal EncryptionModeChanged [node encryption: off (was on)]: node encryption: off (was on)",
		"Normal SplitRemoved [" + removed + "]: " + removed,
		"Normal EncryptionModeChanged [node encryption: on (was off)]: node encryption: on (was off)",
		"Warning TunnelLinkMissing [" + tunnel + "]: " + tunnel,
		"Normal SplitInstalled [" + installed + "]: " + installed,
	}
	if diff := cmp.Diff(want, *got); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}

// An agent restarted over its own split records nothing: the first
// converged pass made no change.
func TestNodeEventsRestart(t *testing.T) {
	e, got := capture()
	e.haveRule.Store(true)
	e.pass(reconcile.Pass{Planned: true}, true, mtupolicy.ModeOn, time.Now())
	e.haveRule.Store(false)
	e.hadRule = -1
	e.pass(reconcile.Pass{Planned: true}, true, mtupolicy.ModeOff, time.Now())
	if len(*got) != 0 {
		t.Errorf("Events %q, want none", *got)
	}
}

// During an uninstall the mode stays on (the switch overrides it): the
// SplitRemoved note names the switch, not "nothing is left to split"
// (issue 30).
func TestNodeEventsUninstallSwitch(t *testing.T) {
	e, got := capture()
	off := false
	e.uninstall = func() (string, bool) { return "kube-system/marksplit-uninstall", off }
	e.haveRule.Store(true)
	e.pass(reconcile.Pass{Planned: true}, true, mtupolicy.ModeOn, time.Now())
	off = true
	e.pass(reconcile.Pass{Planned: true, Applied: make([]netwatch.Op, 3)}, false, mtupolicy.ModeOn, time.Now())
	e.haveRule.Store(false)
	e.pass(reconcile.Pass{Planned: true}, true, mtupolicy.ModeOn, time.Now())
	const removed = "split removed: rule 900 and table 900's routes are gone (uninstall switch kube-system/marksplit-uninstall present)"
	if diff := cmp.Diff([]string{"Normal SplitRemoved [" + removed + "]: " + removed}, *got); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}

// Failed passes are an Event after 10 in a row or a minute of failing,
// then once a minute while they go on; a good pass ends the streak.
func TestNodeEventsPassFailing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration // between failed passes
		n     int
		want  int
	}{
		{"9 quick failures", 100 * time.Millisecond, 9, 0},
		{"10 quick failures", 100 * time.Millisecond, 10, 1},
		{"a failure a second for 3 minutes", time.Second, 180, 3},
		{"2 failures a minute apart", time.Minute, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, got := capture()
			now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
			for range tc.n {
				e.pass(reconcile.Pass{Planned: true, Err: errors.New("add rule: operation not permitted")}, false, mtupolicy.ModeOn, now)
				now = now.Add(tc.every)
			}
			if len(*got) != tc.want {
				t.Fatalf("%d Events, want %d: %q", len(*got), tc.want, *got)
			}
			for _, g := range *got {
				if !strings.HasPrefix(g, "Warning PassFailing [reconcile passes keep failing") || !strings.HasSuffix(g, ": add rule: operation not permitted") {
					t.Errorf("Event %q", g)
				}
			}
			// A good pass ends the streak: the next failures start afresh.
			e.pass(reconcile.Pass{Planned: true}, true, mtupolicy.ModeOn, now)
			n := len(*got)
			e.pass(reconcile.Pass{Planned: true, Err: errors.New("x")}, false, mtupolicy.ModeOn, now.Add(time.Second))
			if len(*got) != n {
				t.Errorf("one failure after a good pass recorded %q", (*got)[n:])
			}
		})
	}
}

// Without API access, or with --events=false, there are no Events and one
// line says why; the nil nodeEvents' hooks do nothing.
func TestNodeEventsOff(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	for _, tc := range []struct {
		o    options
		want string
	}{
		{options{nodeName: "n1"}, "events: off: in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set"},
		{options{}, "events: off: no Node to record Kubernetes Events on"},
		{options{nodeName: "n1", noEvents: true}, "events: off (--events=false)"},
	} {
		var b strings.Builder
		e := newNodeEvents(tc.o, newLogger(&b, "text"))
		if e != nil || strings.Count(b.String(), "\n") != 1 || !strings.Contains(b.String(), tc.want) {
			t.Errorf("%+v: %v, logged %q; want nil and one line with %q", tc.o, e, b.String(), tc.want)
		}
		e.fight(reconcile.Fight{})
		e.setMode(mtupolicy.ModeOn, mtupolicy.ModeOff)
		e.pass(reconcile.Pass{Planned: true, Err: errors.New("x")}, false, mtupolicy.ModeOn, time.Now())
	}
	o, err := parseArgs([]string{"--prefix=10.0.0.0/16", "--encryption=on", "--events=false"}, func(string) string { return "" }, nil)
	if err != nil || !o.noEvents {
		t.Errorf("--events=false: %+v, %v", o, err)
	}
	if o, err := parseArgs([]string{"--prefix=10.0.0.0/16", "--encryption=on", "--events"}, func(string) string { return "" }, nil); err != nil || o.noEvents {
		t.Errorf("--events: %+v, %v", o, err)
	}
}

// Standing down for node encryption is one Event, whose note says why: the split's
// removal that follows records none of its own; the resumption is one more, and the
// split installed again another.
func TestNodeEventsStandDown(t *testing.T) {
	e, got := capture()
	why := `encrypt-node is "false" in ConfigMap kube-system/cilium-config: node encryption is off`
	standing := ""
	e.standingDown = func() string { return standing }
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	step := func(before bool, ops int, mode mtupolicy.Mode) {
		e.haveRule.Store(before)
		now = now.Add(time.Second)
		e.pass(reconcile.Pass{Planned: true, Applied: make([]netwatch.Op, ops)}, ops == 0, mode, now)
	}
	step(true, 0, mtupolicy.ModeOn) // the split in place
	standing = why
	e.standDown(why)
	step(true, 2, mtupolicy.ModeOff)
	step(false, 0, mtupolicy.ModeOff)
	step(false, 0, mtupolicy.ModeOff)
	standing = ""
	e.resume(`encrypt-node is "true" in ConfigMap kube-system/cilium-config: node encryption is on`)
	step(false, 2, mtupolicy.ModeOn)
	step(true, 0, mtupolicy.ModeOn)
	want := []string{
		"Warning NodeEncryptionOff [" + why + ": the agent stands down: it removes the split, repairs nothing and leaves the main table alone]: " +
			why + ": the agent stands down: it removes the split, repairs nothing and leaves the main table alone",
		`Normal NodeEncryptionOn [encrypt-node is "true" in ConfigMap kube-system/cilium-config: node encryption is on: the agent resumes: the split follows the node's CiliumNode again]: ` +
			`encrypt-node is "true" in ConfigMap kube-system/cilium-config: node encryption is on: the agent resumes: the split follows the node's CiliumNode again`,
		"Normal SplitInstalled [split installed: rule 900 (not fwmark 0xe00/0xf00 lookup 900): host traffic to the split destinations takes table 900 at cilium_wg0's MTU]: " +
			"split installed: rule 900 (not fwmark 0xe00/0xf00 lookup 900): host traffic to the split destinations takes table 900 at cilium_wg0's MTU",
	}
	if diff := cmp.Diff(want, *got); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}

// A route given up is one Warning that names the route, the program and the count.
func TestNodeEventsStepBack(t *testing.T) {
	e, got := capture()
	e.stepBack(reconcile.Fight{Object: "table main 10.0.0.0/16", Line: "dhcp route 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5",
		By: netwatch.Origin{Kind: netwatch.OriginProgram, PID: 4242, Comm: "cilium-agent"}, Undos: 3, Since: 2 * time.Second, Objects: 1})
	if len(*got) != 1 || !strings.HasPrefix((*got)[0], "Warning RepairSteppedBack [table main 10.0.0.0/16]: dhcp route 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 is undone 3 times in 2s by cilium-agent[4242]") {
		t.Errorf("Events %q, want one RepairSteppedBack naming the route, the count and the program", *got)
	}
}
