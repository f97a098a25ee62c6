//go:build linux

package main

import (
	"bufio"
	"errors"
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

// benchAgent is an agent binary a benchmark runs, with env as its
// environment (nil: the test's).
type benchAgent struct {
	name, bin string
	env       []string
}

// benchAgents are the agents a benchmark compares: this tree's, and the
// one MARKSPLIT_BENCH_BASE names (say, built from the commit before a
// change) when it is set, so that a change is measured against what came
// before in one run.
func benchAgents(b *testing.B) []benchAgent {
	as := []benchAgent{{name: "new", bin: agentBinary(b)}}
	if base := os.Getenv("MARKSPLIT_BENCH_BASE"); base != "" {
		as = append(as, benchAgent{name: "base", bin: base})
	}
	return as
}

// BenchmarkKernelRuleRestore measures the time from a foreign deletion of
// the rule to its restoration, as an independent rtnetlink listener in the
// namespace sees them: from the RTM_DELRULE notification of the deletion
// to the RTM_NEWRULE of the restored rule, with 1,000 and 100,000 routes
// in the main table that the split does not select. A deletion of the
// agent's rule comes every 150 ms (MARKSPLIT_BENCH_RESTORE_EVERY, a
// duration), 300 times (MARKSPLIT_BENCH_RESTORES): slower than the repair
// rate limit's refill, so that this is the latency of a repair, not the
// pace of a fight (BenchmarkKernelFight). Halfway between two, the floor
// repairer (floorRepairer), running beside the agent in the namespace,
// gets a deletion of its own rule: the machine's own latency, measured by
// turns with the agent's so that both meet the same moments of this
// machine, for ratios. It reports p50, p99, max and how many were not
// restored within a second (late), for the agent and for the floor.
func BenchmarkKernelRuleRestore(b *testing.B) {
	trials := envInt(b, "MARKSPLIT_BENCH_RESTORES", 300)
	every := envDuration(b, "MARKSPLIT_BENCH_RESTORE_EVERY", 150*time.Millisecond)
	for _, n := range []int{1000, 100000} {
		s := newSeed(b, true)
		loadRoutes(b, s, n)
		events := listenRules(b, s)
		ap, err := netwatch.DialApplier(s.netns(b))
		if err != nil {
			b.Fatal(err)
		}
		for _, ag := range benchAgents(b) {
			b.Run(fmt.Sprintf("routes=%d/agent=%s", n, ag.name), func(b *testing.B) {
				var lat, floor []time.Duration
				late, floorLate := 0, 0
				for range b.N {
					f := s.startBinEnv(b, os.Args[0], append(os.Environ(), floorEnv+"=1"))
					eventually(b, 10*time.Second, "the floor repairer ready", func() error {
						if !strings.Contains(f.out.String(), "ready") {
							return errors.New("not yet")
						}
						return nil
					})
					if _, err := ap.Apply([]netwatch.Op{{Kind: netwatch.RuleAdd, Rule: floorRule}}); err != nil {
						b.Fatal(err)
					}
					a := s.startBinEnv(b, ag.bin, ag.env, append(seedArgs, "--metrics-addr=")...)
					eventually(b, 30*time.Second, "split", func() error { return s.splitAt(b, 1355) })
					for range trials {
						start := time.Now()
						if d, ok := restoreOnce(b, events, ap, benchRule); ok {
							lat = append(lat, d)
						} else if late++; late > 3 {
							break // this agent has given up repairing for a while
						} else {
							eventually(b, 5*time.Minute, "the rule back", func() error { return s.splitAt(b, 1355) })
						}
						time.Sleep(time.Until(start.Add(every / 2)))
						if d, ok := restoreOnce(b, events, ap, floorRule); ok {
							floor = append(floor, d)
						} else if floorLate++; floorLate > 3 {
							b.Fatalf("the floor repairer missed %d deletions:\n%s", floorLate, f.out.String())
						} else if _, err := ap.Apply([]netwatch.Op{{Kind: netwatch.RuleAdd, Rule: floorRule}}); err != nil {
							b.Fatal(err)
						}
						time.Sleep(time.Until(start.Add(every))) // the pace of the deletions
					}
					if code, _ := a.stop(b, syscall.SIGTERM); code != 0 {
						b.Fatalf("agent exit %d", code)
					}
					f.stop(b, syscall.SIGTERM)
					if _, err := ap.Apply([]netwatch.Op{{Kind: netwatch.RuleDelete, Rule: floorRule}}); err != nil {
						b.Fatal(err)
					}
				}
				q := reportLatencies(b, "", lat, late)
				fq := reportLatencies(b, "floor-", floor, floorLate)
				if fq[0] > 0 && fq[1] > 0 {
					b.ReportMetric(float64(q[1])/float64(fq[1]), "p99/floor")
					b.Logf("%s: p50 %v = %.1f× the floor's (%v), p99 %v = %.1f× the floor's (%v)", ag.name,
						q[0], float64(q[0])/float64(fq[0]), fq[0], q[1], float64(q[1])/float64(fq[1]), fq[1])
				}
			})
		}
		ap.Close()
	}
}

// reportLatencies reports p50, p99 and max of lat in milliseconds and the
// count of late ones, each metric's name after prefix, and returns p50 and
// p99.
func reportLatencies(b *testing.B, prefix string, lat []time.Duration, late int) [2]time.Duration {
	b.Helper()
	b.ReportMetric(float64(late), prefix+"late")
	b.ReportMetric(0, "ns/op")
	if len(lat) == 0 {
		b.Logf("%snothing restored in time; %d late", prefix, late)
		return [2]time.Duration{}
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[min(len(lat)-1, int(float64(len(lat))*p))] }
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(q(0.50)), prefix+"p50-ms")
	b.ReportMetric(ms(q(0.99)), prefix+"p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), prefix+"max-ms")
	b.Logf("%s%d restored: p50 %v, p99 %v, max %v; %d late", prefix, len(lat), q(0.5), q(0.99), lat[len(lat)-1], late)
	return [2]time.Duration{q(0.5), q(0.99)}
}

// ruleEvent is an IPv4 rule notification of benchRule's or floorRule's
// priority and when it arrived.
type ruleEvent struct {
	typ  uint16 // RTM_NEWRULE or RTM_DELRULE
	prio uint32
	at   time.Time
}

// listenRules reads the namespace's IPv4 rule notifications on a socket of
// its own, stamping each as it arrives; it stops when the benchmark ends.
func listenRules(b *testing.B, s *seed) <-chan ruleEvent {
	c := listen(b, s, unix.RTNLGRP_IPV4_RULE)
	ch := make(chan ruleEvent, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msgs, err := c.Receive()
			if err != nil {
				return
			}
			for _, m := range msgs {
				if p := rulePriority(m.Data); p == benchRule.Priority || p == floorRule.Priority {
					ch <- ruleEvent{uint16(m.Header.Type), p, time.Now()}
				}
			}
		}
	}()
	b.Cleanup(func() { c.SetReadDeadline(time.Unix(1, 0)); <-done; c.Close() })
	return ch
}

// benchRule is the agent's rule with seedArgs (splitRule in the fake kernel's terms).
var benchRule = netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable,
	Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 109}

// restoreOnce deletes rule and returns the time between the notifications
// of its deletion and of its restoration, or false when it was not
// restored within a second.
func restoreOnce(b *testing.B, events <-chan ruleEvent, ap *netwatch.Applier, rule netwatch.Rule) (time.Duration, bool) {
	b.Helper()
	for len(events) > 0 {
		<-events
	}
	if _, err := ap.Apply([]netwatch.Op{{Kind: netwatch.RuleDelete, Rule: rule}}); err != nil {
		b.Fatal(err)
	}
	timeout := time.NewTimer(time.Second)
	defer timeout.Stop()
	var deleted, restored time.Time
	for {
		select {
		case ev := <-events:
			switch {
			case ev.prio != rule.Priority:
			case ev.typ == unix.RTM_DELRULE && !restored.IsZero():
				// The kernel announces a rule change after releasing the
				// RTNL lock: a repairer that acts while the deletion is
				// still being announced can have its addition reach this
				// listener first. The repair took less than the gap.
				return ev.at.Sub(restored), true
			case ev.typ == unix.RTM_DELRULE:
				deleted = ev.at
			case ev.typ == unix.RTM_NEWRULE && deleted.IsZero():
				restored = ev.at
			case ev.typ == unix.RTM_NEWRULE:
				return ev.at.Sub(deleted), true
			}
		case <-timeout.C:
			return 0, false
		}
	}
}

// BenchmarkKernelIdle runs the agent on a converged node for 60 s with
// nothing happening and reports the CPU time it used (utime+stime from
// /proc/PID/stat, in clock ticks, and the threads' schedstat run time in
// nanoseconds) and its resident memory (VmRSS).
func BenchmarkKernelIdle(b *testing.B) {
	idle := envDuration(b, "MARKSPLIT_BENCH_IDLE", time.Minute)
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
func cpuTime(b testing.TB, pid int) (ticks, runNS uint64) {
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

func vmRSS(b testing.TB, pid int) uint64 {
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

// routeEvent is an IPv4 notification about 10.0.0.0/16 and when it came.
type routeEvent struct {
	typ   uint16
	table uint32
	at    time.Time
}

// listenRoutes reads the namespace's IPv4 route notifications about
// 10.0.0.0/16 on a socket of its own, stamping each as it arrives.
func listenRoutes(b *testing.B, s *seed) <-chan routeEvent {
	c := listen(b, s, unix.RTNLGRP_IPV4_ROUTE)
	ch := make(chan routeEvent, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msgs, err := c.Receive()
			if err != nil {
				return
			}
			for _, m := range msgs {
				now := time.Now()
				// rtmsg: family, dst_len, ...; then RTA_DST and RTA_TABLE.
				if len(m.Data) < unix.SizeofRtMsg || m.Data[1] != 16 {
					continue
				}
				ad, err := netlink.NewAttributeDecoder(m.Data[unix.SizeofRtMsg:])
				if err != nil {
					continue
				}
				var dst []byte
				var table uint32
				for ad.Next() {
					switch ad.Type() {
					case unix.RTA_DST:
						dst = ad.Bytes()
					case unix.RTA_TABLE:
						table = ad.Uint32()
					}
				}
				if len(dst) == 4 && dst[0] == 10 && dst[1] == 0 {
					ch <- routeEvent{uint16(m.Header.Type), table, now}
				}
			}
		}
	}()
	b.Cleanup(func() { c.SetReadDeadline(time.Unix(1, 0)); <-done; c.Close() })
	return ch
}

// envInt is an integer from the environment, or def.
func envInt(b *testing.B, name string, def int) int { return envValue(b, name, def, strconv.Atoi) }

// envDuration is the duration the environment variable name gives, or def.
func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	return envValue(b, name, def, time.ParseDuration)
}

// envValue is the environment variable name parsed by parse, or def when
// it is unset; a value parse refuses fails the benchmark.
func envValue[T any](b *testing.B, name string, def T, parse func(string) (T, error)) T {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return x
}

// fightWarnings counts the agent's fight warnings.
func fightWarnings(a *agentProc) int { return strings.Count(a.out.String(), `"msg":"fight: `) }

// BenchmarkKernelUnderlayFlap bounces the underlay link 20 times, a second
// apart (MARKSPLIT_BENCH_FLAPS), the DHCP client adding its routes back
// each time as the old approach left them (MTU lowered), and measures the
// time from the notification of the DHCP client's 10.0.0.0/16 to that of
// the agent's copy in table 900. It reports p50, max, how many took more
// than a second (late), and the agent's fight warnings (there must be none:
// the kernel's flush is no fight).
func BenchmarkKernelUnderlayFlap(b *testing.B) {
	flaps := envInt(b, "MARKSPLIT_BENCH_FLAPS", 20)
	for _, ag := range benchAgents(b) {
		b.Run("agent="+ag.name, func(b *testing.B) {
			s := newSeed(b, true)
			events := listenRoutes(b, s)
			var lat []time.Duration
			late, warnings := 0, 0
			for range b.N {
				a := s.startBin(b, ag.bin, append(seedArgs, "--metrics-addr=")...)
				eventually(b, 5*time.Second, "split", func() error { return s.splitAt(b, 1355) })
				for range flaps {
					start := time.Now()
					s.ns.IP(b, "link", "set", "enp7s0", "down")
					eventually(b, time.Second, "nothing left to split", func() error { return s.unsplit(b) })
					s.ns.IP(b, "link", "set", "enp7s0", "up")
					for len(events) > 0 {
						<-events
					}
					s.dhcp(b, true)
					if d, ok := rebuilt(events, 5*time.Second); ok && d <= time.Second {
						lat = append(lat, d)
					} else {
						late++
					}
					time.Sleep(time.Until(start.Add(time.Second))) // the pace of the flaps
				}
				warnings += fightWarnings(a)
				if code, _ := a.stop(b, syscall.SIGTERM); code != 0 {
					b.Fatalf("agent exit %d", code)
				}
			}
			b.ReportMetric(float64(warnings), "warnings")
			reportLatencies(b, "", lat, late)
		})
	}
}

// rebuilt returns the time from the main table's 10.0.0.0/16 appearing to
// table 900's, or false when that takes longer than timeout.
func rebuilt(events <-chan routeEvent, timeout time.Duration) (time.Duration, bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	var added time.Time
	for {
		select {
		case ev := <-events:
			switch {
			case ev.typ != unix.RTM_NEWROUTE:
			case ev.table == unix.RT_TABLE_MAIN && added.IsZero():
				added = ev.at
			case ev.table == 900 && !added.IsZero():
				return ev.at.Sub(added), true
			}
		case <-t.C:
			return 0, false
		}
	}
}

// BenchmarkKernelFight runs one long-lived program that deletes the rule as
// fast as it can (`yes 'rule del pref 900' | ip -force -batch -`) for 10 s
// (MARKSPLIT_BENCH_FIGHT, a duration) and reports the agent's CPU over the
// fight as a share of one core, its fight warnings, and how long the rule
// took to come back after the program stopped.
func BenchmarkKernelFight(b *testing.B) {
	fight := envDuration(b, "MARKSPLIT_BENCH_FIGHT", 10*time.Second)
	for _, ag := range benchAgents(b) {
		b.Run("agent="+ag.name, func(b *testing.B) {
			s := newSeed(b, true)
			for range b.N {
				a := s.startBin(b, ag.bin, append(seedArgs, "--metrics-addr=")...)
				eventually(b, 5*time.Second, "split", func() error { return s.splitAt(b, 1355) })
				pid := a.cmd.Process.Pid
				_, run0 := cpuTime(b, pid)
				start := time.Now()
				f := s.ns.StartFighter(b, "rule del pref 900")
				time.Sleep(fight) // the length of the fight, not a wait for a condition
				f.Stop()
				_, run1 := cpuTime(b, pid)
				wall := time.Since(start)
				stopped := time.Now()
				back := time.Duration(-1)
				deadline := stopped.Add(5 * time.Minute)
				for time.Now().Before(deadline) {
					if s.splitAt(b, 1355) == nil {
						back = time.Since(stopped)
						break
					}
					time.Sleep(2 * time.Millisecond) // polling ip(8), which has no event to wait on
				}
				warnings := fightWarnings(a)
				if code, _ := a.stop(b, syscall.SIGTERM); code != 0 {
					b.Fatalf("agent exit %d", code)
				}
				cpu := float64(run1-run0) / float64(wall.Nanoseconds()) * 100
				b.ReportMetric(cpu, "cpu-%")
				b.ReportMetric(float64(warnings), "warnings")
				b.ReportMetric(float64(back.Microseconds())/1000, "back-ms")
				b.ReportMetric(0, "ns/op")
				b.Logf("fight of %v: agent CPU %.1f%% of a core, %d warnings, rule back %v after the program stopped", fight, cpu, warnings, back)
			}
		})
	}
}

// netns opens the seed's namespace for netwatch.Options; it is closed when
// the benchmark ends.
func (s *seed) netns(tb testing.TB) *netwatch.NetNS {
	tb.Helper()
	ns, err := netwatch.OpenNetNS(s.ns.Path())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ns.Close() })
	return ns
}

// listen opens a socket of its own in the seed's namespace, joined to one
// rtnetlink group.
func listen(b *testing.B, s *seed, group uint32) *netlink.Conn {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: s.ns.FD()})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.JoinGroup(group); err != nil {
		c.Close()
		b.Fatal(err)
	}
	return c
}

// BenchmarkKernelUnrelatedLinks measures what an unrelated link costs the
// agent, as pod veths do all day on a node: a spare veth pair that carries
// nothing (its peer up, so each up brings carrier and IPv6's link-local
// address) goes up and down 40 times (MARKSPLIT_BENCH_LINK_CHANGES), 50 ms
// apart, with N routes in the main table that the split does not select.
// It reports the agent's CPU (schedstat) from the first change until the
// agent is idle after the last, per table size: the ratio of the two sizes is what
// matters, and it should not grow with the table.
func BenchmarkKernelUnrelatedLinks(b *testing.B) {
	changes := envInt(b, "MARKSPLIT_BENCH_LINK_CHANGES", 40)
	for _, n := range []int{1000, 100000} {
		s := newSeed(b, true)
		loadRoutes(b, s, n)
		s.ns.IP(b, "link", "add", "spare0", "type", "veth", "peer", "name", "spare1")
		s.ns.IP(b, "link", "set", "spare1", "up")
		for _, ag := range benchAgents(b) {
			b.Run(fmt.Sprintf("routes=%d/agent=%s", n, ag.name), func(b *testing.B) {
				for range b.N {
					a := s.startBin(b, ag.bin, append(seedArgs, "--metrics-addr=")...)
					eventually(b, 30*time.Second, "split", func() error { return s.splitAt(b, 1355) })
					pid := a.cmd.Process.Pid
					waitIdle(b, pid) // the first passes and their own events are done
					_, run0 := cpuTime(b, pid)
					for i := range changes {
						state := "up"
						if i%2 == 1 {
							state = "down"
						}
						s.ns.IP(b, "link", "set", "spare0", state)
						time.Sleep(50 * time.Millisecond) // the pace of the changes
					}
					waitIdle(b, pid) // what the last change costs after it, until the agent is idle
					_, run1 := cpuTime(b, pid)
					if code, _ := a.stop(b, syscall.SIGTERM); code != 0 {
						b.Fatalf("agent exit %d", code)
					}
					s.ns.IP(b, "link", "set", "spare0", "down")
					cpu := float64(run1-run0) / 1e6
					b.ReportMetric(cpu, "cpu-ms")
					b.ReportMetric(0, "ns/op")
					b.Logf("%d routes, %d changes of an unrelated link: agent CPU %.1f ms", n, changes, cpu)
				}
			})
		}
	}
}

// waitIdle waits until process pid has used less than a millisecond of CPU
// in a quarter of a second.
func waitIdle(b *testing.B, pid int) {
	b.Helper()
	_, last := cpuTime(b, pid)
	since := time.Now()
	eventually(b, 30*time.Second, "the agent idle", func() error {
		if time.Since(since) < 250*time.Millisecond {
			return errors.New("still measuring")
		}
		_, now := cpuTime(b, pid)
		used := time.Duration(now - last)
		last, since = now, time.Now()
		if used >= time.Millisecond {
			return fmt.Errorf("%v of CPU in the last 250 ms", used)
		}
		return nil
	})
}

// loadRoutes adds n /24 routes from 11.0.0.0/24 upwards via the gateway to
// the main table, proto bgp, with ip -batch.
func loadRoutes(b *testing.B, s *seed, n int) {
	b.Helper()
	s.ns.AddRoutes(b, n, "10.0.0.1", "enp7s0")
}

// BenchmarkKernelUnderlayMTUToggle changes the underlay's MTU back and
// forth every 20 ms for 5 s (MARKSPLIT_BENCH_TOGGLE) with 100,000 routes
// through it that the split selects (--underlay-link), so that every change
// makes the agent re-derive and re-plan the whole table, and reports the
// agent's CPU over that time and until it is idle again, as a share of the
// wall time: what a program toggling an MTU costs the agent (issue 22: 160 ms
// a change, without limit; a pass's policy and plan now space the passes
// after them to a fifth of a CPU).
func BenchmarkKernelUnderlayMTUToggle(b *testing.B) {
	toggle := envDuration(b, "MARKSPLIT_BENCH_TOGGLE", 5*time.Second)
	n := envInt(b, "MARKSPLIT_BENCH_TOGGLE_ROUTES", 100000)
	s := newSeed(b, true)
	loadRoutes(b, s, n)
	for _, ag := range benchAgents(b) {
		b.Run(fmt.Sprintf("routes=%d/agent=%s", n, ag.name), func(b *testing.B) {
			for range b.N {
				a := s.startBin(b, ag.bin, "--underlay-link=enp7s0", "--encryption=on", "--metrics-addr=")
				eventually(b, 60*time.Second, "split", func() error { return s.splitAt(b, 1355) })
				pid := a.cmd.Process.Pid
				waitIdle(b, pid)
				_, run0 := cpuTime(b, pid)
				start := time.Now()
				changes := 0
				for time.Since(start) < toggle {
					s.ns.IP(b, "link", "set", "enp7s0", "mtu", strconv.Itoa(1440+10*(changes%2)))
					changes++
					time.Sleep(20 * time.Millisecond) // the pace of the changes
				}
				waitIdle(b, pid)
				wall := time.Since(start)
				_, run1 := cpuTime(b, pid)
				if code, _ := a.stop(b, syscall.SIGTERM); code != 0 {
					b.Fatalf("agent exit %d", code)
				}
				s.ns.IP(b, "link", "set", "enp7s0", "mtu", "1450")
				cpu := time.Duration(run1 - run0)
				b.ReportMetric(float64(cpu.Milliseconds()), "cpu-ms")
				b.ReportMetric(cpu.Seconds()/wall.Seconds(), "cpu-share")
				b.ReportMetric(0, "ns/op")
				b.Logf("%d routes, %d MTU changes in %v: agent CPU %v until idle after %v (%.2f of a CPU)",
					n, changes, toggle, cpu.Round(time.Millisecond), wall.Round(time.Millisecond), cpu.Seconds()/wall.Seconds())
			}
		})
	}
}
