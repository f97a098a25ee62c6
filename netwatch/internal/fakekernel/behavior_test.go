//go:build linux

package fakekernel

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestBehaviorDifferences: each knob of Behavior changes what the fake
// does as the kernels it names do (docs/design.md, "Kernels").
func TestBehaviorDifferences(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("AddressErrorMessages=", on), func(t *testing.T) {
			k := NewWith(Behavior{AddressErrorMessages: on})
			t.Cleanup(func() { k.Close() })
			c := dialFake(t, k, nil, 0)
			_, err := c.Execute(request(unix.RTM_DELADDR, fAck, addrMsg(1, "192.0.2.1/32", 0)))
			var oe *netlink.OpError
			if !errors.As(err, &oe) || !errors.Is(err, unix.EADDRNOTAVAIL) {
				t.Fatalf("delete a missing address: %v, want EADDRNOTAVAIL", err)
			}
			want := ""
			if on {
				want = "ipv4: Address not found"
			}
			if oe.Message != want {
				t.Errorf("message %q, want %q", oe.Message, want)
			}
		})
		t.Run(fmt.Sprint("LinkDeleteNamesRequester=", on), func(t *testing.T) {
			k := NewWith(Behavior{LinkDeleteNamesRequester: on})
			t.Cleanup(func() { k.Close() })
			idx := k.AddLink("br0", "bridge", 0, false)
			sub := dialFake(t, k, []uint32{grpLink}, 1<<20)
			c := dialFake(t, k, nil, 0)
			if _, err := c.Execute(request(unix.RTM_DELLINK, fAck, &rtnetlink.LinkMessage{Index: idx})); err != nil {
				t.Fatal(err)
			}
			var pid uint32
			for m, err := range sub.ReceiveIter() {
				if err != nil {
					t.Fatal(err)
				}
				if m.Header.Type == unix.RTM_DELLINK {
					pid = m.Header.PID
					break
				}
			}
			want := uint32(0)
			if on {
				want = c.PID()
			}
			if pid != want {
				t.Errorf("RTM_DELLINK event from port %d, want %d (requester %d)", pid, want, c.PID())
			}
		})
		t.Run(fmt.Sprint("IPv6PrefSrcEveryLink=", on), func(t *testing.T) {
			k := NewWith(Behavior{IPv6PrefSrcEveryLink: on})
			t.Cleanup(func() { k.Close() })
			a := k.AddLink("eth0", "veth", 0, true)
			b := k.AddLink("eth1", "veth", 0, true)
			src := netip.MustParsePrefix("fd00:5::1/128")
			if err := k.AddAddr(a, src); err != nil {
				t.Fatal(err)
			}
			for _, idx := range []uint32{a, b} {
				dst := netip.MustParsePrefix(fmt.Sprintf("fd00:%d::/64", 10+idx))
				if err := k.AddRoute(Route{Dst: dst, Index: idx, PrefSrc: src.Addr()}); err != nil {
					t.Fatal(err)
				}
			}
			if err := k.DelAddr(a, src); err != nil {
				t.Fatal(err)
			}
			kept := map[uint32]bool{}
			for _, r := range k.Routes() {
				if r.PrefSrc.IsValid() {
					kept[r.Index] = true
				}
			}
			want := map[uint32]bool{b: true}
			if on {
				want = map[uint32]bool{}
			}
			if fmt.Sprint(kept) != fmt.Sprint(want) {
				t.Errorf("links whose route kept the removed prefsrc: %v, want %v", kept, want)
			}
		})
		t.Run(fmt.Sprint("IPv6RouteTOSRefused=", on), func(t *testing.T) {
			k := NewWith(Behavior{IPv6RouteTOSRefused: on})
			t.Cleanup(func() { k.Close() })
			idx := k.AddLink("eth0", "veth", 0, true)
			c := dialFake(t, k, nil, 0)
			_, err := c.Execute(request(unix.RTM_NEWROUTE, fAdd, rt("fd0c::/64", 900, func(m *rtnetlink.RouteMessage) {
				m.Attributes.OutIface, m.Tos = idx, 4
			})))
			if on != errors.Is(err, unix.EINVAL) || !on && err != nil {
				t.Fatalf("an IPv6 route with a TOS: %v; want EINVAL %v", err, on)
			}
			var got []string
			for _, r := range k.Routes() {
				got = append(got, fmt.Sprint(r.Dst, " tos ", r.TOS))
			}
			want := []string{"fd0c::/64 tos 0"}
			if on {
				want = nil
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("routes %v, want %v", got, want)
			}
		})
	}
}
