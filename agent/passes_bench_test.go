//go:build linux

package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/peakrss"
)

// BenchmarkKernelPeersFirstPass measures the first pass of --peers=auto in a
// cluster where every node encrypts: `marksplit once` against the stand-in
// API server with N CiliumNodes, each peer a /32 in table 900. It reports
// the agent's peak RSS (its own VmHWM) and wall time, for this tree's agent and
// MARKSPLIT_BENCH_BASE's (benchAgents), and fails unless this tree's agent
// installs every peer's route. N is 15,000: internal/ciliumnode's bound is
// 16 MiB of nodes, not a count; a base from before it, with a 10,000-node
// bound, fails its list, which is reported as converged 0, not a failure.
//
//	go test -run '^$' -bench KernelPeersFirstPass -benchtime 1x ./agent
func BenchmarkKernelPeersFirstPass(b *testing.B) {
	nodes := firstPassNodes()
	for _, ag := range benchAgents(b) {
		b.Run(fmt.Sprintf("nodes=%d/agent=%s", nodes, ag.name), func(b *testing.B) {
			for range b.N {
				s := newSeed(b, false)
				api := newEncryptingCluster(b, s, nodes)
				rss, took, err := runOnceIn(s, ag.bin, api.env, peerArgs...)
				converged := 1.0
				switch {
				case err != nil && ag.name == "base":
					// The base may not manage this cluster at all (a29e597
					// refuses more than 10,000 CiliumNodes): that is its figure.
					converged = 0
					b.Logf("%s: once: %v", ag.name, err)
				case err != nil:
					b.Fatalf("once: %v", err)
				}
				b.ReportMetric(converged, "converged")
				if converged == 1 {
					if got := strings.Count(s.ns.IP(b, "-4", "route", "show", "table", "900"), "\n"); got != nodes-1 {
						b.Errorf("table 900 holds %d routes, want %d (one per peer)", got, nodes-1)
					}
				}
				b.ReportMetric(float64(rss)/1024, "peak-rss-MiB")
				b.ReportMetric(took.Seconds(), "pass-s")
				b.ReportMetric(0, "ns/op")
				b.Logf("%s: %d CiliumNodes, first pass %v, peak RSS %.1f MiB", ag.name, nodes, took.Round(time.Millisecond), float64(rss)/1024)
			}
		})
	}
}

// firstPassNodes is the cluster size of the 15,000-node case.
func firstPassNodes() int { return 15000 }

// newEncryptingCluster serves nodes CiliumNodes, this node's and every
// peer's, each with an encryption key.
func newEncryptingCluster(tb testing.TB, s *seed, nodes int) *peerAPI {
	tb.Helper()
	api := newPeerAPI(tb, s, apitest.Options{})
	all := []apitest.Node{{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255}}
	for i := range nodes - 1 {
		all = append(all, peerNode(i, peerAddr(i), 255))
	}
	if _, err := api.srv.Replace(all...); err != nil {
		tb.Fatal(err)
	}
	return api
}

// runOnceIn runs `bin once` with args and env in the seed's namespace and
// returns its peak RSS in KiB (its own VmHWM: see internal/peakrss for why
// not ru_maxrss) and wall time.
func runOnceIn(s *seed, bin string, env []string, args ...string) (rssKiB int64, took time.Duration, err error) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + s.ns.Path(), bin, "once", "--metrics-addr="}, args...)...)
	cmd.Env = env
	var out strings.Builder
	cmd.Stderr = &out
	start := time.Now()
	rssKiB, err = peakrss.Run(cmd, bin)
	took = time.Since(start)
	if err != nil {
		err = fmt.Errorf("%v: %s", err, strings.TrimSpace(out.String()))
	}
	return rssKiB, took, err
}
