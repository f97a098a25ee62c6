package netwatch

import (
	"cmp"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp/cmpopts"

	gocmp "github.com/google/go-cmp/cmp"
)

// routeSetOrder is the order RouteSet documents: family, table, longer
// prefixes first, then RouteKey.Compare.
func routeSetOrder(a, b Route) int {
	ka, kb := a.Key(), b.Key()
	return cmp.Or(cmp.Compare(ka.Family, kb.Family), cmp.Compare(ka.Table, kb.Table),
		-cmp.Compare(ka.Dst.Bits(), kb.Dst.Bits()), ka.Compare(kb))
}

// randomRoutes returns n routes of both families, some sharing keys, some
// that do not fit a compact entry, some of no valid family.
func randomRoutes(rng *rand.Rand, n int) []Route {
	var rs []Route
	for range n {
		r := Route{Table: Table(900 + rng.IntN(2)), Type: RouteUnicast, Index: uint32(1 + rng.IntN(4)),
			Metric: uint32(rng.IntN(3)), Protocol: ProtoStatic, MTU: uint32(rng.IntN(2) * 1355)}
		switch rng.IntN(10) {
		case 0:
			// Not masked: kept as given.
			r.Family, r.Dst = IPv4, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), 0, 0}), 8+rng.IntN(3)*8)
		case 1:
			r.Family, r.Dst = Family(7), netip.MustParsePrefix("10.1.0.0/16")
		case 2, 3, 4:
			a := [16]byte{0x20, 0x01, 0xd, 0xb8, byte(rng.IntN(4)), byte(rng.IntN(4))}
			r.Family, r.Dst = IPv6, netip.PrefixFrom(netip.AddrFrom16(a), 32+rng.IntN(3)*16).Masked()
			if rng.IntN(4) == 0 {
				r.Src = netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, byte(rng.IntN(2))}), 16)
			}
			r.Gateway = netip.MustParseAddr("fe80::1")
		default:
			r.Family = IPv4
			r.Dst = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(4)), 0}), 8+rng.IntN(3)*8).Masked()
			r.TOS = uint8(rng.IntN(2)) * 4
			r.Gateway = netip.MustParseAddr("192.0.2.1")
		}
		switch rng.IntN(8) {
		case 0:
			r.Metrics.Locks = lockMTU
		case 1:
			r.Expires = time.Unix(1e9, 0)
		}
		switch rng.IntN(16) {
		case 0:
			// Not a key the kernel has: kept whole, by the whole key.
			if r.Family == IPv4 {
				r.Src = netip.MustParsePrefix("10.9.0.0/16")
			} else {
				r.TOS = 4
			}
		case 1:
			r.Metric = 0 // IPv6's is 1024
		}
		rs = append(rs, r)
	}
	return rs
}

// setGroup is where RouteSet puts r: with the IPv4 keys, the IPv6 keys,
// or kept whole after them.
func setGroup(r Route) int {
	switch {
	case r.Family == IPv4 && r.Dst.Addr().Is4() && !r.Src.IsValid():
		return 0
	case r.Family == IPv6 && r.Dst.Addr().Is6() && (!r.Src.IsValid() || r.Src.Addr().Is6()) && r.TOS == 0:
		return 1
	}
	return 2
}

// TestRouteSet compares a RouteSet with the obvious model: of each key,
// the first route added, Clean, and the first after it that differs, in
// the documented order.
func TestRouteSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		rs := randomRoutes(rng, 1+rng.IntN(300))
		var s RouteSet
		held := map[RouteKey][]Route{}
		count := 0
		for i, r := range rs {
			s.Add(r)
			r = r.Clean()
			if h := held[r.Key()]; len(h) == 0 || len(h) == 1 && !h[0].Equal(r) {
				held[r.Key()] = append(h, r)
				count++
			}
			if i == len(rs)/2 {
				// Reads between adds see what was added so far.
				if s.Len() != count {
					t.Fatalf("round %d: Len %d after %d adds, want %d", round, s.Len(), i+1, count)
				}
			}
		}
		var want []Route
		for _, h := range held {
			want = append(want, h...)
		}
		slices.SortStableFunc(want, func(a, b Route) int {
			if c := cmp.Compare(setGroup(a), setGroup(b)); c != 0 || setGroup(a) == 2 {
				return cmp.Or(c, a.Key().Compare(b.Key()))
			}
			return routeSetOrder(a, b)
		})
		// The two routes of a key in the order added.
		for i := 1; i < len(want); i++ {
			if h := held[want[i].Key()]; len(h) == 2 && want[i-1].Key() == want[i].Key() {
				want[i-1], want[i] = h[0], h[1]
			}
		}
		got := slices.Collect(s.All())
		if diff := gocmp.Diff(want, got, cmpopts.EquateComparable(netip.Prefix{}, netip.Addr{})); diff != "" {
			t.Fatalf("round %d: All differs from the model (-want +got):\n%s", round, diff)
		}
		for i, w := range want {
			if r, ok := s.Get(w.Key()); !ok || !r.Equal(held[w.Key()][0]) {
				t.Fatalf("round %d: Get(%v) = %v, %v; want %v", round, w.Key(), r, ok, held[w.Key()][0])
			}
			if r := s.At(i); !r.Equal(w) {
				t.Fatalf("round %d: At(%d) = %v, want %v", round, i, r, w)
			}
		}
		missing := RouteKey{Family: IPv4, Table: 901, Dst: netip.MustParsePrefix("198.51.100.0/24")}
		if r, ok := s.Get(missing); ok {
			t.Fatalf("round %d: Get(%v) found %v", round, missing, r)
		}
	}
}

// TestRouteSetKeysApart: routes whose keys the kernel tells apart, or
// that differ where it has no key (an IPv4 source, an IPv6 TOS), are
// never one route of the set (issue 38 D4).
func TestRouteSetKeysApart(t *testing.T) {
	r4 := Route{Family: IPv4, Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/16"), Index: 2, Type: RouteUnicast}
	r6 := Route{Family: IPv6, Table: 900, Dst: netip.MustParsePrefix("2001:db8::/32"), Index: 2, Type: RouteUnicast, Metric: 1024}
	with := func(r Route, f func(*Route)) Route { f(&r); return r }
	for _, tt := range []struct {
		name string
		a, b Route
	}{
		{"IPv4 source", r4, with(r4, func(r *Route) { r.Src = netip.MustParsePrefix("10.9.0.0/16") })},
		{"IPv4 TOS", r4, with(r4, func(r *Route) { r.TOS = 4 })},
		{"IPv4 metric", r4, with(r4, func(r *Route) { r.Metric = 5 })},
		{"IPv6 TOS", r6, with(r6, func(r *Route) { r.TOS = 4 })},
		{"IPv6 source", r6, with(r6, func(r *Route) { r.Src = netip.MustParsePrefix("2001:db8:1::/48") })},
		{"IPv6 metric", r6, with(r6, func(r *Route) { r.Metric = 5 })},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := new(RouteSet).Add(tt.a, tt.b)
			if n := s.Len(); n != 2 {
				t.Fatalf("Len %d, want 2: %v", n, slices.Collect(s.All()))
			}
			for _, r := range []Route{tt.a, tt.b} {
				if got, ok := s.Get(r.Key()); !ok || !got.Equal(r.Clean()) {
					t.Errorf("Get(%v) = %v, %v; want %v", r.Key(), got, ok, r.Clean())
				}
			}
		})
	}
}

// TestRouteSetHeldNotAdded: a set's memory follows the routes it holds,
// not the routes added to it (issue 38 H2: one key added a million times
// held 48 MiB, 384 with a route that does not fit an entry).
func TestRouteSetHeldNotAdded(t *testing.T) {
	r := Route{Family: IPv4, Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/16"), Index: 2, Type: RouteUnicast}
	whole := r
	whole.Metrics.Locks = lockMTU
	for _, r := range []Route{r, whole} {
		var s RouteSet
		for range 1_000_000 {
			s.Add(r)
		}
		s.mu.Lock()
		c4, cx := cap(s.e4), cap(s.extra)
		s.mu.Unlock()
		if c4 > 256 || cx > 256 {
			t.Errorf("%v added a million times: room for %d entries and %d whole routes, want at most 256", r, c4, cx)
		}
		if n := s.Len(); n != 1 {
			t.Errorf("Len %d, want 1", n)
		}
	}
}

// TestRouteSetEmpty: the zero RouteSet is empty.
func TestRouteSetEmpty(t *testing.T) {
	var s RouteSet
	if n := s.Len(); n != 0 {
		t.Errorf("Len %d", n)
	}
	if _, ok := s.Get(RouteKey{Family: IPv4, Dst: netip.MustParsePrefix("0.0.0.0/0")}); ok {
		t.Error("Get found a route in an empty set")
	}
	for r := range s.All() {
		t.Errorf("All yielded %v", r)
	}
}

// BenchmarkRouteSetMemory reports the bytes a RouteSet of ordinary routes
// takes per route, beside those of a []Route of the same routes
// (bytes/route/slice): the ratio is what a policy that desires a full
// table's copy saves.
func BenchmarkRouteSetMemory(b *testing.B) {
	const n = 100_000
	rs := make([]Route, n)
	for i := range rs {
		a := uint32(11<<24 + i<<8)
		rs[i] = Route{Family: IPv4, Table: 900, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), 0}), 24),
			Gateway: netip.MustParseAddr("10.0.0.1"), Index: 2, MTU: 1355, Protocol: ProtoStatic, Type: RouteUnicast}
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var perSet, perSlice float64
	for b.Loop() {
		before := heap()
		s := new(RouteSet)
		for _, r := range rs {
			s.Add(r)
		}
		s.Len()
		perSet = float64(heap()-before) / n
		runtime.KeepAlive(s)
		before = heap()
		sl := slices.Clone(rs)
		perSlice = float64(heap()-before) / n
		runtime.KeepAlive(sl)
	}
	b.ReportMetric(perSet, "bytes/route")
	b.ReportMetric(perSlice, "bytes/route/slice")
}
