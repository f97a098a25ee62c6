package fakekernel

import (
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDelRouteAsTheKernel: the Go API's delete is the kernel's (issue 37):
// an IPv6 route added with metric 0 (kept as 1024) is deleted with metric
// 0, and a gateway or link given must match, where the fake used to
// delete "default via 192.0.2.1" when asked for "default via 192.0.2.99".
func TestDelRouteAsTheKernel(t *testing.T) {
	k := New()
	defer k.Close()
	eth := k.AddLink("eth0", "veth", 1500, true)
	other := k.AddLink("eth1", "veth", 1500, true)
	for _, a := range []string{"192.0.2.10/24", "2001:db8::10/64"} {
		if err := k.AddAddr(eth, netip.MustParsePrefix(a)); err != nil {
			t.Fatal(err)
		}
	}
	def := Route{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("192.0.2.1"), Index: eth}
	v6 := Route{Dst: netip.MustParsePrefix("2001:db8:9::/48"), Index: eth}
	for _, r := range []Route{def, v6} {
		if err := k.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []Route{
		{Dst: def.Dst, Gateway: netip.MustParseAddr("192.0.2.99")},
		{Dst: def.Dst, Index: other},
		{Dst: v6.Dst, Index: other},
		{Dst: v6.Dst, Metric: 7},
	} {
		if err := k.DelRoute(r); !errors.Is(err, unix.ESRCH) {
			t.Errorf("DelRoute(%v): %v, want ESRCH", r, err)
		}
	}
	if n := len(k.Routes()); n < 2 {
		t.Fatalf("a refused delete removed a route: %v", k.Routes())
	}
	for _, r := range []Route{{Dst: def.Dst, Gateway: def.Gateway}, v6} {
		if err := k.DelRoute(r); err != nil {
			t.Errorf("DelRoute(%v): %v", r, err)
		}
	}
	for _, r := range k.Routes() {
		if r.Dst == def.Dst || r.Dst == v6.Dst {
			t.Errorf("still there: %v", r)
		}
	}
}
