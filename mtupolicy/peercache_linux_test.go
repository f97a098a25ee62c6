//go:build linux

package mtupolicy_test

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// TestPeerCache: on a watcher's views, a PeerCache answers what
// DesiredPeers answers at every step, and walks the main table again only
// after a change of it: its own routes being added, a route of another
// table, a new link cost no walk; a main route added or removed, or the
// kernel's silent flush of a link's routes (a re-dump's finding), do.
func TestPeerCache(t *testing.T) {
	s := newFSeed(t, false)
	cfg := s.cfg
	cfg.Prefixes, cfg.Peers = nil, true
	peers := []netip.Addr{addr("10.0.3.7"), addr("10.0.4.1"), addr("192.0.2.9")}
	var c mtupolicy.PeerCache
	step := func(what string, walk int) { // walk: 1 must, 0 must not, -1 may
		t.Helper()
		s.sync(t)
		s.w.Read(func(v netwatch.View) {
			before := c.Walks()
			got, gok := c.DesiredPeers(v, cfg, mtupolicy.ModeOn, peers, nil)
			want, wok := mtupolicy.DesiredPeers(v, cfg, mtupolicy.ModeOn, peers, nil)
			if gok != wok || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: the cache's answer differs from DesiredPeers'\n got %v %+v\nwant %v %+v", what, gok, got, wok, want)
			}
			if walked := c.Walks() - before; walk >= 0 && (walked > 0) != (walk == 1) {
				t.Errorf("%s: %d walks of the main table, want them: %v", what, walked, walk == 1)
			}
		})
	}
	step("first pass", 1)
	step("nothing changed", 0)
	var ops []netwatch.Op
	var err error
	s.w.Read(func(v netwatch.View) {
		d, _ := mtupolicy.DesiredPeers(v, cfg, mtupolicy.ModeOn, peers, nil)
		ops, err = reconcile.Plan(v, d)
	})
	if err != nil || len(ops) == 0 {
		t.Fatalf("the peer policy plans %v (%v), want its routes and rule", ops, err)
	}
	if _, err := s.a.Apply(ops); err != nil {
		t.Fatal(err)
	}
	step("its own routes and rule installed", 0)
	s.k.AddLink("lxc1", "veth", 1500, true)
	step("a pod's veth", 0)
	if err := s.k.AddRoute(netwatch.Route{Table: 100, Dst: pfx("192.0.2.0/24"), Gateway: addr("10.0.0.1"), Index: s.eth}); err != nil {
		t.Fatal(err)
	}
	step("a route in table 100", 0)
	r := netwatch.Route{Table: 254, Dst: pfx("192.0.2.0/24"), Gateway: addr("10.0.0.1"), Index: s.eth, Protocol: protoDHCP}
	if err := s.k.AddRoute(r); err != nil {
		t.Fatal(err)
	}
	step("a main route to a peer", 1)
	if err := s.k.DelRoute(r); err != nil {
		t.Fatal(err)
	}
	step("the main route deleted", 1)
	if err := s.k.SetLinkUp(s.eth, false); err != nil {
		t.Fatal(err)
	}
	step("the underlay down: its IPv4 routes flushed without events", 1)
	step("after the flush", -1) // the finding's journal entry may come now
	if err := s.k.SetLinkUp(s.eth, true); err != nil {
		t.Fatal(err)
	}
	s.dhcp(t, false)
	step("the underlay back", 1)
	s.k.AddLink("lxc2", "veth", 1500, true)
	step("another pod's veth", 0)
}

// TestPeerCacheSnapshot: a Snapshot's view has no journal, so a PeerCache
// walks the main table every time.
func TestPeerCacheSnapshot(t *testing.T) {
	v := node().View()
	var c mtupolicy.PeerCache
	c.DesiredPeers(v, peerConfig(), mtupolicy.ModeOn, []netip.Addr{addr("10.0.3.7")}, nil)
	first := c.Walks()
	c.DesiredPeers(v, peerConfig(), mtupolicy.ModeOn, []netip.Addr{addr("10.0.3.7")}, nil)
	if first == 0 || c.Walks() != 2*first {
		t.Errorf("%d walks for one pass, %d for two, on a Snapshot's view: want it walked every time", first, c.Walks())
	}
}

// BenchmarkPeerCache: a pass of the peer policy with 50 peers, 1,000 and
// 100,000 main routes in the fake kernel, when the main table did not
// change since the last pass (PeerCache), against one that walks it
// (DesiredPeers).
func BenchmarkPeerCache(b *testing.B) {
	var peers []netip.Addr
	for i := range 50 {
		peers = append(peers, netip.AddrFrom4([4]byte{10, 0, 20, byte(1 + i)}))
	}
	for _, n := range []int{1000, 100000} {
		k := netwatchtest.New()
		eth := k.AddLink("enp7s0", "veth", 1450, true)
		if err := k.AddAddr(eth, pfx("10.0.0.5/16")); err != nil {
			b.Fatal(err)
		}
		k.AddLink("cilium_wg0", "tun", 1355, true)
		for i := range n {
			if err := k.AddRoute(netwatch.Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)}), 32),
				Gateway: addr("10.0.0.1"), Index: eth, Protocol: 186}); err != nil {
				b.Fatal(err)
			}
		}
		w := netwatch.New(netwatch.Options{NetNS: k.NetNS()})
		ctx, cancel := context.WithCancel(context.Background())
		go w.Run(ctx)
		if err := w.WaitSynced(ctx); err != nil {
			b.Fatal(err)
		}
		cfg := peerConfig()
		w.Read(func(v netwatch.View) {
			b.Run(fmt.Sprintf("routes=%d/walk", n), func(b *testing.B) {
				for b.Loop() {
					mtupolicy.DesiredPeers(v, cfg, mtupolicy.ModeOn, peers, nil)
				}
			})
			b.Run(fmt.Sprintf("routes=%d/cached", n), func(b *testing.B) {
				var c mtupolicy.PeerCache
				for b.Loop() {
					c.DesiredPeers(v, cfg, mtupolicy.ModeOn, peers, nil)
				}
				if c.Walks() > 2 {
					b.Fatalf("%d walks of an unchanged main table", c.Walks())
				}
			})
		})
		cancel()
		k.Close()
	}
}
