//go:build linux

package main

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/marksplit/marksplit/internal/kerneltest"
	"github.com/marksplit/marksplit/internal/pathprobe"
)

// A silent black hole: the gateway's link to the peer carries 1450 bytes,
// the peer's end only 1300, and nothing sends ICMP (packets up to 1304
// pass: KERNEL-NOTES). With probing on and learning off, the agent's
// search finds the path and the peer's host route gets floor16(P − 60)
// for the P found: 1232.
func TestKernelPathMTUProbedBlackHole(t *testing.T) {
	s, api := newPeerSeed(t)
	far := kerneltest.NewNetNS(t)
	far.LoUp(t)
	s.gw.AddVeth(t, "r1", far, "p0")
	s.gw.IP(t, "link", "set", "r1", "mtu", "1450", "up")
	s.gw.IP(t, "addr", "add", "10.9.0.1/24", "dev", "r1")
	far.IP(t, "link", "set", "p0", "mtu", "1300", "up")
	far.IP(t, "addr", "add", "10.9.0.2/24", "dev", "p0")
	far.IP(t, "addr", "add", "10.0.0.9/32", "dev", "p0")
	far.IP(t, "route", "add", "default", "via", "10.9.0.1")
	s.gw.IP(t, "route", "add", "10.0.0.9/32", "via", "10.9.0.2")
	if err := s.gw.Do(func() error { return writeProc("/proc/sys/net/ipv4/ip_forward", "1") }); err != nil {
		t.Fatal(err)
	}
	// The peer's responder, as its agent would serve it.
	var c *net.UDPConn
	if err := far.Do(func() (err error) {
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
}
