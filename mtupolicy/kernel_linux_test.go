//go:build linux

package mtupolicy_test

import (
	"context"
	"encoding/binary"
	"errors"
	"github.com/marksplit/marksplit/internal/kerneltest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// The cases of issue 3 in a real network namespace: a Watcher and an
// Applier on the namespace, one pass at a time (livePass), checked with
// ip(8). fake_linux_test.go runs the same cases on netwatch/netwatchtest's fake
// kernel.

// livePass is one pass of the agent: read the view, mtupolicy.Desired,
// reconcile.Plan, Applier.Apply; then it waits until the watcher's view
// shows the result (Plan returns nothing again). It returns the applied
// plan; nil when Desired says nothing may be edited.
func livePass(t *testing.T, w *netwatch.Watcher, a *netwatch.Applier, cfg mtupolicy.Config, mode mtupolicy.Mode) []netwatch.Op {
	t.Helper()
	ops, ok, err := planNow(w, cfg, mode)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	if !ok {
		return nil
	}
	if res, err := a.Apply(ops); err != nil {
		t.Fatalf("apply: %v\nplan:\n%s\nresults: %+v", err, opsString(ops), res)
	}
	settle(t, w, cfg, mode)
	return ops
}

// planNow plans against the watcher's current view; ok is false when
// Desired refuses.
func planNow(w *netwatch.Watcher, cfg mtupolicy.Config, mode mtupolicy.Mode) (ops []netwatch.Op, ok bool, err error) {
	w.Read(func(v netwatch.View) {
		var d reconcile.Desired
		if d, ok = mtupolicy.Desired(v, cfg, mode); ok {
			ops, err = reconcile.Plan(v, d)
		}
	})
	return ops, ok, err
}

// settle polls until the watcher is synced and a plan is empty.
func settle(t *testing.T, w *netwatch.Watcher, cfg mtupolicy.Config, mode mtupolicy.Mode) {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	var last []netwatch.Op
	for {
		if w.Stats().Synced {
			ops, _, err := planNow(w, cfg, mode)
			if err == nil && len(ops) == 0 {
				return
			}
			last = ops
		}
		select {
		case <-deadline.C:
			t.Fatalf("the view did not converge within 5 s; stats %+v; still planned:\n%s", w.Stats(), opsString(last))
		case <-tick.C:
		}
	}
}

// waitSync polls until the watcher has synced.
func waitSync(t *testing.T, w *netwatch.Watcher) {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !w.Stats().Synced {
		select {
		case <-deadline.C:
			t.Fatalf("watcher not synced within 2 min; stats %+v", w.Stats())
		case <-tick.C:
		}
	}
}

// runWatcher starts a watcher with opts, reconnecting every millisecond,
// stopped when the test ends.
func runWatcher(t *testing.T, opts netwatch.Options) *netwatch.Watcher {
	t.Helper()
	opts.RetryMin, opts.RetryMax = time.Millisecond, time.Millisecond
	w := netwatch.New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("Run did not return within 2 min of cancellation")
		}
	})
	return w
}

func dialApplier(t *testing.T, opts netwatch.Options) *netwatch.Applier {
	t.Helper()
	a, err := netwatch.DialApplier(opts.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// openNetNS opens ns for netwatch.Options; it is closed when the test
// ends, after the watcher and applier opened with it (cleanups run last
// registered first).
func openNetNS(t *testing.T, ns *netwatchtest.NetNS) *netwatch.NetNS {
	t.Helper()
	n, err := netwatch.OpenNetNS(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// hasOp reports whether ops holds an operation of kind k satisfying f.
func hasOp(ops []netwatch.Op, k netwatch.OpKind, f func(netwatch.Op) bool) bool {
	return slices.ContainsFunc(ops, func(o netwatch.Op) bool { return o.Kind == k && (f == nil || f(o)) })
}

func firstOp(ops []netwatch.Op, k netwatch.OpKind) int {
	return slices.IndexFunc(ops, func(o netwatch.Op) bool { return o.Kind == k })
}

func lastOp(ops []netwatch.Op, k netwatch.OpKind) int {
	i := -1
	for j, o := range ops {
		if o.Kind == k {
			i = j
		}
	}
	return i
}

func isRepair(o netwatch.Op) bool { return o.Repair }

// ourRule is cfg's rule in family f, as the kernel reports it.
func ourRule(cfg mtupolicy.Config, f netwatch.Family) netwatch.Rule {
	return netwatch.Rule{Family: f, Priority: cfg.Priority, Table: cfg.Table, Action: netwatch.ActionToTable,
		Invert: true, Mark: cfg.Mark, Mask: cfg.Mask, Protocol: cfg.Protocol}
}

// ruleMsg is an RTM_NEWRULE request for "prio: [not] fwmark mark/mask
// lookup table proto proto" without NLM_F_EXCL, so the kernel (and the
// fake) add it even when an identical rule exists.
func ruleMsg(family uint8, prio, table uint32, invert bool, mark, mask uint32, proto uint8) netlink.Message {
	hdr := make([]byte, 12) // struct fib_rule_hdr
	hdr[0] = family
	hdr[4] = unix.RT_TABLE_UNSPEC
	hdr[7] = unix.FR_ACT_TO_TBL
	if invert {
		binary.NativeEndian.PutUint32(hdr[8:], unix.FIB_RULE_INVERT)
	}
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(unix.FRA_PRIORITY, prio)
	ae.Uint32(unix.FRA_TABLE, table)
	ae.Uint32(unix.FRA_FWMARK, mark)
	ae.Uint32(unix.FRA_FWMASK, mask)
	ae.Uint8(unix.FRA_PROTOCOL, proto)
	b, err := ae.Encode()
	if err != nil {
		panic(err)
	}
	return netlink.Message{
		Header: netlink.Header{Type: unix.RTM_NEWRULE, Flags: netlink.Request | netlink.Acknowledge | netlink.Create},
		Data:   append(hdr, b...),
	}
}

// kseed is the team's seed topology (agent/kernel_test.go) with a watcher
// and an applier on the node namespace.
type kseed struct {
	ns, gw *netwatchtest.NetNS
	opts   netwatch.Options // the node namespace
	w      *netwatch.Watcher
	a      *netwatch.Applier
	cfg    mtupolicy.Config
	marks  uint32
}

// sync waits until the watcher's view holds every change made so far: it
// adds a marker rule (priority 7777, outside the owned scope) and waits
// for the view to show it; events arrive in order.
func (s *kseed) sync(t *testing.T) {
	t.Helper()
	s.marks++
	s.ns.IP(t, "rule", "add", "pref", "7777", "lookup", strconv.Itoa(int(markerTable+s.marks)))
	waitMarker(t, s.w, markerTable+s.marks)
}

const markerPriority, markerTable = 7777, 1000

func waitMarker(t *testing.T, w *netwatch.Watcher, table uint32) {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		var seen bool
		w.Read(func(v netwatch.View) {
			if !v.Synced() {
				return
			}
			for r := range v.Rules(netwatch.IPv4) {
				if r.Priority == markerPriority && r.Table == netwatch.Table(table) {
					seen = true
				}
			}
		})
		if seen {
			// The marker's event is in; a re-dump that an earlier change
			// asked for may not be (a link's flushed routes): Barrier
			// waits for it.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := w.Barrier(ctx); err != nil {
				t.Fatalf("Barrier: %v", err)
			}
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("marker rule lookup %d not in the view within 5 s; stats %+v", table, w.Stats())
		case <-tick.C:
		}
	}
}

func newKSeed(t *testing.T, lowered bool) *kseed {
	t.Helper()
	s := &kseed{ns: kerneltest.NewNetNS(t), gw: kerneltest.NewNetNS(t)}
	s.ns.LoUp(t)
	s.gw.LoUp(t)
	s.ns.AddVeth(t, "enp7s0", s.gw, "gw0")
	s.gw.IP(t, "link", "set", "gw0", "mtu", "1450")
	s.gw.IP(t, "addr", "add", "10.0.0.1/16", "dev", "gw0")
	s.gw.IP(t, "link", "set", "gw0", "up")
	s.ns.IP(t, "link", "set", "enp7s0", "mtu", "1450")
	s.ns.IP(t, "addr", "add", "10.0.0.5/16", "dev", "enp7s0", "noprefixroute")
	s.ns.IP(t, "link", "set", "enp7s0", "up")
	s.dhcp(t, lowered)
	s.ns.AddTun(t, "cilium_wg0")
	s.ns.IP(t, "link", "set", "cilium_wg0", "mtu", "1355", "up")
	s.cfg = mtupolicy.DefaultConfig()
	s.cfg.Prefixes = []netip.Prefix{pfx("10.0.0.0/16")}
	s.opts = netwatch.Options{NetNS: openNetNS(t, s.ns)}
	s.w = runWatcher(t, s.opts)
	s.a = dialApplier(t, s.opts)
	waitSync(t, s.w)
	return s
}

func (s *kseed) dhcp(t *testing.T, lowered bool) {
	t.Helper()
	s.ns.IP(t, "route", "add", "10.0.0.1", "dev", "enp7s0", "proto", "dhcp", "scope", "link", "src", "10.0.0.5")
	args := []string{"route", "add", "10.0.0.0/16", "via", "10.0.0.1", "dev", "enp7s0", "proto", "dhcp", "src", "10.0.0.5"}
	if lowered {
		args = append(args, "mtu", "1355")
	}
	s.ns.IP(t, args...)
}

func (s *kseed) pass(t *testing.T, mode mtupolicy.Mode) []netwatch.Op {
	t.Helper()
	s.sync(t)
	return livePass(t, s.w, s.a, s.cfg, mode)
}

// path is the table and MTU `ip route get` reports for dst, with or
// without the mark; the MTU is the output link's when the route has none.
func (s *kseed) path(t *testing.T, dst string, marked bool) (table string, mtu string) {
	t.Helper()
	args := []string{"route", "get", dst}
	if marked {
		args = append(args, "mark", "0xe00")
	}
	f := strings.Fields(s.ns.IP(t, args...))
	table = "main"
	for i := 0; i+1 < len(f); i++ {
		switch f[i] {
		case "table":
			table = f[i+1]
		case "mtu":
			mtu = f[i+1]
		case "dev":
			if mtu == "" {
				var links []struct {
					MTU int `json:"mtu"`
				}
				s.ns.IPJSON(t, &links, "link", "show", "dev", f[i+1])
				if len(links) == 1 {
					mtu = strconv.Itoa(links[0].MTU)
				}
			}
		}
	}
	return table, mtu
}

// splitAt checks that unmarked traffic to dst takes table 900 at tunnelMTU
// and marked traffic the main table at 1450.
func (s *kseed) splitAt(t *testing.T, dst, tunnelMTU string) {
	t.Helper()
	if table, mtu := s.path(t, dst, false); table != "900" || mtu != tunnelMTU {
		t.Errorf("ip route get %s: table %s mtu %s, want table 900 mtu %s", dst, table, mtu, tunnelMTU)
	}
	if table, mtu := s.path(t, dst, true); table != "main" || mtu != "1450" {
		t.Errorf("ip route get %s mark 0xe00: table %s mtu %s, want table main mtu 1450", dst, table, mtu)
	}
}

// unsplit checks that nothing owned is left: no rule at 900, no route in
// table 900, in both families.
func (s *kseed) unsplit(t *testing.T) {
	t.Helper()
	for _, fam := range []string{"-4", "-6"} {
		if out := s.ns.IP(t, fam, "rule", "show", "pref", "900"); out != "" {
			t.Errorf("ip %s rule show pref 900: %q", fam, out)
		}
		for l := range strings.Lines(s.ns.IP(t, fam, "route", "show", "table", "all")) {
			if strings.Contains(l, " table 900 ") {
				t.Errorf("ip %s route show table all: %q", fam, l)
			}
		}
	}
}

// rules900 is `ip -j FAM rule show pref 900`; iproute2 writes "not" as a
// key with a null value.
func (s *kseed) rules900(t *testing.T, fam string) []map[string]any {
	t.Helper()
	var rs []map[string]any
	s.ns.IPJSON(t, &rs, fam, "rule", "show", "pref", "900")
	return rs
}

// checkOurRuleOnly checks that pref 900 holds exactly our rule.
func (s *kseed) checkOurRuleOnly(t *testing.T, fam string) {
	t.Helper()
	rs := s.rules900(t, fam)
	ok := len(rs) == 1
	if ok {
		_, not := rs[0]["not"]
		ok = not && rs[0]["fwmark"] == "0xe00" && rs[0]["fwmask"] == "0xf00" && rs[0]["table"] == "900" && rs[0]["protocol"] == "109"
	}
	if !ok {
		t.Errorf("ip %s -j rule show pref 900: %v, want exactly not fwmark 0xe00/0xf00 lookup 900 proto 109", fam, rs)
	}
}

func TestKernelCase01FreshNode(t *testing.T) {
	s := newKSeed(t, true)
	ops := s.pass(t, mtupolicy.ModeOn)
	if !hasOp(ops, netwatch.RuleAdd, nil) ||
		!hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool { return !o.Repair && o.Route.Dst == pfx("10.0.0.0/16") && o.Route.MTU == 1355 }) ||
		!hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool { return o.Repair && o.Route.MTU == 0 }) {
		t.Errorf("first pass lacks the table route, the rule or the repair:\n%s", opsString(ops))
	}
	if i, j := lastOp(ops, netwatch.RouteReplace), firstOp(ops, netwatch.RuleAdd); j < 0 || firstOp(ops, netwatch.RouteReplace) > j {
		t.Errorf("rule added before the table routes (route %d, rule %d):\n%s", i, j, opsString(ops))
	}
	s.splitAt(t, "10.0.0.9", "1355")
	s.checkOurRuleOnly(t, "-4")
	if out := s.ns.IP(t, "route", "get", "10.0.0.9", "mark", "0xe00"); strings.Contains(out, "table 900") {
		t.Errorf("marked lookup took table 900: %q", out)
	}
}

func TestKernelCase02Converged(t *testing.T) {
	s := newKSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)
	if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
		t.Errorf("second pass planned:\n%s", opsString(ops))
	}
}

func TestKernelCase03RepairOnce(t *testing.T) {
	s := newKSeed(t, true)
	ops := s.pass(t, mtupolicy.ModeOn)
	if n := len(slices.DeleteFunc(slices.Clone(ops), func(o netwatch.Op) bool { return !o.Repair })); n != 1 {
		t.Errorf("first pass: %d repairs, want 1:\n%s", n, opsString(ops))
	}
	if out := s.ns.IP(t, "route", "show", "10.0.0.0/16"); strings.Contains(out, "mtu") {
		t.Errorf("main route not repaired (it keeps an MTU of its own): %q", out)
	}
	for i := range 2 {
		if ops := s.pass(t, mtupolicy.ModeOn); hasOp(ops, netwatch.RouteReplace, isRepair) {
			t.Errorf("pass %d repaired again:\n%s", i+2, opsString(ops))
		}
	}
}

func TestKernelCase04OptedOut(t *testing.T) {
	s := newKSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)
	ops := s.pass(t, mtupolicy.ModeOff)
	if len(ops) == 0 || ops[0].Kind != netwatch.RuleDelete || !hasOp(ops, netwatch.RouteDelete, nil) {
		t.Errorf("opting out: want the rule deleted first, then the table routes:\n%s", opsString(ops))
	}
	if hasOp(ops, netwatch.RouteReplace, nil) || hasOp(ops, netwatch.RuleAdd, nil) {
		t.Errorf("opting out added something:\n%s", opsString(ops))
	}
	s.unsplit(t)
}

func TestKernelCase05OptedOutClean(t *testing.T) {
	s := newKSeed(t, true)
	if ops := s.pass(t, mtupolicy.ModeOff); len(ops) != 0 {
		t.Errorf("opted out with nothing owned planned:\n%s", opsString(ops))
	}
	s.unsplit(t)
}

func TestKernelCase06ModeUnknown(t *testing.T) {
	s := newKSeed(t, true)
	if ops := s.pass(t, mtupolicy.ModeUnknown); ops != nil {
		t.Errorf("unknown mode on a fresh node planned:\n%s", opsString(ops))
	}
	s.unsplit(t)
	s.pass(t, mtupolicy.ModeOn)
	s.ns.IP(t, "link", "set", "cilium_wg0", "mtu", "1420")
	s.ns.IP(t, "rule", "add", "pref", "900", "fwmark", "0xd00/0xf00", "lookup", "900")
	s.sync(t)
	if ops, ok, err := planNow(s.w, s.cfg, mtupolicy.ModeUnknown); ok || err != nil || ops != nil {
		t.Errorf("unknown mode on a node with work to do: ok %v err %v ops\n%s", ok, err, opsString(ops))
	}
	if ops := s.pass(t, mtupolicy.ModeUnknown); ops != nil {
		t.Errorf("unknown mode planned:\n%s", opsString(ops))
	}
	if rs := s.rules900(t, "-4"); len(rs) != 2 {
		t.Errorf("rules at 900 changed under an unknown mode: %+v", rs)
	}
}

// modeKeeper is how a caller keeps the last good read of the mode.
type modeKeeper struct{ last mtupolicy.Mode }

func (k *modeKeeper) read(m mtupolicy.Mode) mtupolicy.Mode {
	if m != mtupolicy.ModeUnknown {
		k.last = m
	}
	return k.last
}

func TestKernelCase07InterfaceBounce(t *testing.T) {
	s := newKSeed(t, true)
	var k modeKeeper
	s.pass(t, k.read(mtupolicy.ModeOn))
	s.ns.IP(t, "link", "set", "enp7s0", "down")
	s.ns.IP(t, "link", "set", "enp7s0", "up")
	s.dhcp(t, false)
	mode := k.read(mtupolicy.ModeUnknown)
	if mode != mtupolicy.ModeOn {
		t.Fatalf("kept mode %v, want on", mode)
	}
	ops := s.pass(t, mode)
	if !hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool { return o.Route.Table == 900 && o.Route.Dst == pfx("10.0.0.0/16") }) {
		t.Errorf("table not rebuilt after the bounce:\n%s", opsString(ops))
	}
	s.splitAt(t, "10.0.0.9", "1355")
	s.checkOurRuleOnly(t, "-4")
}

func TestKernelCase08TunnelGone(t *testing.T) {
	s := newKSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)
	s.ns.IP(t, "link", "del", "cilium_wg0")
	ops := s.pass(t, mtupolicy.ModeOn)
	if len(ops) == 0 || ops[0].Kind != netwatch.RuleDelete || !hasOp(ops, netwatch.RouteDelete, nil) || hasOp(ops, netwatch.RouteReplace, nil) {
		t.Errorf("tunnel gone: want the rule, then the table routes removed:\n%s", opsString(ops))
	}
	s.unsplit(t)
}

func TestKernelCase09StrayRules(t *testing.T) {
	t.Run("strays", func(t *testing.T) {
		s := newKSeed(t, true)
		s.ns.IP(t, "rule", "add", "pref", "900", "fwmark", "0xe00/0xf00", "lookup", "900")
		s.ns.IP(t, "rule", "add", "pref", "900", "not", "fwmark", "0xd00/0xf00", "lookup", "900")
		s.ns.IP(t, "rule", "add", "pref", "900", "not", "fwmark", "0xe00/0xf00", "lookup", "901")
		s.sync(t)
		ops, ok, err := planNow(s.w, s.cfg, mtupolicy.ModeOn)
		settle0 := len(ops)
		if !ok || err != nil {
			t.Fatalf("plan: ok %v err %v", ok, err)
		}
		if res, err := s.a.Apply(ops); err != nil {
			t.Fatalf("apply: %v\n%+v", err, res)
		}
		// One pass: the kernel holds exactly our rule right after it.
		s.checkOurRuleOnly(t, "-4")
		settle(t, s.w, s.cfg, mtupolicy.ModeOn)
		if n := len(slices.DeleteFunc(slices.Clone(ops), func(o netwatch.Op) bool { return o.Kind != netwatch.RuleDelete })); n < 3 || settle0 == 0 {
			t.Errorf("%d rule deletes, want at least the 3 strays:\n%s", n, opsString(ops))
		}
		s.splitAt(t, "10.0.0.9", "1355")
	})
	t.Run("duplicates", func(t *testing.T) {
		s := newKSeed(t, true)
		s.pass(t, mtupolicy.ModeOn)
		c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: s.ns.FD()})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Execute(ruleMsg(unix.AF_INET, 900, 900, true, 0xe00, 0xf00, uint8(s.cfg.Protocol))); err != nil {
			t.Fatalf("add a duplicate rule: %v", err)
		}
		if rs := s.rules900(t, "-4"); len(rs) != 2 {
			t.Fatalf("duplicate not added: %+v", rs)
		}
		ops := s.pass(t, mtupolicy.ModeOn)
		if len(ops) != 1 || ops[0].Kind != netwatch.RuleDelete || ops[0].Rule != ourRule(s.cfg, netwatch.IPv4) {
			t.Errorf("two identical rules: want one rule delete:\n%s", opsString(ops))
		}
		s.checkOurRuleOnly(t, "-4")
		s.splitAt(t, "10.0.0.9", "1355")
	})
}

func TestKernelCase10StaleTableRoutes(t *testing.T) {
	s := newKSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)

	s.ns.IP(t, "link", "set", "cilium_wg0", "mtu", "1420")
	ops := s.pass(t, mtupolicy.ModeOn)
	if !hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool {
		return o.Route.Dst == pfx("10.0.0.0/16") && o.Route.MTU == 1420 && o.HasWas && o.Was.MTU == 1355
	}) {
		t.Errorf("tunnel MTU 1355 → 1420: table route not replaced:\n%s", opsString(ops))
	}
	s.splitAt(t, "10.0.0.9", "1420")

	narrow := s.cfg
	narrow.Prefixes = []netip.Prefix{pfx("10.0.0.1/32")}
	s.sync(t)
	ops = livePass(t, s.w, s.a, narrow, mtupolicy.ModeOn)
	if len(ops) != 1 || ops[0].Kind != netwatch.RouteDelete || ops[0].Route.Dst != pfx("10.0.0.0/16") {
		t.Errorf("prefix no longer selected: want its table route dropped:\n%s", opsString(ops))
	}
	if out := s.ns.IP(t, "route", "show", "table", "900"); strings.Contains(out, "10.0.0.0/16") || !strings.Contains(out, "10.0.0.1 ") {
		t.Errorf("table 900 after narrowing: %q", out)
	}

	s.pass(t, mtupolicy.ModeOn)
	s.ns.IP(t, "route", "add", "10.0.0.2", "dev", "enp7s0", "proto", "dhcp", "scope", "link", "src", "10.0.0.5")
	s.ns.IP(t, "route", "replace", "10.0.0.0/16", "via", "10.0.0.2", "dev", "enp7s0", "proto", "dhcp", "src", "10.0.0.5")
	ops = s.pass(t, mtupolicy.ModeOn)
	if !hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool {
		return o.Route.Dst == pfx("10.0.0.0/16") && o.Route.Gateway == addr("10.0.0.2") && o.HasWas && o.Was.Gateway == addr("10.0.0.1")
	}) {
		t.Errorf("gateway changed: table route not replaced:\n%s", opsString(ops))
	}
	if out := s.ns.IP(t, "route", "show", "table", "900", "10.0.0.0/16"); !strings.Contains(out, "via 10.0.0.2") || !strings.Contains(out, "mtu 1420") {
		t.Errorf("table 900 route after the gateway change: %q", out)
	}
}

func TestKernelCase11NotSynced(t *testing.T) {
	kerneltest.NewNetNS(t)
	t.Skip("a real kernel cannot be made to fail a listing on demand; TestFakeCase11NotSynced covers it with netwatchtest's FailAll")
}

func TestKernelCase12KernelFlags(t *testing.T) {
	t.Run("no MTU attribute", func(t *testing.T) {
		s := newKSeed(t, false)
		ops := s.pass(t, mtupolicy.ModeOn)
		if hasOp(ops, netwatch.RouteReplace, isRepair) || !hasOp(ops, netwatch.RuleAdd, nil) {
			t.Errorf("main route without MTU: want a split and no repair:\n%s", opsString(ops))
		}
		s.splitAt(t, "10.0.0.9", "1355")
		if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
			t.Errorf("second pass planned:\n%s", opsString(ops))
		}
	})
	t.Run("linkdown", func(t *testing.T) {
		s := newKSeed(t, true)
		s.pass(t, mtupolicy.ModeOn)
		s.gw.IP(t, "link", "set", "gw0", "down")
		eventuallyLinkdown(t, s)
		s.sync(t)
		settle(t, s.w, s.cfg, mtupolicy.ModeOn)
		if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
			t.Errorf("pass with the carrier down planned:\n%s", opsString(ops))
		}
		// And split afresh while the carrier is down.
		s.pass(t, mtupolicy.ModeOff)
		ops := s.pass(t, mtupolicy.ModeOn)
		if !hasOp(ops, netwatch.RuleAdd, nil) {
			t.Errorf("split with the carrier down:\n%s", opsString(ops))
		}
		if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
			t.Errorf("second pass with the carrier down planned:\n%s", opsString(ops))
		}
		if out := s.ns.IP(t, "route", "show", "table", "900", "10.0.0.0/16"); !strings.Contains(out, "linkdown") {
			t.Errorf("table route not flagged linkdown: %q", out)
		}
	})
}

// eventuallyLinkdown waits until the watcher sees the main route flagged
// linkdown.
func eventuallyLinkdown(t *testing.T, s *kseed) {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		var down bool
		s.w.Read(func(v netwatch.View) {
			for r := range v.Routes(netwatch.IPv4, netwatch.TableMain) {
				if r.Dst == pfx("10.0.0.0/16") && r.Flags&netwatch.RouteLinkdown != 0 {
					down = true
				}
			}
		})
		if down {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("main route not flagged linkdown in the view: %q", s.ns.IP(t, "route", "show"))
		case <-tick.C:
		}
	}
}

func TestKernelCase13Families(t *testing.T) {
	s := newKSeed(t, true)
	s.gw.IP(t, "addr", "add", "fd00::1/64", "dev", "gw0", "nodad")
	s.ns.IP(t, "addr", "add", "fd00::5/64", "dev", "enp7s0", "noprefixroute", "nodad")
	s.ns.IP(t, "-6", "route", "add", "fd00::1", "dev", "enp7s0", "proto", "dhcp")
	s.ns.IP(t, "-6", "route", "add", "fd00::/64", "via", "fd00::1", "dev", "enp7s0", "proto", "dhcp", "mtu", "1355")
	s.cfg.Prefixes = append(s.cfg.Prefixes, pfx("fd00::/64"))
	ops := s.pass(t, mtupolicy.ModeOn)
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		if !hasOp(ops, netwatch.RuleAdd, func(o netwatch.Op) bool { return o.Rule == ourRule(s.cfg, f) }) {
			t.Errorf("no rule added for %v:\n%s", f, opsString(ops))
		}
	}
	s.checkOurRuleOnly(t, "-4")
	s.checkOurRuleOnly(t, "-6")
	s.splitAt(t, "10.0.0.9", "1355")
	s.splitAt(t, "fd00::9", "1355")
	if out := s.ns.IP(t, "-6", "route", "get", "fd00::9"); !strings.Contains(out, "src fd00::5") {
		t.Errorf("ip -6 route get fd00::9: %q, want src fd00::5", out)
	}
	if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
		t.Errorf("second pass planned:\n%s", opsString(ops))
	}
	t.Run("RouteGet IPv6", func(t *testing.T) {
		got, err := s.a.RouteGet(addr("fd00::9"), 0)
		if err != nil || got.Table != 900 || got.MTU != 1355 {
			t.Errorf("RouteGet fd00::9: %v (%v), want table 900 mtu 1355", got, err)
		}
		got, err = s.a.RouteGet(addr("fd00::9"), 0xe00)
		if err != nil || got.Table == 900 || got.MTU != 0 && got.MTU != 1450 {
			t.Errorf("RouteGet fd00::9 mark 0xe00: %v (%v), want not table 900, at the link's MTU 1450", got, err)
		}
	})
}
