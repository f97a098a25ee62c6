//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// BenchmarkKernelDump measures `watch -json -once` against `ip -j route show
// table all` on a namespace with 100,000 routes (MARKSPLIT_BENCH_ROUTES):
// five pairs, interleaved, each a fresh process under nsenter. It reports
// the median wall time of each, their ratio, and watch's peak RSS.
// MARKSPLIT_BENCH_WATCH names another watch binary to measure instead (say,
// one built from the commit before a change).
func BenchmarkKernelDump(b *testing.B) {
	n := 100000
	if v := os.Getenv("MARKSPLIT_BENCH_ROUTES"); v != "" {
		fmt.Sscan(v, &n)
	}
	bin := os.Getenv("MARKSPLIT_BENCH_WATCH")
	if bin == "" {
		bin = netwatchtest.BuildProgram(b, "watch")
	}
	ns := newNetNS(b)
	ns.LoUp(b)
	ns.IP(b, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	ns.IP(b, "link", "set", "eth0", "up")
	ns.IP(b, "link", "set", "eth1", "up")
	ns.IP(b, "addr", "add", "10.0.0.5/16", "dev", "eth0")
	ns.AddRoutes(b, n, "10.0.0.1", "eth0")

	run := func(args ...string) (time.Duration, int64) {
		cmd := exec.Command("nsenter", append([]string{"--net=" + ns.Path()}, args...)...)
		out, err := os.Create(os.DevNull)
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		cmd.Stdout = out
		start := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("%v: %v", args, err)
		}
		return time.Since(start), cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
	}
	for range b.N {
		var watchT, ipT []time.Duration
		var rss int64
		for range 5 {
			d, m := run(bin, "-json", "-once")
			watchT, rss = append(watchT, d), max(rss, m)
			d, _ = run("ip", "-j", "route", "show", "table", "all")
			ipT = append(ipT, d)
		}
		slices.Sort(watchT)
		slices.Sort(ipT)
		b.ReportMetric(float64(watchT[2].Microseconds())/1000, "watch-ms")
		b.ReportMetric(float64(ipT[2].Microseconds())/1000, "ip-ms")
		b.ReportMetric(float64(watchT[2])/float64(ipT[2]), "watch/ip")
		b.ReportMetric(float64(rss)/1024, "watch-rss-MiB")
		b.ReportMetric(0, "ns/op")
	}
}
