//go:build linux

package main

import (
	"net/netip"
	"testing"

	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/mtupolicy"
)

// The learner turns an exception on the route to a peer into a learned
// value (P = 1300: inner 1232), ignores one to an address that is no
// peer's, deletes what it read, and reading the same exception again
// changes nothing.
func TestLearner(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarnessCfg(t, k, peersConfig())
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.l.setPeers(peers("10.0.0.9", "10.0.0.11"))
	h.waitPass("that splits the peers", applied(4))
	h.takeLines()
	h.waitConverged()
	es := []pathmtu.Exception{
		{Dst: netip.MustParseAddr("10.0.0.9"), Table: 254, MTU: 1300},
		{Dst: netip.MustParseAddr("10.0.0.77"), Table: 254, MTU: 1200},
	}
	var deleted []netip.Addr
	lr := &learner{l: h.l, dump: func() ([]pathmtu.Exception, error) { return es, nil },
		del: func(e pathmtu.Exception) error { deleted = append(deleted, e.Dst); return nil }}
	lr.learn()
	h.waitPass("that lowers the peer", applied(1))
	if got := h.takeLines(); len(got) != 1 || got[0] != "table 900: 10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1232 (was 1355)" {
		t.Errorf("lines: %q", got)
	}
	if v := h.l.pmtu.Get(netip.MustParseAddr("10.0.0.9")); v.Path != 1300 || v.Source != pathmtu.SourceLearned {
		t.Errorf("10.0.0.9: %+v", v)
	}
	if len(deleted) != 1 || deleted[0] != netip.MustParseAddr("10.0.0.9") {
		t.Errorf("deleted %v, want 10.0.0.9", deleted)
	}
	h.waitConverged()
	before := h.l.pmtu.Get(netip.MustParseAddr("10.0.0.9"))
	lr.learn() // the same again: confirmed (its age starts again), not changed
	if after := h.l.pmtu.Get(netip.MustParseAddr("10.0.0.9")); after.Path != before.Path || after.Since != before.Since || after.Source != before.Source {
		t.Errorf("read again: %+v, was %+v", after, before)
	}
	if v := h.l.pmtu.Get(netip.MustParseAddr("10.0.0.77")); v.Source != pathmtu.SourceNone {
		t.Errorf("no peer's address learned: %+v", v)
	}
}

func TestSNMP6Value(t *testing.T) {
	b := []byte("Icmp6InMsgs                     \t5\nIcmp6InPktTooBigs               \t3\n")
	if got := snmp6Value(b, "Icmp6InPktTooBigs"); got != 3 {
		t.Errorf("snmp6Value = %d, want 3", got)
	}
}
