//go:build linux

package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The scale simulation of --peers=auto: thousands of CiliumNodes on the
// stand-in API server, the built agent in the seed's node namespace, and
// churn (peers joining, leaving, opting out, opting in, changing address).
// Every peer address lies in 10.0.0.0/16, reached through 10.0.0.1, so
// each encrypting peer is one /32 in table 900.
//
//	go test -run '^$' -bench KernelPeers5000 -benchtime 1x ./agent
//
// MARKSPLIT_BENCH_CHANGES sets the number of changes (default 250).

// scaleCase is one run of the simulation.
type scaleCase struct {
	nodes   int           // CiliumNodes, this node included
	changes int           // changes timed one after the other
	steady  time.Duration // steady-state window for the API request rate; 0 skips it
	rss     bool          // measure the memory per peer against an agent with no peers
}

// scaleResult is what a run measured.
type scaleResult struct {
	initial     time.Duration   // agent start to every peer's route in the table
	converge    []time.Duration // per change: the API call to the last route event it causes
	cpuPerChg   time.Duration   // the agent's CPU time over the churn, per change
	rssPerPeer  float64         // bytes
	rss0, rss1  uint64          // KiB, with no peers and with every peer
	rss2        uint64          // KiB, with every peer after the churn and the steady state
	heap0       float64         // bytes of Go heap in use (go_memstats_heap_inuse_bytes) with no peers,
	heap1       float64         // with every peer,
	heap2       float64         // and after the churn and the steady state
	reqPerHour  float64         // API requests of one node per hour, scaled (see steadyRequests)
	steadyCount map[apitest.Kind]int
}

// Scaled-down API server timings: a watch lasts MinRequestTimeout × [1, 2)
// (kube-apiserver's --min-request-timeout is 1800 s), bookmarks come every
// BookmarkInterval (about a minute on a real server).
const (
	scaledMinRequestTimeout = 2 * time.Second
	realMinRequestTimeout   = 1800 * time.Second
	scaledBookmarkInterval  = time.Second
)

// peerAddr is the InternalIP of peer i: 10.0.20.1 onward, 250 a /24.
func peerAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 0, byte(20 + i/250), byte(1 + i%250)})
}

func peerNode(i int, addr netip.Addr, key int64) apitest.Node {
	return apitest.Node{Name: fmt.Sprintf("node-%05d", i), InternalIPs: []string{addr.String()}, Key: key}
}

func BenchmarkKernelPeers5000(b *testing.B) {
	c := scaleCase{nodes: 5000, changes: envInt(b, "MARKSPLIT_BENCH_CHANGES", 250), steady: 30 * time.Second, rss: true}
	for range b.N {
		r := runScale(b, c)
		slices.Sort(r.converge)
		p := func(q float64) time.Duration { return r.converge[int(q*float64(len(r.converge)-1))] }
		b.ReportMetric(r.initial.Seconds(), "initial-s")
		b.ReportMetric(float64(p(0.5).Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(p(0.99).Microseconds())/1000, "p99-ms")
		b.ReportMetric(float64(r.converge[len(r.converge)-1].Microseconds())/1000, "max-ms")
		b.ReportMetric(float64(r.cpuPerChg.Microseconds())/1000, "cpu-ms/change")
		b.ReportMetric(r.rssPerPeer, "rss-B/peer")
		b.ReportMetric(r.reqPerHour, "api-req/node/h")
		b.ReportMetric(0, "ns/op")
		late := 0
		for _, d := range r.converge {
			if d > time.Second {
				late++
			}
		}
		b.Logf("%d CiliumNodes: all %d peers in table 900 %v after the agent started", c.nodes, c.nodes-1, r.initial.Round(time.Millisecond))
		b.Logf("%d changes: convergence p50 %v, p99 %v, max %v; %d over 1 s", len(r.converge), p(0.5), p(0.99), r.converge[len(r.converge)-1], late)
		b.Logf("agent CPU per change %v (utime+stime and schedstat over the churn, divided)", r.cpuPerChg)
		b.Logf("VmRSS %d KiB with no peers, %d KiB with %d: %.0f bytes per peer; %d KiB after the churn and the steady state",
			r.rss0, r.rss1, c.nodes-1, r.rssPerPeer, r.rss2)
		b.Logf("Go heap in use %.1f MiB with no peers, %.1f MiB with %d (%.0f bytes per peer, garbage since the last GC included), %.1f MiB after the churn",
			r.heap0/(1<<20), r.heap1/(1<<20), c.nodes-1, (r.heap1-r.heap0)/float64(c.nodes-1), r.heap2/(1<<20))
		b.Logf("steady state %v (watches end every %v–%v, bookmarks every %v): requests %v = %.2f per node per hour at --min-request-timeout=%v",
			c.steady, scaledMinRequestTimeout, 2*scaledMinRequestTimeout, scaledBookmarkInterval, r.steadyCount, r.reqPerHour, realMinRequestTimeout)
	}
}

// A small run of the simulation as a test: every change reaches the table.
func TestKernelPeersChurn(t *testing.T) {
	r := runScale(t, scaleCase{nodes: 300, changes: 25})
	if len(r.converge) != 25 {
		t.Errorf("%d changes timed, want 25", len(r.converge))
	}
}

func runScale(tb testing.TB, c scaleCase) scaleResult {
	tb.Helper()
	var r scaleResult
	s := newSeed(tb, false)
	api := newPeerAPI(tb, s, apitest.Options{MinRequestTimeout: scaledMinRequestTimeout, BookmarkInterval: scaledBookmarkInterval})
	self := apitest.Node{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255}
	args := append(peerArgs, "--metrics-addr=127.0.0.1:9184")
	get := nsGetter(s)
	ready := func() { readyWithin(tb, get, 30*time.Second) }
	settle := func() { <-time.After(2 * time.Second) } // a measurement interval, not a wait for a condition

	if c.rss {
		api.srv.MustPut(tb, self)
		a := s.startBinEnv(tb, agentBinary(tb), api.env, args...)
		ready()
		settle()
		r.rss0, r.heap0 = vmRSS(tb, a.cmd.Process.Pid), heapInuse(tb, get)
		if code, _ := a.stop(tb, syscall.SIGTERM); code != 0 {
			tb.Fatalf("agent exit %d", code)
		}
	}

	// Every node, then the agent: its first list takes them all.
	nodes := []apitest.Node{self}
	addrs := make(map[string]netip.Addr) // by node name, of the encrypting peers
	next := 0                            // the next fresh address
	for ; next < c.nodes-1; next++ {
		n := peerNode(next, peerAddr(next), 255)
		nodes = append(nodes, n)
		addrs[n.Name] = peerAddr(next)
	}
	if _, err := api.srv.Replace(nodes...); err != nil {
		tb.Fatal(err)
	}
	events := listenHostRoutes(tb, s)
	start := time.Now()
	a := s.startBinEnv(tb, agentBinary(tb), api.env, args...)
	pid := a.cmd.Process.Pid
	for added := 0; added < c.nodes-1; {
		ev := nextRoute(tb, events, 60*time.Second, "the initial routes")
		if ev.add {
			added++
		}
		r.initial = ev.at.Sub(start)
	}
	ready()
	if c.rss {
		settle()
		r.rss1, r.heap1 = vmRSS(tb, pid), heapInuse(tb, get)
		r.rssPerPeer = float64(int64(r.rss1)-int64(r.rss0)) * 1024 / float64(c.nodes-1)
	}

	// Churn, one change at a time: each is timed from the API call to the
	// last route event it causes.
	ticks0, run0 := cpuTime(tb, pid)
	optedOut := map[string]netip.Addr{}
	for i := range c.changes {
		var want []hostRoute
		var t0 time.Time
		victim := fmt.Sprintf("node-%05d", i) // an encrypting peer, each once
		switch i % 5 {
		case 0: // a node joins
			n := peerNode(next, peerAddr(next), 255)
			addrs[n.Name] = peerAddr(next)
			next++
			want = []hostRoute{{true, addrs[n.Name]}}
			t0 = time.Now()
			api.srv.MustPut(tb, n)
		case 1: // a node leaves
			want = []hostRoute{{false, addrs[victim]}}
			delete(addrs, victim)
			t0 = time.Now()
			api.srv.Delete(victim)
		case 2: // a node opts out
			optedOut[victim] = addrs[victim]
			want = []hostRoute{{false, addrs[victim]}}
			delete(addrs, victim)
			t0 = time.Now()
			api.srv.SetKey(victim, 0)
		case 3: // the node that opted out opts in again
			back := fmt.Sprintf("node-%05d", i-1)
			addrs[back] = optedOut[back]
			want = []hostRoute{{true, addrs[back]}}
			t0 = time.Now()
			api.srv.SetKey(back, 255)
		case 4: // a node changes address
			old := addrs[victim]
			addrs[victim] = peerAddr(next)
			next++
			want = []hostRoute{{true, addrs[victim]}, {false, old}}
			t0 = time.Now()
			api.srv.SetAddrs(victim, addrs[victim].String())
		}
		var last time.Time
		for len(want) > 0 {
			ev := nextRoute(tb, events, 5*time.Second, fmt.Sprintf("change %d's routes %v", i, want))
			if j := slices.Index(want, ev.hostRoute); j >= 0 {
				want = slices.Delete(want, j, j+1)
				last = ev.at
			}
		}
		r.converge = append(r.converge, last.Sub(t0))
	}
	ticks1, run1 := cpuTime(tb, pid)
	if c.changes > 0 {
		// schedstat counts in nanoseconds; utime+stime only in ticks.
		r.cpuPerChg = time.Duration((run1 - run0) / uint64(c.changes))
		tb.Logf("churn: utime+stime %d ticks, schedstat %v", ticks1-ticks0, time.Duration(run1-run0))
	}

	if c.steady > 0 {
		r.steadyCount, r.reqPerHour = steadyRequests(tb, api.srv, c.steady)
	}
	if c.rss {
		r.rss2, r.heap2 = vmRSS(tb, pid), heapInuse(tb, get)
	}
	if got := strings.Count(s.ns.IP(tb, "-4", "route", "show", "table", "900"), "\n"); got != len(addrs) {
		tb.Errorf("table 900 holds %d routes, want %d (one per encrypting peer)", got, len(addrs))
	}
	if code, _ := a.stop(tb, syscall.SIGTERM); code != 0 {
		tb.Fatalf("agent exit %d", code)
	}
	return r
}

// steadyRequests counts the API requests of the agent over a window in
// which nothing changes, and scales them to a real API server: a watch
// lasts scaledMinRequestTimeout × [1, 2) here and realMinRequestTimeout ×
// [1, 2) there, so the same count spreads over realMinRequestTimeout /
// scaledMinRequestTimeout times as long. A list in the window would be a
// full re-read of every node.
func steadyRequests(tb testing.TB, srv *apitest.Server, window time.Duration) (map[apitest.Kind]int, float64) {
	tb.Helper()
	srv.ResetCounts()
	<-time.After(window) // the window measured, not a wait for a condition
	counts := srv.Counts()
	if counts[apitest.KindList] != 0 {
		tb.Errorf("%d list requests in steady state: the watch is healthy, nothing should be read again", counts[apitest.KindList])
	}
	n := 0
	for _, c := range counts {
		n += c
	}
	scale := float64(realMinRequestTimeout) / float64(scaledMinRequestTimeout)
	return counts, float64(n) / (window.Hours() * scale)
}

// hostRoute is a route to one address in table 900, added or removed.
type hostRoute struct {
	add  bool
	addr netip.Addr
}

type hostRouteEvent struct {
	hostRoute
	at time.Time
}

func (h hostRoute) String() string {
	if h.add {
		return "+" + h.addr.String()
	}
	return "-" + h.addr.String()
}

// listenHostRoutes reports the IPv4 /32 routes of table 900 that come and
// go in s's node namespace, stamped as they arrive, on a socket of its own.
func listenHostRoutes(tb testing.TB, s *seed) <-chan hostRouteEvent {
	tb.Helper()
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: s.ns.FD(), Groups: 1 << (unix.RTNLGRP_IPV4_ROUTE - 1)})
	if err != nil {
		tb.Fatal(err)
	}
	if err := c.SetReadBuffer(16 << 20); err != nil {
		tb.Fatal(err)
	}
	ch := make(chan hostRouteEvent, 1<<16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		for {
			msgs, err := c.Receive()
			if err != nil {
				return
			}
			now := time.Now()
			for _, m := range msgs {
				var rm rtnetlink.RouteMessage
				if rm.UnmarshalBinary(m.Data) != nil || rm.DstLength != 32 || rm.Attributes.Table != 900 {
					continue
				}
				a, ok := netip.AddrFromSlice(rm.Attributes.Dst)
				if !ok {
					continue
				}
				ch <- hostRouteEvent{hostRoute{m.Header.Type == unix.RTM_NEWROUTE, a.Unmap()}, now}
			}
		}
	}()
	tb.Cleanup(func() { c.SetReadDeadline(time.Unix(1, 0)); <-done; c.Close() })
	return ch
}

// nextRoute returns the next route event, failing after timeout.
func nextRoute(tb testing.TB, events <-chan hostRouteEvent, timeout time.Duration, what string) hostRouteEvent {
	tb.Helper()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case ev, ok := <-events:
		if !ok {
			tb.Fatalf("%s: the route listener failed (overflow?)", what)
		}
		return ev
	case <-t.C:
		tb.Fatalf("%s: no route event within %v", what, timeout)
	}
	return hostRouteEvent{}
}

// heapInuse is the agent's go_memstats_heap_inuse_bytes from /metrics.
func heapInuse(tb testing.TB, get func(string) (int, string, error)) float64 {
	tb.Helper()
	_, body, err := get("/metrics")
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(line, "go_memstats_heap_inuse_bytes "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				tb.Fatal(err)
			}
			return f
		}
	}
	tb.Fatal("/metrics has no go_memstats_heap_inuse_bytes")
	return 0
}
