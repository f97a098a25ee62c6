//go:build linux

package netwatch

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Real-kernel benchmarks, each in its own network namespace with routes
// loaded over netlink, 1024 per write. The 1,000,000-route cases take a
// minute or two and run only with MARKSPLIT_BENCH_1M=1:
//
//	MARKSPLIT_BENCH_1M=1 go test -run '^$' -bench 'Kernel|DumpApply' -timeout 30m ./netwatch/

const bench1MEnv = "MARKSPLIT_BENCH_1M"

func benchSizes(b *testing.B) []int {
	if os.Getenv(bench1MEnv) == "1" {
		return []int{100_000, 1_000_000}
	}
	b.Logf("set %s=1 for the 1,000,000-route cases", bench1MEnv)
	return []int{100_000}
}

// loadRoutes adds n /24 routes to table 254 via gw, generated a batch at a
// time so that the benchmark process does not hold them.
func loadRoutes(b *testing.B, ns *testNS, n int, gw netip.Addr, index uint32) {
	b.Helper()
	rw := dialRouteWriter(b, ns)
	for first := 0; first < n; first += writeBatch * 16 {
		rw.add(b, gwRoutes(TableMain, first, min(writeBatch*16, n-first), gw, index))
	}
}

// startDump opens a socket in ns and asks it for a dump of the IPv4
// routes.
func startDump(b *testing.B, ns *testNS) rtnl.Conn {
	b.Helper()
	c, err := ns.dialer().Dial(rtnl.DialConfig{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETROUTE, Flags: netlink.Request | netlink.Dump},
		Data:   dumpRequest(dumpOf{typ: unix.RTM_GETROUTE, af: unix.AF_INET}),
	}); err != nil {
		c.Close()
		b.Fatal(err)
	}
	return c
}

// rawDump dumps the IPv4 routes through mdlayher/netlink, as any user of
// the library reads a dump when it decodes nothing, and returns how many
// messages came: the reference for a watcher's sync.
func rawDump(b *testing.B, ns *testNS) int {
	b.Helper()
	c := startDump(b, ns)
	defer c.Close()
	n := 0
	for _, err := range c.ReceiveIter() {
		if err != nil {
			b.Fatal(err)
		}
		n++
	}
	return n
}

// bareDump is the floor under rawDump: it reads each datagram with one
// recvfrom(2) into one reused buffer and walks the message headers to find
// the end, the least any reader of a dump does. It returns how many
// messages came.
func bareDump(b *testing.B, ns *testNS) int {
	b.Helper()
	c := startDump(b, ns)
	defer c.Close()
	rc, err := c.(*kernelConn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	msgs := 0
	for {
		var (
			n       int
			recvErr error
		)
		if err := rc.Read(func(fd uintptr) bool {
			n, _, recvErr = unix.Recvfrom(int(fd), buf, 0)
			return recvErr != unix.EAGAIN
		}); err != nil || recvErr != nil {
			b.Fatal(err, recvErr)
		}
		for d := buf[:n]; len(d) > 0; {
			h, _, rest, err := nextMessage(d)
			if err != nil {
				b.Fatal(err)
			}
			if h.Type == netlink.Done || h.Type == netlink.Error {
				return msgs
			}
			msgs, d = msgs+1, rest
		}
	}
}

// syncOnce runs a watcher until its first sync and returns how long that
// took and its IPv4 route count; the watcher is stopped before it returns.
func syncOnce(b *testing.B, ns *testNS, measure func(*Watcher)) (time.Duration, int) {
	b.Helper()
	w := New(Options{NetNS: fakeNetNS(ns.dialer())})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(ctx) }()
	deadline := time.After(2 * time.Minute)
	for ch := w.nextChange(); !w.synced(); ch = w.nextChange() {
		select {
		case <-ch:
		case <-deadline:
			b.Fatalf("no sync in 2 minutes")
		}
	}
	took := time.Since(start)
	if measure != nil {
		measure(w)
	}
	var routes int
	w.Read(func(v View) { routes = v.routeCount(IPv4) })
	cancel()
	<-done
	return took, routes
}

// BenchmarkKernelInitialSync measures a watcher's initial sync of a full
// table of IPv4 /24 routes against a raw netlink dump of the same routes
// that decodes nothing (rawDump), in the same run: sync/raw is the
// decoding and caching overhead (target ≤ 1.3). sync/bare is the same
// against bareDump, the floor of any reader. It also reports the memory the
// cache holds per route, on the heap and mapped outside it (together
// ≤ 150 B) and the peak RSS of a fresh process that
// syncs the table (target ≤ 300 MB at 1,000,000 routes).
func BenchmarkKernelInitialSync(b *testing.B) {
	for _, n := range benchSizes(b) {
		b.Run(fmt.Sprintf("routes=%d", n), func(b *testing.B) {
			ns := newTestNS(b)
			index, gw := underlay(b, ns)
			loadRoutes(b, ns, n, gw, index)
			b.Run("sync", func(b *testing.B) {
				var heap uint64
				var mapped int64
				took, cached := syncOnce(b, ns, func(w *Watcher) {
					var after runtime.MemStats
					runtime.GC()
					runtime.ReadMemStats(&after)
					heap = after.HeapAlloc
					mapped = w.Stats().MappedBytes
				})
				if cached < n {
					b.Fatalf("cache has %d IPv4 routes, want at least %d", cached, n)
				}
				var base runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&base)
				b.Logf("warm-up sync of %d routes: %v", n, took)

				var syncTime, rawTime, bareTime time.Duration
				var ratios []float64 // sync/bare of each iteration
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					bare0 := bareTime
					for _, d := range []struct {
						dump func(*testing.B, *testNS) int
						took *time.Duration
					}{{rawDump, &rawTime}, {bareDump, &bareTime}} {
						settle(b)
						start := time.Now()
						if got := d.dump(b, ns); got < n {
							b.Fatalf("dump: %d messages, want at least %d", got, n)
						}
						*d.took += time.Since(start)
					}
					settle(b)
					took, _ := syncOnce(b, ns, nil)
					syncTime += took
					ratios = append(ratios, float64(took)/float64(bareTime-bare0))
				}
				b.StopTimer()
				b.ReportMetric(float64(syncTime.Milliseconds())/float64(b.N), "sync-ms")
				b.ReportMetric(float64(rawTime.Milliseconds())/float64(b.N), "raw-dump-ms")
				b.ReportMetric(float64(bareTime.Milliseconds())/float64(b.N), "bare-dump-ms")
				b.ReportMetric(float64(syncTime)/float64(rawTime), "sync/raw")
				b.ReportMetric(float64(syncTime)/float64(bareTime), "sync/bare")
				slices.Sort(ratios)
				b.ReportMetric(ratios[len(ratios)/2], "sync/bare-p50")
				b.ReportMetric(float64(int64(heap)-int64(base.HeapAlloc))/float64(n), "heap-B/route")
				b.ReportMetric(float64(mapped)/float64(n), "mapped-B/route")
				b.ReportMetric(float64(childPeakRSS(b, ns, n))/1024, "peak-RSS-MB")
			})
		})
	}
}

// settle collects the garbage of what ran before and returns the freed
// memory to the kernel, so that each of BenchmarkKernelInitialSync's
// measurements starts as a fresh process would: the raw dump leaves ~70 MB
// of garbage, and the sync before it 40 MB of route chunks to unmap, whose
// collection and return would otherwise fall inside the next measurement.
func settle(b *testing.B) {
	awaitMapped(b, 0, "before a measurement")
	debug.FreeOSMemory()
}

// childPeakRSS runs TestHelperSyncRSS in a fresh process against ns and
// returns its VmHWM in KiB.
func childPeakRSS(b *testing.B, ns *testNS, n int) int {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSyncRSS$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "MARKSPLIT_RSS_NETNS=/run/netns/"+ns.name, "MARKSPLIT_RSS_ROUTES="+strconv.Itoa(n))
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("child sync: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "peak-rss-kib "); ok {
			kib, err := strconv.Atoi(v)
			if err != nil {
				b.Fatal(err)
			}
			return kib
		}
	}
	b.Fatalf("child printed no peak RSS:\n%s", out)
	return 0
}

// TestHelperSyncRSS is BenchmarkKernelInitialSync's child process: it
// syncs a watcher with the namespace MARKSPLIT_RSS_NETNS names and prints
// its peak RSS. It does nothing in an ordinary test run.
func TestHelperSyncRSS(t *testing.T) {
	path := os.Getenv("MARKSPLIT_RSS_NETNS")
	if path == "" {
		t.Skip("helper process of BenchmarkKernelInitialSync")
	}
	want, _ := strconv.Atoi(os.Getenv("MARKSPLIT_RSS_ROUTES"))
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	w := New(Options{NetNS: fakeNetNS(kernelDialer{netns: fd})})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	deadline := time.After(2 * time.Minute)
	for ch := w.nextChange(); !w.synced(); ch = w.nextChange() {
		select {
		case <-ch:
		case <-deadline:
			t.Fatal("no sync in 2 minutes")
		}
	}
	var got int
	w.Read(func(v View) { got = v.routeCount(IPv4) })
	cancel()
	<-done
	if got < want {
		t.Fatalf("synced %d IPv4 routes, want at least %d", got, want)
	}
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			fmt.Printf("peak-rss-kib %s\n", strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
}

// BenchmarkKernelEventIngest: two writers add and delete routes as fast as
// the kernel lets them (1024 per write, each on its own socket) while a
// watcher with the default receive buffer follows. It reports the events
// the watcher applied per second, until it caught up, and the overflows it
// had (there should be none: "overflows" must read 0). With table=N the
// main table first holds N routes and the writers' routes sort between
// them, as churn in a full BGP table does; N=1,000,000 runs with
// MARKSPLIT_BENCH_1M=1.
func BenchmarkKernelEventIngest(b *testing.B) {
	for _, n := range append([]int{0}, benchSizes(b)[1:]...) {
		b.Run(fmt.Sprintf("table=%d", n), func(b *testing.B) { benchIngest(b, n) })
	}
}

func benchIngest(b *testing.B, tableRoutes int) {
	ns := newTestNS(b)
	index, gw := underlay(b, ns)
	// The table's routes take the even numbers of gwRoutes, the writers'
	// the odd ones among them; without a table, the writers' own ranges.
	writerRoutes := func(i int) []Route { return gwRoutes(TableMain, (i+1)<<16, writeBatch, gw, index) }
	if tableRoutes > 0 {
		rw := dialRouteWriter(b, ns)
		for first := 0; first < tableRoutes; first += writeBatch * 16 {
			rs := gwRoutes(TableMain, 2*first, 2*min(writeBatch*16, tableRoutes-first), gw, index)
			rw.add(b, everyOther(rs, 0))
		}
		writerRoutes = func(i int) []Route {
			return everyOther(gwRoutes(TableMain, 2*i*writeBatch*64, 2*writeBatch, gw, index), 1)
		}
	}
	w := startWatcher(b, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(b, w, 2*time.Minute)
	writers := []*routeWriter{dialRouteWriter(b, ns), dialRouteWriter(b, ns)}
	base := w.Stats()
	var baseRoutes int
	w.Read(func(v View) { baseRoutes = v.routeCount(IPv4) })

	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(writers))
	per := (b.N + len(writers) - 1) / len(writers)
	changes := make([]int, len(writers))
	for i, rw := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each writer toggles its own 1024 routes: add them all, delete
			// them all, until it made its share of changes.
			rs := writerRoutes(i)
			for changes[i] < per {
				k := min((per-changes[i]+1)/2, len(rs))
				for _, typ := range []uint16{unix.RTM_NEWROUTE, unix.RTM_DELROUTE} {
					flags := netlink.HeaderFlags(0)
					if typ == unix.RTM_NEWROUTE {
						flags = netlink.Create | netlink.Excl
					}
					if failed, err := rw.do(typ, flags, rs[:k]); failed > 0 || err != nil {
						errs <- fmt.Errorf("writer %d: %d failed: %v", i, failed, err)
						return
					}
					changes[i] += k
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	written := time.Since(start)
	// Wait until the watcher applied every change, or resynced after an
	// overflow and holds none of the writers' routes.
	total := 0
	for _, c := range changes {
		total += c
	}
	want := base.Events[KindRoute] + uint64(total)
	deadline := time.After(time.Minute)
	for {
		ch := w.nextChange()
		st := w.Stats()
		if st.Events[KindRoute] >= want {
			break
		}
		if st.Resyncs[resyncOverflow] > base.Resyncs[resyncOverflow] && st.Synced {
			var n int
			w.Read(func(v View) { n = v.routeCount(IPv4) })
			if n == baseRoutes {
				break
			}
		}
		select {
		case <-ch:
		case <-deadline:
			b.Fatalf("watcher did not catch up: %+v", w.Stats())
		}
	}
	caught := time.Since(start)
	b.StopTimer()
	st := w.Stats()
	events := st.Events[KindRoute] - base.Events[KindRoute]
	b.ReportMetric(float64(events)/caught.Seconds(), "events/s")
	b.ReportMetric(float64(total)/written.Seconds(), "kernel-changes/s")
	b.ReportMetric(float64(st.Resyncs[resyncOverflow]-base.Resyncs[resyncOverflow]), "overflows")
}

// everyOther returns the routes of rs at even (from 0) or odd (from 1)
// positions.
func everyOther(rs []Route, from int) []Route {
	var out []Route
	for i := from; i < len(rs); i += 2 {
		out = append(out, rs[i])
	}
	return out
}

// BenchmarkDumpApply is the watcher's share of a sync without the kernel:
// decoding 100,000 dumped /24 routes, in datagrams of up to 32 KiB as the
// kernel fills them, and adding them to a new cache. It is what
// BenchmarkKernelInitialSync's sync/raw ratio adds to the raw dump.
func BenchmarkDumpApply(b *testing.B) {
	const n = 100_000
	var dgrams [][]byte
	var d []byte
	for _, r := range gwRoutes(TableMain, 0, n, netip.MustParseAddr("10.200.0.2"), 2) {
		r.Protocol, r.Metric, r.PrefSrc = protoBGP, 20, netip.MustParseAddr("10.200.0.1")
		data, err := encodeRoute(r)
		if err != nil {
			b.Fatal(err)
		}
		m, err := netlink.Message{Header: netlink.Header{Length: uint32(unix.NLMSG_HDRLEN + len(data)), Type: unix.RTM_NEWROUTE, Flags: netlink.Multi}, Data: data}.MarshalBinary()
		if err != nil {
			b.Fatal(err)
		}
		if len(d)+len(m) > 32<<10 {
			dgrams, d = append(dgrams, d), nil
		}
		d = append(d, m...)
	}
	dgrams = append(dgrams, d)
	b.ReportAllocs()
	for b.Loop() {
		s := newState()
		for _, d := range dgrams {
			if err := s.addDatagram(d, tableFilter{}); err != nil {
				b.Fatal(err)
			}
		}
		if got := s.tables[0][TableMain].len(); got != n {
			b.Fatalf("cached %d routes, want %d", got, n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/route")
}

// BenchmarkKernelLinkEvent measures what a change of a link that carries
// no route costs the watcher with a full main table (10,000 and 100,000
// routes, and 1,000,000 with MARKSPLIT_BENCH_1M=1): a spare veth goes up
// or down, and the time runs until Barrier says the cache holds it. It
// reports the watcher's CPU per change (the process's, over b.N changes),
// which must not grow with the table, and the route re-dumps: none of the
// IPv4 table; the spare link's own routes (IPv6 gives it fe80::/64 and
// the like while it is up) by link, and the IPv6 table whole when the
// link's fe80::/64 joins the key other links' share.
func BenchmarkKernelLinkEvent(b *testing.B) {
	for _, n := range append([]int{10_000}, benchSizes(b)...) {
		b.Run(fmt.Sprintf("routes=%d", n), func(b *testing.B) {
			ns := newTestNS(b)
			index, gw := underlay(b, ns)
			loadRoutes(b, ns, n, gw, index)
			ns.ip(b, "link", "add", "spare0", "type", "veth", "peer", "name", "spare1")
			ns.ip(b, "link", "set", "spare1", "up")
			w := startWatcher(b, Options{NetNS: fakeNetNS(ns.dialer())})
			waitSynced(b, w, time.Minute)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			st0 := w.Stats()
			var ru0, ru1 unix.Rusage
			unix.Getrusage(unix.RUSAGE_SELF, &ru0)
			b.ResetTimer()
			for i := range b.N {
				state := "up"
				if i%2 == 1 {
					state = "down"
				}
				ns.ip(b, "link", "set", "spare0", state)
				if err := w.Barrier(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			unix.Getrusage(unix.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/change")
			st1 := w.Stats()
			b.ReportMetric(float64(st1.Resyncs[resyncRoutes]-st0.Resyncs[resyncRoutes]), "full-redumps")
			b.ReportMetric(float64(st1.Resyncs[resyncLinkRoutes]-st0.Resyncs[resyncLinkRoutes]), "link-redumps")
		})
	}
}
