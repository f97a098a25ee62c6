package netwatch

import (
	"net/netip"
	"testing"
)

// TestRouteMatchesRejectOnLo: the kernel reports an IPv6 reject route as
// "dev lo"; a desired one without an output link is that route. IPv4
// reject routes have no link, and an IPv6 unicast route on lo is not one
// without a link.
func TestRouteMatchesRejectOnLo(t *testing.T) {
	for _, typ := range []RouteType{RouteUnreachable, RouteThrow, RouteBlackhole, RouteProhibit} {
		want := Route{Family: IPv6, Table: 930, Dst: netip.MustParsePrefix("fd93::/64"), Type: typ}
		kernel := want
		kernel.Index, kernel.Metric = 1, 1024
		if !want.Matches(kernel) {
			t.Errorf("%v: desired without a link does not match the kernel's on lo", typ)
		}
		other := kernel
		other.Index = 2
		if want.Matches(other) {
			t.Errorf("%v: desired without a link matches one on link 2", typ)
		}
		four := Route{Family: IPv4, Table: 930, Dst: netip.MustParsePrefix("10.93.0.0/24"), Type: typ}
		lo4 := four
		lo4.Index = 1
		if want4 := four; want4.Matches(lo4) {
			t.Errorf("%v: an IPv4 route without a link matches one on lo", typ)
		}
	}
	uni := Route{Family: IPv6, Table: 930, Dst: netip.MustParsePrefix("fd93::/64"), Type: RouteUnicast}
	lo := uni
	lo.Index = 1
	if uni.Matches(lo) {
		t.Error("a unicast route without a link matches one on lo")
	}
}
