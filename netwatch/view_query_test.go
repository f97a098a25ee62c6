package netwatch

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestRoutesWithin: usesLink counts right, and RoutesWithin yields exactly the routes whose
// destination lies inside the prefix, as a walk of the table finds them,
// whatever the table's history: keys in and out of order (the store's
// array and side map), deleted entries, routes sharing a key, routes that
// do not fit the compact form.
func TestRoutesWithin(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := rapid.SampledFrom([]Family{IPv4, IPv6}).Draw(t, "family")
		// Destinations from a small space, so that they nest and collide.
		prefix := func(name string) netip.Prefix {
			b := rapid.SliceOfN(rapid.SampledFrom([]byte{0, 10, 11, 0x80, 0xff}), 2, 2).Draw(t, name)
			var a netip.Addr
			if f == IPv4 {
				a = netip.AddrFrom4([4]byte{b[0], b[1], 0, 0})
			} else {
				a = netip.AddrFrom16([16]byte{0x20, 0x01, b[0], b[1]})
			}
			return netip.PrefixFrom(a, rapid.IntRange(0, a.BitLen()).Draw(t, name+" bits")).Masked()
		}
		// Link indexes small and large: "ip link add … index N" takes
		// any up to 2^31-1, and a count must not grow with the index.
		links := []uint32{1, 2, denseLinks, 1<<31 - 1}
		index := func(name string) uint32 { return rapid.SampledFrom(links).Draw(t, name) }
		st := newState()
		for i := range rapid.IntRange(0, 200).Draw(t, "routes") {
			r := Route{Family: f, Table: 900, Dst: prefix("dst"), Metric: rapid.Uint32Range(0, 2).Draw(t, "metric"),
				Index: index("index"), Type: RouteUnicast, Protocol: ProtoStatic}
			if rapid.IntRange(0, 9).Draw(t, "multipath") == 0 {
				r.Index = 0
				r.NextHops = []NextHop{{Index: index("hop1"), Weight: 1},
					{Index: index("hop2"), Weight: 1}}
			}
			if f == IPv4 {
				r.TOS = rapid.SampledFrom([]uint8{0, 0x10}).Draw(t, "tos")
			} else {
				r.Src = rapid.SampledFrom([]netip.Prefix{{}, {}, netip.MustParsePrefix("::/0"), netip.MustParsePrefix("fd00::/8")}).Draw(t, "src")
			}
			if rapid.IntRange(0, 9).Draw(t, "extra") == 0 {
				r.Flow = uint32(i) // does not fit the compact form
			}
			tb := st.table(f, 900, true)
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0: // a dump's append
				st.addDumped(r)
			case 1:
				tb.setAll(r.Key(), []Route{r})
			case 2: // a second route of the key
				tb.setAll(r.Key(), append(tb.getAll(r.Key()), r))
			case 3:
				tb.setAll(r.Key(), nil)
			}
		}
		v := View{s: st}
		// The table's count of routes by link agrees with a walk.
		for _, idx := range append(links, 3, denseLinks+1) {
			walked := false
			for r := range v.Routes(f, 900) {
				if r.Index == idx || slices.ContainsFunc(r.NextHops, func(h NextHop) bool { return h.Index == idx }) {
					walked = true
				}
			}
			if tb := st.table(f, 900, false); tb != nil && tb.usesLink(idx) != walked {
				t.Fatalf("usesLink(%d) = %v, a walk says %v", idx, tb.usesLink(idx), walked)
			}
		}
		p := prefix("p")
		var want []Route
		for r := range v.Routes(f, 900) {
			if r.Dst.Bits() >= p.Bits() && p.Contains(r.Dst.Addr()) {
				want = append(want, r)
			}
		}
		got := slices.Collect(v.RoutesWithin(900, p))
		slices.SortStableFunc(want, compareRoutes)
		slices.SortStableFunc(got, compareRoutes)
		if !slices.EqualFunc(got, want, Route.Equal) {
			t.Fatalf("RoutesWithin(%v):\n got %v\nwant %v", p, got, want)
		}
		// Covering finds what a walk finds: the routes of the longest
		// destination that contains the address.
		a := p.Addr()
		if rapid.Bool().Draw(t, "host bits") {
			b := a.AsSlice()
			b[len(b)-1] = 7
			a, _ = netip.AddrFromSlice(b)
		}
		want = nil
		for r := range v.Routes(f, 900) {
			switch {
			case !r.Dst.Contains(a) || len(want) > 0 && r.Dst.Bits() < want[0].Dst.Bits():
			case len(want) > 0 && r.Dst.Bits() > want[0].Dst.Bits():
				want = []Route{r}
			default:
				want = append(want, r)
			}
		}
		slices.SortStableFunc(want, func(a, b Route) int { return cmp.Or(cmp.Compare(a.Metric, b.Metric), compareRoutes(a, b)) })
		if got := v.Covering(900, a); !slices.EqualFunc(got, want, Route.Equal) {
			t.Fatalf("Covering(%v):\n got %v\nwant %v", a, got, want)
		}
	})
}

// BenchmarkCovering looks up addresses in a table of 1,000,000 IPv4 /24s
// and a default route, beside a walk of the table for the same answer:
// the lookup is a binary search per prefix length.
func BenchmarkCovering(b *testing.B) {
	st := newState()
	st.addDumped(Route{Family: IPv4, Table: TableMain, Dst: netip.MustParsePrefix("0.0.0.0/0"), Index: 2, Type: RouteUnicast})
	for i := range 1_000_000 {
		st.addDumped(Route{Family: IPv4, Table: TableMain, Index: 2, Type: RouteUnicast,
			Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(11 + i>>16), byte(i >> 8), byte(i), 0}), 24)})
	}
	v := View{s: st}
	addrs := []netip.Addr{netip.MustParseAddr("11.0.7.9"), netip.MustParseAddr("20.1.2.3"), netip.MustParseAddr("200.0.0.1")}
	b.Run("Covering", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if rs := v.Covering(TableMain, addrs[i%len(addrs)]); len(rs) != 1 {
				b.Fatalf("%d routes", len(rs))
			}
		}
	})
	b.Run("walk", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			a, best := addrs[i%len(addrs)], -1
			for r := range v.Routes(IPv4, TableMain) {
				if r.Dst.Contains(a) && r.Dst.Bits() > best {
					best = r.Dst.Bits()
				}
			}
			if best < 0 {
				b.Fatal("none")
			}
		}
	})
}

// BenchmarkCoveringSideMap looks up an address in a table of 100,000
// dumped IPv4 /24s and a default route after n more /24s arrived as events
// that do not sort last, which wait in the store's side map until a
// compaction (up to a quarter of the table): the side map is read once a
// lookup, not once per prefix length (n=0 is the reference).
func BenchmarkCoveringSideMap(b *testing.B) {
	for _, n := range []int{0, 1000, 24000} {
		st := newState()
		st.addDumped(Route{Family: IPv4, Table: TableMain, Dst: netip.MustParsePrefix("0.0.0.0/0"), Index: 2, Type: RouteUnicast})
		for i := range 100_000 {
			st.addDumped(Route{Family: IPv4, Table: TableMain, Index: 2, Type: RouteUnicast,
				Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(20 + i>>16), byte(i >> 8), byte(i), 0}), 24)})
		}
		for i := range n {
			r := Route{Family: IPv4, Table: TableMain, Index: 2, Type: RouteUnicast,
				Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 8), byte(i), 0}), 24)}
			st.applyRoute(&change{Event: Event{Kind: KindRoute, Route: r}})
		}
		if tb := st.table(IPv4, TableMain, false); len(tb.m4.added) != n {
			b.Fatalf("side map holds %d routes, want %d", len(tb.m4.added), n)
		}
		v := View{s: st}
		a := netip.MustParseAddr("200.0.0.1")
		b.Run(fmt.Sprintf("side=%d", n), func(b *testing.B) {
			for b.Loop() {
				if rs := v.Covering(TableMain, a); len(rs) != 1 {
					b.Fatalf("%d routes", len(rs))
				}
			}
		})
	}
}
