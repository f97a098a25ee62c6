//go:build linux

package main

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
)

// A declared path MTU gives the peer's host route its inner MTU from the
// first pass; a learned lower value takes effect at once; the metrics count
// the peers by state and name the smallest inner MTU.
func TestLoopPeersPathMTU(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarnessCfg(t, k, peersConfig())
	var declared pathmtu.DeclaredList
	must(t, declared.Set("10.0.0.9/32=1368"))
	h.l.pmtu = pathmtu.NewStore(declared)
	h.met.addPathMTU(h.l)
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.l.setPeers(peers("10.0.0.9", "10.0.0.11"))
	h.waitPass("that splits the peers", applied(4))
	want := []string{
		"table 900: 10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1296", // floor16(1368 − 60)
		"table 900: 10.0.0.11 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
		"rule 900: not fwmark 0xe00/0xf00 lookup 900",
		"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	h.waitConverged()

	// ICMP says the path to 10.0.0.11 carries 1296 bytes: at once.
	c, ok := h.l.pmtu.Observe(netip.MustParseAddr("10.0.0.11"), 1296, pathmtu.SourceLearned)
	if !ok || c.Direction() != "lower" {
		t.Fatalf("Observe: %+v, %v", c, ok)
	}
	h.l.pathChanged([]pathmtu.Change{c})
	h.waitPass("that lowers the learned peer", applied(1))
	want = []string{"table 900: 10.0.0.11 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1232 (was 1355)"}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	h.waitConverged()
	if got := metricValue(t, h.met, "marksplit_path_mtu_peers", "reduced"); got != 2 {
		t.Errorf("peers reduced = %v, want 2", got)
	}
	if got := metricValue(t, h.met, "marksplit_path_mtu_smallest_inner_bytes", ""); got != 1232 {
		t.Errorf("smallest inner MTU = %v, want 1232", got)
	}
	for _, src := range []string{"declared", "learned"} {
		var pb dto.Metric
		must(t, h.met.pathChanges.WithLabelValues("lower", src).Write(&pb))
		if got := pb.GetCounter().GetValue(); got != 1 {
			t.Errorf("changes lower %s = %v, want 1", src, got)
		}
	}
	if got := h.l.belowMinimum(); got != "" {
		t.Errorf("below the minimum: %q", got)
	}
}

// A path whose inner MTU would fall below IPv6's minimum: the peer's route
// keeps the tunnel MTU (no value is installed), a warning Event names the
// peer, and the Node condition turns False with the reason
// PathMTUBelowMinimum, naming it too; an IPv4 peer at the same path size
// is installed (1232 is above IPv4's minimum).
func TestLoopPathBelowMinimum(t *testing.T) {
	k, enp, _ := seedKernel(t)
	must(t, k.AddAddr(enp, netip.MustParsePrefix("fd00::5/64")))
	must(t, k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("fd00:1::/48"), Gateway: netip.MustParseAddr("fd00::1"),
		Index: enp, Protocol: unix.RTPROT_STATIC}))
	h := newHarnessCfg(t, k, peersConfig())
	h.met.addPathMTU(h.l)
	ev, recorded := capture()
	var evMu sync.Mutex // the loop records from its goroutine
	record := ev.recordGroup
	ev.recordGroup = func(group, typ, reason, action, note string) {
		evMu.Lock()
		defer evMu.Unlock()
		record(group, typ, reason, action, note)
	}
	events := func() []string {
		evMu.Lock()
		defer evMu.Unlock()
		return slices.Clone(*recorded)
	}
	h.l.ev = ev
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.l.setPeers(peers("10.0.0.9", "fd00:1::9"))
	h.waitPass("that splits the peers", func(p reconcile.Pass) bool { return len(p.Applied) > 0 })
	h.waitConverged()
	h.takeLines()
	before := len(events())

	v4, v6 := netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("fd00:1::9")
	var cs []pathmtu.Change
	for _, a := range []netip.Addr{v4, v6} {
		c, ok := h.l.pmtu.Observe(a, 1296, pathmtu.SourceLearned) // inner 1232 on IPv4, 1216 on IPv6
		if !ok {
			t.Fatalf("Observe %v: no change", a)
		}
		cs = append(cs, c)
	}
	h.l.pathChanged(cs)
	h.waitPass("that lowers the IPv4 peer", applied(1))
	want := []string{"table 900: 10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1232 (was 1355)"}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	h.waitConverged()
	for _, r := range k.Snapshot().Routes {
		if r.Table == 900 && r.Dst == netip.PrefixFrom(v6, 128) && r.MTU != 1355 {
			t.Errorf("the IPv6 peer's route carries %d, want the tunnel's 1355: %v", r.MTU, r)
		}
	}
	if got := events()[before:]; len(got) != 1 || !strings.HasPrefix(got[0], "Warning PathMTUBelowMinimum") || !strings.Contains(got[0], "peer fd00:1::9 ") {
		t.Errorf("events %q: want one Warning PathMTUBelowMinimum naming fd00:1::9", got)
	}
	s, write := conditionState(passFacts{planned: true, converged: true, mode: mtupolicy.ModeOn, tunnel: true, rule: true,
		cfg: h.l.cfg, pathBelow: h.l.belowMinimum()})
	if !write || s.Status || s.Reason != condPathBelowMin || !strings.Contains(s.Message, "peer fd00:1::9 ") {
		t.Errorf("condition %+v (write %v): want False, %s, naming fd00:1::9", s, write, condPathBelowMin)
	}
	if got := metricValue(t, h.met, "marksplit_path_mtu_peers", "below_minimum"); got != 1 {
		t.Errorf("peers below_minimum = %v, want 1", got)
	}
}
