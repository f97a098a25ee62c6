//go:build linux

package main

import (
	"net/netip"
	"testing"
	"time"
)

// BenchmarkKernelPathMTUConverge measures how fast each source of a
// peer's path MTU reaches the peer's route in table 900, on the worlds of
// TestKernelPathMTULearned and TestKernelPathMTUProbedBlackHole, from the
// moment the source has something to say: declared, from the agent's
// start with --path-mtu; learned, from one marked DF datagram that draws
// an ICMP "fragmentation needed" (the agent reads the ICMP counters every
// 2 s); probed, from the agent's start with a silent black hole on the
// path (a search of ladder and bisection at the node-wide 20 packets/s).
// Each reports ms: the time until `ip route get` answers the value; the
// split alone (at the tunnel MTU, from the start) is the reference.
//
//	MARKSPLIT_KERNEL_TESTS=1 go test -run '^$' -bench KernelPathMTUConverge -benchtime 1x ./agent
func BenchmarkKernelPathMTUConverge(b *testing.B) {
	bin := agentBinary(b) // built before any clock starts
	// The reference: the split alone, at the tunnel MTU, from the start.
	b.Run("split", func(b *testing.B) {
		for range b.N {
			s, api := newPeerSeed(b)
			start := time.Now()
			s.startBinEnv(b, bin, api.env, append(peerArgs, "--metrics-addr=", "--path-mtu-probe=false")...)
			eventually(b, 2*time.Minute, "the split", func() error { return s.split(b, "10.0.0.9") })
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "ms")
		}
	})
	b.Run("declared", func(b *testing.B) {
		for range b.N {
			s, api := newPeerSeed(b)
			start := time.Now()
			s.startBinEnv(b, bin, api.env, append(peerArgs, "--metrics-addr=", "--path-mtu-probe=false", "--path-mtu=10.0.0.9/32=1300")...)
			eventually(b, 2*time.Minute, "the declared value", func() error { return s.via(b, "10.0.0.9", false, "900", 1232) })
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "ms")
		}
	})
	b.Run("learned", func(b *testing.B) {
		for range b.N {
			s, api := newPeerSeed(b)
			smallHopBehindGateway(b, s)
			s.startBinEnv(b, bin, api.env, append(peerArgs, "--metrics-addr=", "--path-mtu-probe=false")...)
			eventually(b, 2*time.Minute, "the peer split", func() error { return s.split(b, "10.0.0.9") })
			peer := netip.MustParseAddr("10.0.0.9")
			start := time.Now()
			eventually(b, 2*time.Minute, "the learned value", func() error {
				if err := s.ns.Do(func() error { return sendMarkedDF(peer, 1400, 0xe00) }); err != nil {
					return err
				}
				return s.via(b, "10.0.0.9", false, "900", 1232)
			})
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "ms")
		}
	})
	b.Run("probed", func(b *testing.B) {
		for range b.N {
			s, api := newPeerSeed(b)
			holeBehindGateway(b, s)
			start := time.Now()
			s.startBinEnv(b, bin, api.env, append(peerArgs, "--metrics-addr=", "--path-mtu-probe=true", "--path-mtu-learn=false")...)
			eventually(b, 2*time.Minute, "the probed value", func() error { return s.via(b, "10.0.0.9", false, "900", 1232) })
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "ms")
		}
	})
}
