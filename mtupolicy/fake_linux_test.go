//go:build linux

package mtupolicy_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// The cases of issue 3 on netwatch/netwatchtest's fake kernel, with the same
// livePass as the real-namespace tests (kernel_linux_test.go).

// fseed is the seed topology in the fake kernel: enp7s0 (MTU 1450,
// 10.0.0.5/16), the DHCP client's routes, cilium_wg0 (tun, MTU 1355).
type fseed struct {
	k        *netwatchtest.Kernel
	eth, tun uint32
	opts     netwatch.Options // the fake's dialer
	w        *netwatch.Watcher
	a        *netwatch.Applier
	cfg      mtupolicy.Config
	marks    uint32
}

// sync waits until the watcher's view holds every change made so far (see
// kseed.sync).
func (s *fseed) sync(t *testing.T) {
	t.Helper()
	s.marks++
	if err := s.k.AddRule(netwatch.Rule{Family: netwatch.IPv4, Priority: markerPriority, Table: netwatch.Table(markerTable + s.marks)}); err != nil {
		t.Fatal(err)
	}
	waitMarker(t, s.w, markerTable+s.marks)
}

const protoDHCP = 16 // RTPROT_DHCP

func newFSeed(t *testing.T, lowered bool) *fseed {
	t.Helper()
	s := &fseed{k: netwatchtest.New()}
	t.Cleanup(func() { s.k.Close() })
	s.eth = s.k.AddLink("enp7s0", "veth", 1450, true)
	if err := s.k.AddAddr(s.eth, pfx("10.0.0.5/16")); err != nil {
		t.Fatal(err)
	}
	s.dhcp(t, lowered)
	s.tun = s.k.AddLink("cilium_wg0", "tun", 1355, true)
	s.cfg = mtupolicy.DefaultConfig()
	s.cfg.Prefixes = []netip.Prefix{pfx("10.0.0.0/16")}
	s.opts = netwatch.Options{NetNS: s.k.NetNS()}
	s.w = runWatcher(t, s.opts)
	s.a = dialApplier(t, s.opts)
	waitSync(t, s.w)
	return s
}

func (s *fseed) dhcp(t *testing.T, lowered bool) {
	t.Helper()
	mtu := uint32(0)
	if lowered {
		mtu = 1355
	}
	for _, r := range []netwatch.Route{
		{Dst: pfx("10.0.0.1/32"), Index: s.eth, PrefSrc: addr("10.0.0.5"), Protocol: protoDHCP, Scope: unix.RT_SCOPE_LINK},
		{Dst: pfx("10.0.0.0/16"), Gateway: addr("10.0.0.1"), Index: s.eth, PrefSrc: addr("10.0.0.5"), Protocol: protoDHCP, MTU: mtu},
	} {
		if err := s.k.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
}

func (s *fseed) pass(t *testing.T, mode mtupolicy.Mode) []netwatch.Op {
	t.Helper()
	s.sync(t)
	return livePass(t, s.w, s.a, s.cfg, mode)
}

// splitAt checks the fake's route lookups: unmarked traffic to dst takes
// table 900 at tunnelMTU, marked traffic the main table at 1450.
func (s *fseed) splitAt(t *testing.T, dst string, tunnelMTU uint32) {
	t.Helper()
	got, err := s.a.RouteGet(addr(dst), 0)
	if err != nil || got.Table != s.cfg.Table || got.MTU != tunnelMTU || !got.PrefSrc.IsValid() {
		t.Errorf("route get %s: table %v mtu %d src %v (%v), want table 900 mtu %d with a src", dst, got.Table, got.MTU, got.PrefSrc, err, tunnelMTU)
	}
	got, err = s.a.RouteGet(addr(dst), s.cfg.Mark)
	if err != nil || got.Table != netwatch.TableMain || got.MTU != 0 && got.MTU != 1450 {
		t.Errorf("route get %s mark 0xe00: table %v mtu %d (%v), want table main at the link's 1450", dst, got.Table, got.MTU, err)
	}
}

// unsplit checks that nothing owned is left in the fake kernel.
func (s *fseed) unsplit(t *testing.T) {
	t.Helper()
	for _, r := range s.k.Snapshot().Routes {
		if r.Table == s.cfg.Table {
			t.Errorf("route left in table 900: %+v", r)
		}
	}
	for _, r := range s.k.Snapshot().Rules {
		if r.Priority == s.cfg.Priority {
			t.Errorf("rule left at 900: %v", r)
		}
	}
}

// rules900 returns the fake's rules of family at 900.
func (s *fseed) rules900(family netwatch.Family) []netwatch.Rule {
	return slices.DeleteFunc(s.k.Snapshot().Rules, func(r netwatch.Rule) bool { return r.Family != family || r.Priority != s.cfg.Priority })
}

func (s *fseed) checkOurRuleOnly(t *testing.T, family netwatch.Family) {
	t.Helper()
	rs := s.rules900(family)
	want := netwatch.Rule{Family: family, Priority: 900, Table: 900, Action: unix.FR_ACT_TO_TBL, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: s.cfg.Protocol}
	if len(rs) != 1 || rs[0] != want {
		t.Errorf("rules at 900 (family %d): %v, want exactly %v", family, rs, want)
	}
}

// mutations counts the route and rule changes asked of the fake kernel,
// refused or not: the edits an Applier makes. (The watcher's own barrier,
// an RTM_DELADDR the kernel refuses, is not one.)
func mutations(k *netwatchtest.Kernel) int {
	n := 0
	for _, r := range k.Requests() {
		switch r.Type {
		case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWRULE, unix.RTM_DELRULE:
			n++
		}
	}
	return n
}

func TestFakeCase01FreshNode(t *testing.T) {
	s := newFSeed(t, true)
	ops := s.pass(t, mtupolicy.ModeOn)
	if !hasOp(ops, netwatch.RuleAdd, nil) ||
		!hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool { return !o.Repair && o.Route.Dst == pfx("10.0.0.0/16") && o.Route.MTU == 1355 }) ||
		!hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool { return o.Repair && o.Route.MTU == 0 }) {
		t.Errorf("first pass lacks the table route, the rule or the repair:\n%s", opsString(ops))
	}
	if j := firstOp(ops, netwatch.RuleAdd); j < 0 || firstOp(ops, netwatch.RouteReplace) > j {
		t.Errorf("rule added before the table routes:\n%s", opsString(ops))
	}
	s.splitAt(t, "10.0.0.9", 1355)
	s.checkOurRuleOnly(t, netwatch.IPv4)
}

func TestFakeCase02Converged(t *testing.T) {
	s := newFSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)
	s.k.ResetRequests()
	if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
		t.Errorf("second pass planned:\n%s", opsString(ops))
	}
	if n := mutations(s.k); n != 0 {
		t.Errorf("second pass sent %d changes to the kernel", n)
	}
}

func TestFakeCase03RepairOnce(t *testing.T) {
	s := newFSeed(t, true)
	ops := s.pass(t, mtupolicy.ModeOn)
	if n := len(slices.DeleteFunc(slices.Clone(ops), func(o netwatch.Op) bool { return !o.Repair })); n != 1 {
		t.Errorf("first pass: %d repairs, want 1:\n%s", n, opsString(ops))
	}
	i := slices.IndexFunc(s.k.Snapshot().Routes, func(r netwatch.Route) bool { return r.Table == unix.RT_TABLE_MAIN && r.Dst == pfx("10.0.0.0/16") })
	if i < 0 || s.k.Snapshot().Routes[i].MTU != 0 {
		t.Errorf("main route not repaired (it keeps an MTU of its own): %+v", s.k.Snapshot().Routes)
	}
	for i := range 2 {
		if ops := s.pass(t, mtupolicy.ModeOn); hasOp(ops, netwatch.RouteReplace, isRepair) {
			t.Errorf("pass %d repaired again:\n%s", i+2, opsString(ops))
		}
	}
}

func TestFakeCase04OptedOut(t *testing.T) {
	s := newFSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)
	ops := s.pass(t, mtupolicy.ModeOff)
	if len(ops) == 0 || ops[0].Kind != netwatch.RuleDelete || !hasOp(ops, netwatch.RouteDelete, nil) ||
		hasOp(ops, netwatch.RouteReplace, nil) || hasOp(ops, netwatch.RuleAdd, nil) {
		t.Errorf("opting out: want the rule deleted first, then the table routes, nothing added:\n%s", opsString(ops))
	}
	s.unsplit(t)
}

func TestFakeCase05OptedOutClean(t *testing.T) {
	s := newFSeed(t, true)
	s.k.ResetRequests()
	if ops := s.pass(t, mtupolicy.ModeOff); len(ops) != 0 {
		t.Errorf("opted out with nothing owned planned:\n%s", opsString(ops))
	}
	if n := mutations(s.k); n != 0 {
		t.Errorf("%d changes sent", n)
	}
}

func TestFakeCase06ModeUnknown(t *testing.T) {
	s := newFSeed(t, true)
	s.k.ResetRequests()
	if ops := s.pass(t, mtupolicy.ModeUnknown); ops != nil {
		t.Errorf("unknown mode on a fresh node planned:\n%s", opsString(ops))
	}
	s.pass(t, mtupolicy.ModeOn)
	if err := s.k.SetLinkMTU(s.tun, 1420); err != nil {
		t.Fatal(err)
	}
	if err := s.k.AddRule(netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Mark: 0xd00, Mask: 0xf00}); err != nil {
		t.Fatal(err)
	}
	s.k.ResetRequests()
	if ops := s.pass(t, mtupolicy.ModeUnknown); ops != nil {
		t.Errorf("unknown mode planned:\n%s", opsString(ops))
	}
	if n := mutations(s.k); n != 0 {
		t.Errorf("unknown mode sent %d changes: %+v", n, s.k.Requests())
	}
}

func TestFakeCase07InterfaceBounce(t *testing.T) {
	s := newFSeed(t, true)
	var k modeKeeper
	s.pass(t, k.read(mtupolicy.ModeOn))
	if err := s.k.SetLinkUp(s.eth, false); err != nil {
		t.Fatal(err)
	}
	if err := s.k.SetLinkUp(s.eth, true); err != nil {
		t.Fatal(err)
	}
	s.dhcp(t, false)
	mode := k.read(mtupolicy.ModeUnknown)
	if mode != mtupolicy.ModeOn {
		t.Fatalf("kept mode %v, want on", mode)
	}
	ops := s.pass(t, mode)
	if !hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool { return o.Route.Table == 900 && o.Route.Dst == pfx("10.0.0.0/16") }) {
		t.Errorf("table not rebuilt after the bounce:\n%s", opsString(ops))
	}
	s.splitAt(t, "10.0.0.9", 1355)
	s.checkOurRuleOnly(t, netwatch.IPv4)
}

func TestFakeCase08TunnelGone(t *testing.T) {
	s := newFSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)
	if err := s.k.DelLink(s.tun); err != nil {
		t.Fatal(err)
	}
	ops := s.pass(t, mtupolicy.ModeOn)
	if len(ops) == 0 || ops[0].Kind != netwatch.RuleDelete || !hasOp(ops, netwatch.RouteDelete, nil) || hasOp(ops, netwatch.RouteReplace, nil) {
		t.Errorf("tunnel gone: want the rule, then the table routes removed:\n%s", opsString(ops))
	}
	s.unsplit(t)
}

func TestFakeCase09StrayRules(t *testing.T) {
	t.Run("strays", func(t *testing.T) {
		s := newFSeed(t, true)
		for _, r := range []netwatch.Rule{
			{Family: netwatch.IPv4, Priority: 900, Table: 900, Mark: 0xe00, Mask: 0xf00},
			{Family: netwatch.IPv4, Priority: 900, Table: 900, Invert: true, Mark: 0xd00, Mask: 0xf00},
			{Family: netwatch.IPv4, Priority: 900, Table: 901, Invert: true, Mark: 0xe00, Mask: 0xf00},
		} {
			if err := s.k.AddRule(r); err != nil {
				t.Fatal(err)
			}
		}
		waitRules(t, s.w, 3)
		s.sync(t)
		ops, ok, err := planNow(s.w, s.cfg, mtupolicy.ModeOn)
		if !ok || err != nil {
			t.Fatalf("plan: ok %v err %v", ok, err)
		}
		if res, err := s.a.Apply(ops); err != nil {
			t.Fatalf("apply: %v\n%+v", err, res)
		}
		s.checkOurRuleOnly(t, netwatch.IPv4) // after one pass
		settle(t, s.w, s.cfg, mtupolicy.ModeOn)
		s.splitAt(t, "10.0.0.9", 1355)
	})
	t.Run("duplicates", func(t *testing.T) {
		s := newFSeed(t, true)
		s.pass(t, mtupolicy.ModeOn)
		if err := s.k.AppendRule(netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: s.cfg.Protocol}); err != nil {
			t.Fatalf("add a duplicate rule: %v", err)
		}
		if rs := s.rules900(netwatch.IPv4); len(rs) != 2 {
			t.Fatalf("duplicate not added: %v", rs)
		}
		waitRules(t, s.w, 2)
		ops := s.pass(t, mtupolicy.ModeOn)
		if len(ops) != 1 || ops[0].Kind != netwatch.RuleDelete || ops[0].Rule != ourRule(s.cfg, netwatch.IPv4) {
			t.Errorf("two identical rules: want one rule delete:\n%s", opsString(ops))
		}
		s.checkOurRuleOnly(t, netwatch.IPv4)
	})
}

// waitRules waits until the view holds n IPv4 rules at priority 900.
func waitRules(t *testing.T, w *netwatch.Watcher, n int) {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		got := 0
		w.Read(func(v netwatch.View) {
			for r := range v.Rules(netwatch.IPv4) {
				if r.Priority == 900 {
					got++
				}
			}
		})
		if got == n {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("view holds %d rules at 900, want %d", got, n)
		case <-tick.C:
		}
	}
}

func TestFakeCase10StaleTableRoutes(t *testing.T) {
	s := newFSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)

	if err := s.k.SetLinkMTU(s.tun, 1420); err != nil {
		t.Fatal(err)
	}
	ops := s.pass(t, mtupolicy.ModeOn)
	if !hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool {
		return o.Route.Dst == pfx("10.0.0.0/16") && o.Route.MTU == 1420 && o.HasWas && o.Was.MTU == 1355
	}) {
		t.Errorf("tunnel MTU 1355 → 1420: table route not replaced:\n%s", opsString(ops))
	}
	s.splitAt(t, "10.0.0.9", 1420)

	narrow := s.cfg
	narrow.Prefixes = []netip.Prefix{pfx("10.0.0.1/32")}
	s.sync(t)
	ops = livePass(t, s.w, s.a, narrow, mtupolicy.ModeOn)
	if len(ops) != 1 || ops[0].Kind != netwatch.RouteDelete || ops[0].Route.Dst != pfx("10.0.0.0/16") {
		t.Errorf("prefix no longer selected: want its table route dropped:\n%s", opsString(ops))
	}
	if slices.ContainsFunc(s.k.Snapshot().Routes, func(r netwatch.Route) bool { return r.Table == 900 && r.Dst == pfx("10.0.0.0/16") }) {
		t.Errorf("table route 10.0.0.0/16 kept: %+v", s.k.Snapshot().Routes)
	}

	s.pass(t, mtupolicy.ModeOn)
	if err := s.k.ReplaceRoute(netwatch.Route{Dst: pfx("10.0.0.0/16"), Gateway: addr("10.0.0.2"), Index: s.eth, PrefSrc: addr("10.0.0.5"), Protocol: protoDHCP, MTU: 1450}); err != nil {
		t.Fatal(err)
	}
	ops = s.pass(t, mtupolicy.ModeOn)
	if !hasOp(ops, netwatch.RouteReplace, func(o netwatch.Op) bool {
		return o.Route.Dst == pfx("10.0.0.0/16") && o.Route.Gateway == addr("10.0.0.2") && o.HasWas && o.Was.Gateway == addr("10.0.0.1")
	}) {
		t.Errorf("gateway changed: table route not replaced:\n%s", opsString(ops))
	}
	i := slices.IndexFunc(s.k.Snapshot().Routes, func(r netwatch.Route) bool { return r.Table == 900 && r.Dst == pfx("10.0.0.0/16") })
	if i < 0 || s.k.Snapshot().Routes[i].Gateway != addr("10.0.0.2") || s.k.Snapshot().Routes[i].MTU != 1420 {
		t.Errorf("table 900 after the gateway change: %+v", s.k.Snapshot().Routes)
	}
}

func TestFakeCase11NotSynced(t *testing.T) {
	k := netwatchtest.New()
	t.Cleanup(func() { k.Close() })
	eth := k.AddLink("enp7s0", "veth", 1450, true)
	k.AddLink("cilium_wg0", "tun", 1355, true)
	if err := k.AddAddr(eth, pfx("10.0.0.5/16")); err != nil {
		t.Fatal(err)
	}
	if err := k.AddRoute(netwatch.Route{Dst: pfx("10.0.0.0/16"), Gateway: addr("10.0.0.1"), Index: eth, MTU: 1355}); err != nil {
		t.Fatal(err)
	}
	k.FailAll(unix.RTM_GETROUTE, unix.EIO)
	opts := netwatch.Options{NetNS: k.NetNS()}
	w := runWatcher(t, opts)
	a := dialApplier(t, opts)
	cfg := mtupolicy.DefaultConfig()
	cfg.Prefixes = []netip.Prefix{pfx("10.0.0.0/16")}
	// Wait until the route listing has failed a few times.
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for w.Stats().Reconnects < 3 {
		select {
		case <-deadline.C:
			t.Fatalf("route listing never failed: %+v", w.Stats())
		case <-tick.C:
		}
	}
	k.ResetRequests()
	for _, mode := range []mtupolicy.Mode{mtupolicy.ModeOn, mtupolicy.ModeOff} {
		w.Read(func(v netwatch.View) {
			if v.Synced() {
				t.Fatalf("view synced although every route listing fails")
			}
			if _, ok := mtupolicy.Desired(v, cfg, mode); ok {
				t.Errorf("Desired on an unsynced view (mode %v): ok", mode)
			}
			own := reconcile.Desired{Own: reconcile.Own(900, 0).Only(netwatch.IPv4)}
			if ops, err := reconcile.Plan(v, own); !errors.Is(err, reconcile.ErrNotSynced) || ops != nil {
				t.Errorf("Plan on an unsynced view: %v, %v; want ErrNotSynced and nothing", ops, err)
			}
		})
		if ops := livePass(t, w, a, cfg, mode); ops != nil {
			t.Errorf("pass on an unsynced view (mode %v) planned:\n%s", mode, opsString(ops))
		}
	}
	if n := mutations(k); n != 0 {
		t.Errorf("%d changes sent while the listing fails", n)
	}
	if rs := k.Snapshot().Rules; slices.ContainsFunc(rs, func(r netwatch.Rule) bool { return r.Priority == 900 }) {
		t.Errorf("rule installed: %v", rs)
	}
	i := slices.IndexFunc(k.Snapshot().Routes, func(r netwatch.Route) bool { return r.Dst == pfx("10.0.0.0/16") && r.Table == unix.RT_TABLE_MAIN })
	if i < 0 || k.Snapshot().Routes[i].MTU != 1355 {
		t.Errorf("main route repaired while the listing fails: %+v", k.Snapshot().Routes)
	}
}

func TestFakeCase12KernelFlags(t *testing.T) {
	t.Run("no MTU attribute", func(t *testing.T) {
		s := newFSeed(t, false)
		ops := s.pass(t, mtupolicy.ModeOn)
		if hasOp(ops, netwatch.RouteReplace, isRepair) || !hasOp(ops, netwatch.RuleAdd, nil) {
			t.Errorf("main route without MTU: want a split and no repair:\n%s", opsString(ops))
		}
		s.splitAt(t, "10.0.0.9", 1355)
		if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
			t.Errorf("second pass planned:\n%s", opsString(ops))
		}
	})
	t.Run("linkdown", func(t *testing.T) {
		t.Skip("the fake does not model carrier (an up link has carrier), so no route is flagged linkdown; TestKernelCase12KernelFlags covers it")
	})
}

func TestFakeCase13Families(t *testing.T) {
	s := newFSeed(t, true)
	if err := s.k.AddAddr(s.eth, pfx("fd00::5/64")); err != nil {
		t.Fatal(err)
	}
	for _, r := range []netwatch.Route{
		{Dst: pfx("fd00::1/128"), Index: s.eth, Protocol: protoDHCP},
		{Dst: pfx("fd00::/64"), Gateway: addr("fd00::1"), Index: s.eth, Protocol: protoDHCP, MTU: 1355},
	} {
		if err := s.k.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	s.cfg.Prefixes = append(s.cfg.Prefixes, pfx("fd00::/64"))
	ops := s.pass(t, mtupolicy.ModeOn)
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		if !hasOp(ops, netwatch.RuleAdd, func(o netwatch.Op) bool { return o.Rule == ourRule(s.cfg, f) }) {
			t.Errorf("no rule added for %v:\n%s", f, opsString(ops))
		}
	}
	s.checkOurRuleOnly(t, netwatch.IPv4)
	s.checkOurRuleOnly(t, netwatch.IPv6)
	s.splitAt(t, "10.0.0.9", 1355)
	for _, want := range []struct {
		table   netwatch.Table
		mtu     uint32
		prefSrc netip.Addr
	}{{900, 1355, addr("fd00::5")}, {unix.RT_TABLE_MAIN, 0, netip.Addr{}}} {
		if !slices.ContainsFunc(s.k.Snapshot().Routes, func(r netwatch.Route) bool {
			return r.Table == want.table && r.Dst == pfx("fd00::/64") && r.Gateway == addr("fd00::1") && r.Index == s.eth && r.MTU == want.mtu && r.PrefSrc == want.prefSrc
		}) {
			t.Errorf("no route fd00::/64 via fd00::1 table %d mtu %d (0: none) src %v in the fake kernel: %v", want.table, want.mtu, want.prefSrc, s.k.Snapshot().Routes)
		}
	}
	if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
		t.Errorf("second pass planned:\n%s", opsString(ops))
	}
	t.Run("RouteGet IPv6", func(t *testing.T) {
		s.splitAt(t, "fd00::9", 1355)
	})
}
