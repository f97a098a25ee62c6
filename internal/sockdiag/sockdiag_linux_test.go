//go:build linux

package sockdiag_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/sockdiag"
)

func dial(t *testing.T) *sockdiag.Conn {
	t.Helper()
	c, err := sockdiag.Dial(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A netlink socket of ours is listed under its port.
func TestNetlinkPorts(t *testing.T) {
	nl, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	ports, err := dial(t).NetlinkPorts(unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	if ino := ports[nl.PID()]; ino == 0 {
		t.Errorf("port %d not listed among %d NETLINK_ROUTE sockets", nl.PID(), len(ports))
	}
	if ports, err := dial(t).NetlinkPorts(unix.NETLINK_GENERIC); err != nil {
		t.Fatal(err)
	} else if ports[nl.PID()] != 0 {
		t.Errorf("NETLINK_ROUTE port %d listed as a NETLINK_GENERIC socket", nl.PID())
	}
}

// A listening abstract socket of ours is listed with its name and owner;
// one bound to a path is not listed by its path.
func TestUnixListeners(t *testing.T) {
	abstract := &net.UnixAddr{Name: fmt.Sprintf("@marksplit/sockdiag-test/%d", os.Getpid()), Net: "unix"}
	path := &net.UnixAddr{Name: filepath.Join(t.TempDir(), "s"), Net: "unix"}
	for _, a := range []*net.UnixAddr{abstract, path} {
		ln, err := net.ListenUnix("unix", a)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
	}
	socks, err := dial(t).UnixListeners()
	if err != nil {
		t.Fatal(err)
	}
	want := sockdiag.UnixSocket{Name: abstract.Name, UID: uint32(os.Geteuid()), UIDKnown: true}
	if !slices.Contains(socks, want) {
		t.Errorf("%+v not among %d listeners", want, len(socks))
	}
	if slices.ContainsFunc(socks, func(s sockdiag.UnixSocket) bool { return s.Name == path.Name }) {
		t.Errorf("the socket bound to %s is listed by its path", path.Name)
	}
}

// The owner of a loopback TCP connection is found, and a connection that
// does not exist is not.
func TestTCPOwner(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			host := "127.0.0.1"
			if network == "tcp6" {
				host = "[::1]"
			}
			ln, err := net.Listen(network, host+":0")
			if err != nil {
				t.Skipf("no %s loopback: %v", network, err)
			}
			defer ln.Close()
			c, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			uid, err := dial(t).TCPOwner(c.LocalAddr().(*net.TCPAddr), c.RemoteAddr().(*net.TCPAddr))
			if err != nil || uid != uint32(os.Geteuid()) {
				t.Errorf("client end: %d, %v; want %d", uid, err, os.Geteuid())
			}
			// No socket has the client's port with another peer (the
			// kernel falls back to a listener on src, and there is none).
			if _, err := dial(t).TCPOwner(c.LocalAddr().(*net.TCPAddr), &net.TCPAddr{IP: c.RemoteAddr().(*net.TCPAddr).IP, Port: 1}); err == nil {
				t.Error("a connection that does not exist was found")
			}
		})
	}
}
