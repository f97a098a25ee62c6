//go:build linux

package pathmtu_test

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/kerneltest"
	"github.com/marksplit/marksplit/internal/pathmtu"
)

// node – router – peer, where the router's egress is smaller (1300) and
// says so with ICMP: a DF packet of 1400 bytes from the node records a
// PMTU exception of 1300 on the node's route, which Exceptions reads
// without a single probe; the IPv6 one is deleted, the route stays.
func TestKernelExceptions(t *testing.T) {
	node, router, peer := kerneltest.NewNetNS(t), kerneltest.NewNetNS(t), kerneltest.NewNetNS(t)
	for _, ns := range []interface{ LoUp(testing.TB) }{node, router, peer} {
		ns.LoUp(t)
	}
	node.AddVeth(t, "n0", router, "r0")
	router.AddVeth(t, "r1", peer, "p0")
	node.IP(t, "addr", "add", "10.1.0.1/24", "dev", "n0")
	node.IP(t, "addr", "add", "2001:db8:1::1/64", "dev", "n0", "nodad")
	router.IP(t, "addr", "add", "10.1.0.2/24", "dev", "r0")
	router.IP(t, "addr", "add", "2001:db8:1::2/64", "dev", "r0", "nodad")
	router.IP(t, "addr", "add", "10.2.0.1/24", "dev", "r1")
	router.IP(t, "addr", "add", "2001:db8:2::1/64", "dev", "r1", "nodad")
	peer.IP(t, "addr", "add", "10.2.0.2/24", "dev", "p0")
	peer.IP(t, "addr", "add", "2001:db8:2::2/64", "dev", "p0", "nodad")
	router.IP(t, "link", "set", "r1", "mtu", "1300")
	peer.IP(t, "link", "set", "p0", "mtu", "1300")
	for _, l := range [][2]any{{node, "n0"}, {router, "r0"}, {router, "r1"}, {peer, "p0"}} {
		l[0].(interface {
			IP(testing.TB, ...string) string
		}).IP(t, "link", "set", l[1].(string), "up")
	}
	must(t, router.Do(func() error {
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := writeFile(f, "1"); err != nil {
				return err
			}
		}
		return nil
	}))
	node.IP(t, "route", "add", "10.2.0.0/24", "via", "10.1.0.2")
	node.IP(t, "-6", "route", "add", "2001:db8:2::/64", "via", "2001:db8:1::2")
	peer.IP(t, "route", "add", "default", "via", "10.2.0.1")
	peer.IP(t, "-6", "route", "add", "default", "via", "2001:db8:2::1")

	want := map[netip.Addr]bool{netip.MustParseAddr("10.2.0.2"): true, netip.MustParseAddr("2001:db8:2::2"): true}
	var got []pathmtu.Exception
	deadline := time.Now().Add(2 * time.Minute) // only a hang reaches it
	// Send again on every tick until each exception shows (or the
	// deadline, only a hang's, passes).
	pace := time.NewTicker(50 * time.Millisecond)
	defer pace.Stop()
	for {
		// One DF datagram of 1400 bytes to each (again: a neighbour
		// lookup may eat the first).
		must(t, node.Do(func() error {
			for a := range want {
				if err := sendDF(a, 1400); err != nil {
					return err
				}
			}
			var err error
			got, err = exceptionsTo(want)
			return err
		}))
		if len(got) == len(want) || time.Now().After(deadline) {
			break
		}
		<-pace.C // the next round of sends
	}
	if len(got) != len(want) {
		t.Fatalf("exceptions: %+v; want one to each of %v\n%s", got, want, node.IP(t, "route", "show", "table", "all", "cache"))
	}
	for _, e := range got {
		if e.MTU != 1300 || e.Table != unix.RT_TABLE_MAIN {
			t.Errorf("exception %+v: want MTU 1300 on the main table", e)
		}
	}
	must(t, node.Do(func() error {
		for _, e := range got {
			err := pathmtu.DeleteException(e)
			switch {
			case e.Dst.Is4() && !errors.Is(err, pathmtu.ErrNoDelete):
				return fmt.Errorf("IPv4 delete: %v, want ErrNoDelete", err)
			case e.Dst.Is6() && err != nil:
				return err
			}
		}
		left, err := exceptionsTo(want)
		if err != nil {
			return err
		}
		if len(left) != 1 || !left[0].Dst.Is4() {
			return fmt.Errorf("after the delete: %+v; want only the IPv4 one", left)
		}
		return nil
	}))
	if out := node.IP(t, "-6", "route", "show", "2001:db8:2::/64"); out == "" {
		t.Error("the delete took the route")
	}
}

func exceptionsTo(want map[netip.Addr]bool) ([]pathmtu.Exception, error) {
	all, err := pathmtu.Exceptions()
	var got []pathmtu.Exception
	for _, e := range all {
		if want[e.Dst] {
			got = append(got, e)
		}
	}
	return got, err
}

// sendDF sends one UDP datagram of size bytes (IP header included) to a
// with DF set.
func sendDF(a netip.Addr, size int) error {
	fam, lvl, opt, val, hdr := unix.AF_INET, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE, 28
	if a.Is6() {
		fam, lvl, opt, val, hdr = unix.AF_INET6, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE, 48
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, lvl, opt, val); err != nil {
		return err
	}
	var sa unix.Sockaddr
	if a.Is6() {
		sa = &unix.SockaddrInet6{Port: 9, Addr: a.As16()}
	} else {
		sa = &unix.SockaddrInet4{Port: 9, Addr: a.As4()}
	}
	err = unix.Sendto(fd, make([]byte, size-hdr), 0, sa)
	if errors.Is(err, unix.EMSGSIZE) {
		return nil // the exception is there already
	}
	return err
}

func writeFile(name, s string) error {
	fd, err := unix.Open(name, unix.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(s))
	return err
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
