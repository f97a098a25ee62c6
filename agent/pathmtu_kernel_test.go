//go:build linux

package main

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/kerneltest"
)

// The path to the peer crosses a hop whose egress carries 1300 bytes and
// says so with ICMP. One marked DF datagram of 1400 bytes (as WireGuard's
// would be) records a PMTU exception on the main route; the agent learns
// it from the exception alone, with probing off: the peer's host route in
// table 900 gets floor16(1300 − 60) = 1232, and the log line names the
// value, its source and its age.
func TestKernelPathMTULearned(t *testing.T) {
	s, api := newPeerSeed(t)
	smallHopBehindGateway(t, s)
	a := s.startBinEnv(t, agentBinary(t), api.env, append(peerArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "the peer split", func() error { return s.split(t, "10.0.0.9") })

	peer := netip.MustParseAddr("10.0.0.9")
	eventually(t, 2*time.Minute, "the learned path MTU on the peer's route", func() error {
		// Again each round: the first may go before the gateway's
		// neighbour entry for the peer exists.
		if err := s.ns.Do(func() error { return sendMarkedDF(peer, 1400, 0xe00) }); err != nil {
			return err
		}
		return s.via(t, "10.0.0.9", false, "900", 1232)
	})
	if got, want := s.ns.IP(t, "route", "show", "table", "900"), "10.0.0.9 via 10.0.0.1 dev enp7s0 proto 109 src 10.0.0.5 mtu 1232 \n"; got != want {
		t.Errorf("ip route show table 900:\n got %q\nwant %q", got, want)
	}
	found := false
	for _, m := range a.messages(t) {
		if strings.HasPrefix(m, "path MTU of peer 10.0.0.9: 1300 bytes (inner MTU 1232, reduced), learned, age ") {
			found = true
		}
	}
	if !found {
		t.Errorf("no log line for the learned value:\n%q", a.messages(t))
	}
}

// smallHopBehindGateway puts the peer 10.0.0.9 behind s's gateway, on a
// link of 1300 bytes whose gateway end says so with ICMP.
func smallHopBehindGateway(t testing.TB, s *seed) {
	t.Helper()
	far := kerneltest.NewNetNS(t)
	far.LoUp(t)
	s.gw.AddVeth(t, "r1", far, "p0")
	s.gw.IP(t, "link", "set", "r1", "mtu", "1300", "up")
	far.IP(t, "link", "set", "p0", "mtu", "1300", "up")
	far.IP(t, "addr", "add", "10.0.0.9/32", "dev", "p0")
	far.IP(t, "route", "add", "default", "dev", "p0")
	s.gw.IP(t, "route", "add", "10.0.0.9/32", "dev", "r1")
	if err := s.gw.Do(func() error { return writeProc("/proc/sys/net/ipv4/ip_forward", "1") }); err != nil {
		t.Fatal(err)
	}
}

// sendMarkedDF sends one UDP datagram of size bytes (IP header included)
// to a with DF set and SO_MARK mark.
func sendMarkedDF(a netip.Addr, size int, mark int) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE); err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, mark); err != nil {
		return err
	}
	err = unix.Sendto(fd, make([]byte, size-28), 0, &unix.SockaddrInet4{Port: 9, Addr: a.As4()})
	if err != nil && !errors.Is(err, unix.EMSGSIZE) {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

func writeProc(name, v string) error {
	fd, err := unix.Open(name, unix.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(v))
	return err
}
