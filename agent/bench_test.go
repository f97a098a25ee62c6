//go:build linux

package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The benchmarks run the built agent in the seed topology, as the
// end-to-end tests do:
//
//	go test -run '^$' -bench Kernel -benchtime 1x ./agent
//
// MARKSPLIT_BENCH_IDLE shortens BenchmarkKernelIdle's 60 s (a duration).

// restoreTrials is how many deletions BenchmarkKernelRuleRestore times.
const restoreTrials = 250

// trialsPerAgent: fight damping repairs the first five undos of an object
// at once and delays later ones (that is the point of it), so the
// benchmark starts a fresh agent for every five deletions. Each agent's
// first repair, of the rule it added itself, is the first of the five.
const trialsPerAgent = 5

// BenchmarkKernelRuleRestore measures the time from a foreign deletion of
// the rule to its restoration, as an independent rtnetlink listener in the
// namespace sees them: from the RTM_DELRULE notification of the deletion
// to the RTM_NEWRULE of the restored rule. It reports p50, p99 and max.
func BenchmarkKernelRuleRestore(b *testing.B) {
	s := newSeed(b, true)
	events := listenRules(b, s)
	ap, err := netwatch.DialApplier(netwatch.KernelDialer{NetNS: s.ns.FD()})
	if err != nil {
		b.Fatal(err)
	}
	defer ap.Close()

	var lat []time.Duration
	b.ResetTimer()
	for len(lat) < restoreTrials*b.N {
		a := s.start(b, append(seedArgs, "--metrics-addr=")...)
		eventually(b, 5*time.Second, "split", func() error { return s.splitAt(b, 1355) })
		for range trialsPerAgent {
			lat = append(lat, restoreOnce(b, events, ap))
		}
		if code, _ := a.stop(b, syscall.SIGTERM); code != 0 {
			b.Fatalf("agent exit %d", code)
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(float64(len(lat))*p))] }
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(q(0.50)), "p50-ms")
	b.ReportMetric(ms(q(0.99)), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d deletions of rule 900: p50 %v, p99 %v, max %v", len(lat), q(0.5), q(0.99), lat[len(lat)-1])
}

// ruleEvent is an IPv4 rule notification at priority 900 and when it
// arrived.
type ruleEvent struct {
	typ uint16 // RTM_NEWRULE or RTM_DELRULE
	at  time.Time
}

// listenRules reads the namespace's IPv4 rule notifications on a socket of
// its own, stamping each as it arrives; it stops when the benchmark ends.
func listenRules(b *testing.B, s *seed) <-chan ruleEvent {
	c, err := netwatch.KernelDialer{NetNS: s.ns.FD()}.Dial(netwatch.DialConfig{Groups: []uint32{unix.RTNLGRP_IPV4_RULE}})
	if err != nil {
		b.Fatal(err)
	}
	ch := make(chan ruleEvent, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			for m, err := range c.ReceiveIter() {
				if err != nil {
					return
				}
				now := time.Now()
				// fib_rule_hdr: family, dst_len, src_len, tos, table,
				// res1, res2, action, flags; then FRA_PRIORITY among the
				// attributes.
				ad, err := netlink.NewAttributeDecoder(m.Data[12:])
				if err != nil {
					continue
				}
				for ad.Next() {
					if ad.Type() == unix.FRA_PRIORITY && ad.Uint32() == 900 {
						ch <- ruleEvent{uint16(m.Header.Type), now}
					}
				}
			}
		}
	}()
	b.Cleanup(func() { c.SetReadDeadline(time.Unix(1, 0)); <-done; c.Close() })
	return ch
}

// restoreOnce deletes the rule at 900 and returns the time between the
// notifications of its deletion and of its restoration.
func restoreOnce(b *testing.B, events <-chan ruleEvent, ap *netwatch.Applier) time.Duration {
	b.Helper()
	for len(events) > 0 {
		<-events
	}
	rule := netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable,
		Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 109}
	if _, err := ap.Apply([]netwatch.Op{{Kind: netwatch.RuleDelete, Rule: rule}}); err != nil {
		b.Fatal(err)
	}
	timeout := time.NewTimer(5 * time.Second)
	defer timeout.Stop()
	var deleted time.Time
	for {
		select {
		case ev := <-events:
			switch {
			case ev.typ == unix.RTM_DELRULE:
				deleted = ev.at
			case ev.typ == unix.RTM_NEWRULE && !deleted.IsZero():
				return ev.at.Sub(deleted)
			}
		case <-timeout.C:
			b.Fatal("the rule was not restored within 5 s")
		}
	}
}

// BenchmarkKernelIdle runs the agent on a converged node for 60 s with
// nothing happening and reports the CPU time it used (utime+stime from
// /proc/PID/stat, in clock ticks, and the threads' schedstat run time in
// nanoseconds) and its resident memory (VmRSS).
func BenchmarkKernelIdle(b *testing.B) {
	idle := time.Minute
	if v := os.Getenv("MARKSPLIT_BENCH_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("MARKSPLIT_BENCH_IDLE: %v", err)
		}
		idle = d
	}
	s := newSeed(b, true)
	for range b.N {
		a := s.start(b, append(seedArgs, "--metrics-addr=127.0.0.1:9184")...)
		eventually(b, 5*time.Second, "split", func() error { return s.splitAt(b, 1355) })
		pid := a.cmd.Process.Pid
		// Let the first pass's own events settle, then measure.
		ticks0, run0 := cpuTime(b, pid)
		t := time.NewTimer(idle)
		<-t.C
		ticks1, run1 := cpuTime(b, pid)
		rss := vmRSS(b, pid)
		if code, _ := a.stop(b, syscall.SIGTERM); code != 0 {
			b.Fatalf("agent exit %d", code)
		}
		b.ReportMetric(float64(ticks1-ticks0)*1000/clockTicks, "cpu-ms(stat)")
		b.ReportMetric(float64(run1-run0)/1e6, "cpu-ms(schedstat)")
		b.ReportMetric(float64(rss)/1024, "rss-MiB")
		b.ReportMetric(0, "ns/op")
		b.Logf("idle %v: utime+stime %d ticks (%.0f ms), schedstat %.3f ms, VmRSS %d KiB",
			idle, ticks1-ticks0, float64(ticks1-ticks0)*1000/clockTicks, float64(run1-run0)/1e6, rss)
	}
}

// clockTicks is USER_HZ, the unit of utime and stime: 100 on Linux.
const clockTicks = 100

// cpuTime returns utime+stime of pid in clock ticks and the run time of
// all its threads in nanoseconds.
func cpuTime(b *testing.B, pid int) (ticks, runNS uint64) {
	b.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command may hold spaces: the fields start after the last ')'.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseUint(f[11], 10, 64) // field 14
	stime, _ := strconv.ParseUint(f[12], 10, 64) // field 15
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range tasks {
		ss, err := os.ReadFile(p)
		if err != nil {
			continue // a thread that just ended
		}
		if n, err := strconv.ParseUint(strings.Fields(string(ss))[0], 10, 64); err == nil {
			runNS += n
		}
	}
	return utime + stime, runNS
}

func vmRSS(b *testing.B, pid int) uint64 {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
