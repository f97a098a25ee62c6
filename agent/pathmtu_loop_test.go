//go:build linux

package main

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/mtupolicy"
	dto "github.com/prometheus/client_model/go"
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
