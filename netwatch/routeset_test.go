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
			r.Metrics.Locks = LockMTU
		case 1:
			r.Expires = time.Unix(1e9, 0)
		}
		rs = append(rs, r)
	}
	return rs
}

// TestRouteSet compares a RouteSet with the obvious model: the last route
// added of each key, in the documented order.
func TestRouteSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		rs := randomRoutes(rng, 1+rng.IntN(300))
		var s RouteSet
		last := map[RouteKey]Route{}
		for i, r := range rs {
			s.Add(r)
			last[r.Key()] = r
			if i == len(rs)/2 {
				// Reads between adds see what was added so far.
				if s.Len() != len(last) {
					t.Fatalf("round %d: Len %d after %d adds, want %d", round, s.Len(), i+1, len(last))
				}
			}
		}
		want := make([]Route, 0, len(last))
		for _, r := range last {
			want = append(want, r)
		}
		slices.SortFunc(want, routeSetOrder)
		got := slices.Collect(s.All())
		if diff := gocmp.Diff(want, got, cmpopts.EquateComparable(netip.Prefix{}, netip.Addr{})); diff != "" {
			t.Fatalf("round %d: All differs from the model (-want +got):\n%s", round, diff)
		}
		for i, w := range want {
			if r, ok := s.Get(w.Key()); !ok || !r.Equal(w) {
				t.Fatalf("round %d: Get(%v) = %v, %v; want %v", round, w.Key(), r, ok, w)
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
