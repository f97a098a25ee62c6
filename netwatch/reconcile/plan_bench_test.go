package reconcile

import (
	"net/netip"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
)

// BenchmarkPlan200k plans a converged pass over 200,000 desired routes,
// alone and with a few throws beside them (as mtupolicy adds): Plan reads
// the policy's set in place, so its allocation does not depend on which
// routes the policy put there (issue 37: one route more raised it from 67
// to 116 MiB, a copy of the whole set).
func BenchmarkPlan200k(b *testing.B) {
	const n = 200_000
	route := func(i int) netwatch.Route {
		return netwatch.Route{Family: netwatch.IPv4, Table: 900, Type: netwatch.RouteUnicast, Index: 2, Protocol: 77, MTU: 1355,
			Gateway: netip.MustParseAddr("10.0.0.1"), Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)}), 32)}
	}
	throw := func(i int) netwatch.Route {
		return netwatch.Route{Family: netwatch.IPv4, Table: 900, Type: netwatch.RouteThrow, Protocol: 77,
			Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{12, byte(i), 0, 0}), 16)}
	}
	for _, throws := range []int{0, 4} {
		name := "routes"
		if throws > 0 {
			name = "routes+throws"
		}
		b.Run(name, func(b *testing.B) {
			d := Desired{Own: Own(900, 0), Routes: new(netwatch.RouteSet)}
			var s netwatch.Snapshot
			for i := range n {
				d.Routes.Add(route(i))
				s.Routes = append(s.Routes, route(i))
			}
			for i := range throws {
				d.Routes.Add(throw(i))
				s.Routes = append(s.Routes, throw(i))
			}
			v := s.View()
			s.Routes = nil
			b.ReportAllocs()
			for b.Loop() {
				if ops, err := Plan(v, d); err != nil || len(ops) != 0 {
					b.Fatalf("Plan: %d ops, %v", len(ops), err)
				}
			}
		})
	}
}
