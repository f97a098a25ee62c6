package wgpeers

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// fakeClient answers Device from a map; a missing name is os.ErrNotExist.
type fakeClient struct {
	devs   map[string]*wgtypes.Device
	err    error
	closed int
}

func (f *fakeClient) Device(name string) (*wgtypes.Device, error) {
	if f.err != nil {
		return nil, f.err
	}
	d, ok := f.devs[name]
	if !ok {
		return nil, fmt.Errorf("wguser: %w", os.ErrNotExist)
	}
	return d, nil
}

func (f *fakeClient) Close() error { f.closed++; return nil }

func key(b byte) wgtypes.Key {
	var k wgtypes.Key
	k[0] = b
	return k
}

func ipnet(s string) net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return *n
}

func TestRead(t *testing.T) {
	v4in6 := net.IPNet{IP: net.ParseIP("10.244.7.0").To16(), Mask: net.CIDRMask(120, 128)}
	c := &fakeClient{devs: map[string]*wgtypes.Device{"wg0": {
		Name:         "wg0",
		PrivateKey:   key(99),
		FirewallMark: 0x1e00,
		Peers: []wgtypes.Peer{
			{
				PublicKey:     key(2),
				PresharedKey:  key(98),
				Endpoint:      &net.UDPAddr{IP: net.ParseIP("10.0.0.9"), Port: 51871},
				AllowedIPs:    []net.IPNet{ipnet("10.244.9.0/24"), ipnet("fd00::/64"), ipnet("10.0.0.9/32"), ipnet("10.244.9.0/24")},
				ReceiveBytes:  1234,
				TransmitBytes: 5678,
			},
			{PublicKey: key(1), AllowedIPs: []net.IPNet{v4in6}},
		},
	}}}
	got, err := Read(c, "wg0")
	if err != nil {
		t.Fatal(err)
	}
	want := Device{Exists: true, FirewallMark: 0x1e00, Peers: []Peer{
		{PublicKey: Key(key(1)), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}},
		{
			PublicKey: Key(key(2)),
			Endpoint:  netip.MustParseAddrPort("10.0.0.9:51871"),
			AllowedIPs: []netip.Prefix{
				netip.MustParsePrefix("10.0.0.9/32"), netip.MustParsePrefix("10.244.9.0/24"), netip.MustParsePrefix("fd00::/64"),
			},
		},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Read (-want +got):\n%s", diff)
	}

	got, err = Read(c, "wg1")
	if err != nil || got.Exists {
		t.Errorf("Read of a missing device = %+v, %v; want a Device that does not exist, no error", got, err)
	}
	c.err = errors.New("permission denied")
	if _, err := Read(c, "wg0"); err == nil || err.Error() != "wgpeers: read wg0: permission denied" {
		t.Errorf("Read with a failing client: %v", err)
	}
}

func TestDiff(t *testing.T) {
	a := Peer{PublicKey: Key(key(1)), Endpoint: netip.MustParseAddrPort("10.0.0.9:51871"),
		AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24")}}
	b := Peer{PublicKey: Key(key(2)), AllowedIPs: []netip.Prefix{netip.MustParsePrefix("10.244.8.0/24")}}
	roamed := a
	roamed.Endpoint = netip.MustParseAddrPort("10.0.1.9:4000")
	moved := a
	moved.AllowedIPs = []netip.Prefix{netip.MustParsePrefix("10.244.9.0/25"), netip.MustParsePrefix("10.244.10.0/24")}
	dev := func(mark uint32, ps ...Peer) Device {
		return Device{Exists: true, FirewallMark: netwatchMark(mark), Peers: ps}
	}
	ka, kb := Key(key(1)).String(), Key(key(2)).String()
	for _, tc := range []struct {
		name       string
		prev, next Device
		want       []string
	}{
		{"same", dev(0, a, b), dev(0, a, b), nil},
		{"appears", Device{}, dev(0x1e00, a, b), []string{"wireguard wg0: 2 peers, fwmark 0x1e00"}},
		{"goes", dev(0, a), Device{}, []string{"wireguard wg0: gone"}},
		{"neither", Device{}, Device{}, nil},
		{"fwmark", dev(0, a), dev(0x1e00, a), []string{"wireguard wg0: fwmark 0x1e00 (was none)"}},
		{"added", dev(0, a), dev(0, a, b), []string{"wireguard wg0: peer " + kb + " added: endpoint none, allowed ips 10.244.8.0/24"}},
		{"removed", dev(0, a, b), dev(0, b), []string{"wireguard wg0: peer " + ka + " removed"}},
		{"roamed", dev(0, a), dev(0, roamed), []string{"wireguard wg0: peer " + ka + " endpoint 10.0.1.9:4000 (was 10.0.0.9:51871)"}},
		{"allowed ips", dev(0, a), dev(0, moved), []string{"wireguard wg0: peer " + ka + " allowed ips 10.244.9.0/25,10.244.10.0/24 (was 10.244.9.0/24)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Diff("wg0", tc.prev, tc.next)); diff != "" {
				t.Errorf("Diff (-want +got):\n%s", diff)
			}
			if eq := tc.prev.Equal(tc.next); eq != (tc.want == nil) {
				t.Errorf("Equal = %v, want %v", eq, tc.want == nil)
			}
		})
	}
}

var errNotExist = fmt.Errorf("wglinux: %w", os.ErrNotExist)

func udpAddr(s string) *net.UDPAddr {
	a, err := net.ResolveUDPAddr("udp", s)
	if err != nil {
		panic(err)
	}
	return a
}
