//go:build linux

package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/pathprobe"
)

// The cost of probing (issue 35, "Cost"): the built agent with
// --peers=auto over 5,000 CiliumNodes that all encrypt, once without
// --path-mtu-probe (the reference) and once with it, each in a fresh seed
// namespace, measured over the same window after the first pass
// converged: the agent's peak RSS (VmHWM), its CPU (the run time of all
// its threads, in percent of one core) and the probe packets per second
// that reach the peers. Every peer lies behind the gateway (10.0.20.1
// onward, via 10.0.0.1), so every one is probed; the gateway namespace
// takes their addresses as local (AnyIP) and one Responder there answers
// for all of them, from the address each probe was sent to.
//
//	go test -run '^$' -bench KernelPathProbe5000 -benchtime 1x ./agent
//
// MARKSPLIT_BENCH_PROBE_WINDOW sets the window in seconds (default 30).
// bench/ (make bench-compare) runs it and writes the row of BENCHMARKS.md.
func BenchmarkKernelPathProbe5000(b *testing.B) {
	window := time.Duration(envInt(b, "MARKSPLIT_BENCH_PROBE_WINDOW", 30)) * time.Second
	for _, probe := range []bool{false, true} {
		b.Run(fmt.Sprintf("probe=%v", probe), func(b *testing.B) {
			for range b.N {
				r := runProbeCost(b, 5000, probe, window)
				b.ReportMetric(float64(r.hwm)/1024, "peak-rss-MiB")
				b.ReportMetric(r.cpu*100, "cpu-%")
				b.ReportMetric(r.wirePPS, "probe-pps")
				b.ReportMetric(r.metricPPS, "counted-pps")
				b.ReportMetric(float64(r.found), "found")
				b.ReportMetric(0, "ns/op")
				b.Logf("%d CiliumNodes, --path-mtu-probe=%v, over %v: peak RSS %.1f MiB, CPU %.2f%% of a core, %.1f probes/s on the wire (%.1f/s counted by the agent), %d searches found a path MTU",
					5000, probe, window, float64(r.hwm)/1024, r.cpu*100, r.wirePPS, r.metricPPS, r.found)
			}
		})
	}
}

// probeCost is what runProbeCost measured.
type probeCost struct {
	hwm       uint64  // KiB, the agent's VmHWM at the end
	cpu       float64 // the agent's CPU over the window, in cores
	wirePPS   float64 // probes the gateway's responder received per second
	metricPPS float64 // marksplit_path_mtu_probes_total's rate
	found     int     // searches that found a path MTU, at the end
}

func runProbeCost(tb testing.TB, nodes int, probe bool, window time.Duration) probeCost {
	tb.Helper()
	s := newSeed(tb, false)
	for _, p := range []string{"10.0.16.0/20", "10.0.32.0/21"} { // 10.0.16.0–10.0.39.255: every peerAddr below 5,000
		s.gw.IP(tb, "route", "add", "local", p, "dev", "lo")
	}
	var conn *net.UDPConn
	if err := s.gw.Do(func() (err error) {
		conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: pathprobe.DefaultPort})
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	node := netip.MustParseAddr("10.0.0.5")
	// Rate: the 4,999 peers' responders together, not one node's.
	resp := &pathprobe.Responder{Allow: func(a netip.Addr) bool { return a == node }, Rate: 1e6, Burst: 1 << 16}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { resp.ServeConn(ctx, conn) })
	tb.Cleanup(func() { cancel(); wg.Wait() })

	api := newPeerAPI(tb, s, apitest.Options{})
	all := []apitest.Node{{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255}}
	for i := range nodes - 1 {
		all = append(all, peerNode(i, peerAddr(i), 255))
	}
	if _, err := api.srv.Replace(all...); err != nil {
		tb.Fatal(err)
	}
	args := append(peerArgs, "--metrics-addr=127.0.0.1:9184", "--path-mtu-probe="+strconv.FormatBool(probe))
	a := s.startBinEnv(tb, agentBinary(tb), api.env, args...)
	pid := a.cmd.Process.Pid
	get := nsGetter(s)
	readyWithin(tb, get, 2*time.Minute)

	received := func() uint64 { st := resp.Stats(); return st.Answered + st.Limited + st.Refused + st.Malformed }
	_, run0 := cpuTime(tb, pid)
	wire0, counted0 := received(), probeMetric(tb, get, "marksplit_path_mtu_probes_total ")
	t0 := time.Now()
	<-time.After(window) // the measurement window, not a wait for a condition
	_, run1 := cpuTime(tb, pid)
	wire1, counted1 := received(), probeMetric(tb, get, "marksplit_path_mtu_probes_total ")
	took := time.Since(t0).Seconds()
	r := probeCost{
		hwm:       vmHWM(tb, pid),
		cpu:       float64(run1-run0) / 1e9 / took,
		wirePPS:   float64(wire1-wire0) / took,
		metricPPS: (counted1 - counted0) / took,
		found:     int(probeMetric(tb, get, `marksplit_path_mtu_searches_total{result="found"} `)),
	}
	if code, _ := a.stop(tb, syscall.SIGTERM); code != 0 {
		tb.Fatalf("agent exit %d", code)
	}
	if probe && (r.found == 0 || wire1 == wire0) {
		tb.Fatalf("probing measured nothing: %d probes received, %d searches found a path MTU", wire1-wire0, r.found)
	}
	if !probe && wire1 != 0 {
		tb.Fatalf("the reference sent %d probes", wire1)
	}
	return r
}

// probeMetric reads the value of the first /metrics line that starts with
// prefix; 0 when there is none (the reference has no probe metrics).
func probeMetric(tb testing.TB, get func(string) (int, string, error), prefix string) float64 {
	tb.Helper()
	_, body, err := get("/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				tb.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// vmHWM is pid's peak RSS in KiB.
func vmHWM(tb testing.TB, pid int) uint64 {
	tb.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	tb.Fatal("no VmHWM")
	return 0
}
