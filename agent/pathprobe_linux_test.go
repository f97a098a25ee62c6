//go:build linux

package main

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/internal/pathprobe"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// A search's result lowers the peer's route at once; an unreachable peer
// and a failed search change nothing; probes and searches are counted.
func TestProberDeliver(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarnessCfg(t, k, peersConfig())
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.l.setPeers(peers("10.0.0.9", "10.0.0.11"))
	h.waitPass("that splits the peers", applied(4))
	h.takeLines()
	h.waitConverged()
	pr := &prober{l: h.l,
		searches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "s"}, []string{"result"}),
		probes:   prometheus.NewCounter(prometheus.CounterOpts{Name: "p"})}
	p9, p11 := netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("10.0.0.11")
	pr.deliver(pathprobe.Result{Peer: p11, Unreachable: true, Probes: 6}, nil)
	pr.deliver(pathprobe.Result{Peer: p11}, errors.New("no socket"))
	if v := h.l.pmtu.Get(p11); v.Source != pathmtu.SourceNone {
		t.Errorf("unreachable or failed changed the value: %+v", v)
	}
	pr.deliver(pathprobe.Result{Peer: p9, PathMTU: 1368, Probes: 20}, nil)
	h.waitPass("that lowers the probed peer", applied(1))
	if got := h.takeLines(); len(got) != 1 || got[0] != "table 900: 10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1296 (was 1355)" {
		t.Errorf("lines: %q", got)
	}
	var m dto.Metric
	must(t, pr.probes.Write(&m))
	if m.GetCounter().GetValue() != 26 {
		t.Errorf("probes %v, want 26", m.GetCounter().GetValue())
	}
	for r, want := range map[string]float64{"found": 1, "unreachable": 1, "failed": 1} {
		var m dto.Metric
		must(t, pr.searches.WithLabelValues(r).Write(&m))
		if m.GetCounter().GetValue() != want {
			t.Errorf("searches %s = %v, want %v", r, m.GetCounter().GetValue(), want)
		}
	}
}
