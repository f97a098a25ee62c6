//go:build linux

package main

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/marksplit/marksplit/internal/kerneltest"
	"github.com/marksplit/marksplit/internal/pathprobe"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"golang.org/x/sys/unix"
)

// A silent black hole on the way to the peer: a hop whose receiving end
// carries 1300 bytes and sends no ICMP (packets up to 1304 pass:
// KERNEL-NOTES). Without the agent a bulk TCP transfer stalls (3
// retransmissions of one segment, nothing more acknowledged); with probing
// on and learning off, the agent's search finds the path, the peer's host
// route gets floor16(P − 60) for the P found, 1232, and the transfer
// completes.
func TestKernelPathMTUProbedBlackHole(t *testing.T) {
	s, api := newPeerSeed(t)
	_, far, resp := holeBehindGateway(t, s)

	// Without the agent: the lowered main route's 1355 bytes vanish in
	// the hole, and a bulk transfer stalls. A GSO packet passes a veth
	// whatever its size (is_skb_forwardable) and is cut into segments only
	// beyond the hole: the node sends single segments, as a NIC without TSO
	// would.
	s.ns.IP(t, "link", "set", "dev", "enp7s0", "gso_max_segs", "1")
	ln := listenIn(t, far)
	const total = 1 << 20
	acked, retrans := transfer(t, s.ns, ln, total, false)
	if acked >= total {
		t.Fatalf("without the path MTU the transfer completed (%d bytes acked)", acked)
	}
	t.Logf("without the path MTU: %d of %d bytes acked after %d retransmissions", acked, total, retrans)

	a := s.startBinEnv(t, agentBinary(t), api.env, append(peerArgs, "--metrics-addr=", "--path-mtu-probe=true", "--path-mtu-learn=false")...)
	eventually(t, 2*time.Minute, "the probed path MTU on the peer's route", func() error {
		return s.via(t, "10.0.0.9", false, "900", 1232)
	})
	var line string
	for _, m := range a.messages(t) {
		if strings.HasPrefix(m, "path MTU of peer 10.0.0.9:") {
			line = m
		}
	}
	if !strings.Contains(line, "(inner MTU 1232, reduced), probed, age ") {
		t.Errorf("log line %q: want the inner MTU 1232, probed", line)
	}
	t.Logf("%s; responder answered %d", line, resp.Stats().Answered)
	acked, _ = transfer(t, s.ns, ln, total, true)
	if acked < total {
		t.Errorf("with the path MTU: %d of %d bytes acked", acked, total)
	}
	t.Logf("with the path MTU: %d of %d bytes acked", acked, total)
}

// holeBehindGateway puts the peer 10.0.0.9 behind s's gateway on a path
// with a silent black hole of 1300 bytes, and serves the peer's probe
// responder for 10.0.0.5, as its agent would: gateway – mid – far, the
// gateway's end of its link to mid at 1450 bytes, mid's end m0 at 1300
// (the hole: nothing sends ICMP; a test changes the path with m0's MTU),
// and far's own link at 1450, so that far's MSS does not give the hole
// away.
func holeBehindGateway(t testing.TB, s *seed) (mid, far *netwatchtest.NetNS, resp *pathprobe.Responder) {
	t.Helper()
	mid, far = kerneltest.NewNetNS(t), kerneltest.NewNetNS(t)
	mid.LoUp(t)
	far.LoUp(t)
	s.gw.AddVeth(t, "r1", mid, "m0")
	mid.AddVeth(t, "m1", far, "p0")
	s.gw.IP(t, "link", "set", "r1", "mtu", "1450", "up")
	s.gw.IP(t, "addr", "add", "10.9.0.1/24", "dev", "r1")
	mid.IP(t, "link", "set", "m0", "mtu", "1300", "up")
	mid.IP(t, "addr", "add", "10.9.0.2/24", "dev", "m0")
	mid.IP(t, "link", "set", "m1", "mtu", "1450", "up")
	mid.IP(t, "addr", "add", "10.9.1.1/24", "dev", "m1")
	far.IP(t, "link", "set", "p0", "mtu", "1450", "up")
	far.IP(t, "addr", "add", "10.9.1.2/24", "dev", "p0")
	far.IP(t, "addr", "add", "10.0.0.9/32", "dev", "p0")
	far.IP(t, "route", "add", "default", "via", "10.9.1.1")
	mid.IP(t, "route", "add", "10.0.0.0/16", "via", "10.9.0.1")
	mid.IP(t, "route", "add", "10.0.0.9/32", "via", "10.9.1.2")
	s.gw.IP(t, "route", "add", "10.0.0.9/32", "via", "10.9.0.2")
	for _, ns := range []interface{ Do(func() error) error }{s.gw, mid} {
		if err := ns.Do(func() error { return writeProc("/proc/sys/net/ipv4/ip_forward", "1") }); err != nil {
			t.Fatal(err)
		}
	}
	return mid, far, serveResponder(t, far)
}

// serveResponder serves ns's probe responder for 10.0.0.5 until the test
// ends, as the peer's agent would.
func serveResponder(t testing.TB, ns *netwatchtest.NetNS) *pathprobe.Responder {
	t.Helper()
	var c *net.UDPConn
	if err := ns.Do(func() (err error) {
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: pathprobe.DefaultPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	resp := &pathprobe.Responder{Allow: func(a netip.Addr) bool { return a == netip.MustParseAddr("10.0.0.5") }}
	go func() { defer close(served); resp.ServeConn(ctx, c) }()
	t.Cleanup(func() { cancel(); <-served })
	return resp
}

// listenIn listens on TCP 10.0.0.9:5001 in ns and discards what it reads.
func listenIn(t *testing.T, ns interface{ Do(func() error) error }) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) { ln, err = net.Listen("tcp", "10.0.0.9:5001"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return ln
}

// transfer sends total bytes over a new connection from ns and returns the
// bytes the peer acknowledged and the retransmissions: when complete is
// false, once the kernel has retransmitted 3 times in a row without an
// acknowledgement (a stall, bounded by attempts, not by time); else once
// everything is acknowledged (or, a failure, after minutes).
func transfer(t *testing.T, ns interface{ Do(func() error) error }, ln net.Listener, total int, complete bool) (acked uint64, retrans uint8) {
	t.Helper()
	var fd int
	if err := ns.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return unix.Connect(fd, &unix.SockaddrInet4{Port: 5001, Addr: [4]byte{10, 0, 0, 9}})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	must(t, unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, total))
	go func() {
		buf := make([]byte, total)
		for off := 0; off < total; {
			n, err := unix.Write(fd, buf[off:])
			if err != nil {
				return
			}
			off += n
		}
	}()
	deadline := time.Now().Add(3 * time.Minute) // only a hang reaches it
	// TCP_INFO has no event to wait on: read it on every tick until the
	// condition holds.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		must(t, err)
		acked, retrans = info.Bytes_acked, info.Retransmits
		switch {
		case complete && acked >= uint64(total):
			return acked - 1, retrans // bytes_acked counts the SYN
		case !complete && retrans >= 3, !complete && acked >= uint64(total):
			return acked, retrans
		}
		<-tick.C
	}
	return acked, retrans
}
