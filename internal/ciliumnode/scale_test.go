package ciliumnode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/apitest"
	"go.uber.org/goleak"
)

// The scale of issue 17: a PeerSource against 5,000 CiliumNodes with churn.
//
//	go test -run TestPeersScale -v ./internal/ciliumnode            (asserts; figures in the log)
//	go test -run '^$' -bench PeersScale -benchtime 1x ./internal/ciliumnode   (the figures as metrics)
//	go test -run '^$' -bench 'PeersList|PeersEvent' ./internal/ciliumnode   (client-only CPU and heap)

const scaleNodes = 5000

// timeScale shrinks an hour of a healthy watch into a test: kube-apiserver's bookmarks
// (every minute), its watch timeout (--min-request-timeout 1800 s × [1, 2)) and the
// source's WatchTimeout (2 min) all divided by it.
const timeScale = 1000

type scaleConfig struct {
	changes     int // churn steps, each one change a reader keeps
	touches     int // status updates before each change (events that change nothing kept)
	steadyHours int // scaled hours of healthy watching to count requests over
}

type scaleResult struct {
	listTook       time.Duration
	p50, p99, pMax time.Duration
	heapPerPeer    float64 // bytes
	cpuPerChange   time.Duration
	requestsPerH   float64 // in steady state, scaled back to real time
	listsSteady    int
	watchesSteady  int
	lists          uint64
}

func (r scaleResult) String() string {
	return fmt.Sprintf("first list of %d nodes %v; change→report p50 %v p99 %v max %v; heap %.0f B/peer; "+
		"process CPU %v/change (server included); steady state %.2f requests/h (%d lists, %d watches in the scaled hours)",
		scaleNodes, r.listTook.Round(time.Millisecond), r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond),
		r.pMax.Round(10*time.Microsecond), r.heapPerPeer, r.cpuPerChange.Round(time.Microsecond), r.requestsPerH, r.listsSteady, r.watchesSteady)
}

// scaleNode is the i-th node of the cluster: every tenth is opted out (a control plane),
// a third have an IPv6 InternalIP too.
func scaleNode(i int) apitest.Node {
	n := apitest.Node{Name: fmt.Sprintf("node-%05d", i), Key: 255,
		InternalIPs: []string{fmt.Sprintf("10.%d.%d.%d", 1+i>>16, (i>>8)&0xff, i&0xff)}}
	if i%10 == 0 {
		n.Key = 0
	}
	if i%3 == 0 {
		n.InternalIPs = append(n.InternalIPs, fmt.Sprintf("fd00::%x", i))
	}
	return n
}

func runScale(tb testing.TB, sc scaleConfig) scaleResult {
	tb.Helper()
	var res scaleResult
	api := apitest.New(tb, apitest.Options{
		BookmarkInterval:  time.Minute / timeScale,
		MinRequestTimeout: 1800 * time.Second / timeScale,
	})
	nodes := make([]apitest.Node, scaleNodes)
	for i := range nodes {
		nodes[i] = scaleNode(i)
	}
	if _, err := api.Replace(nodes...); err != nil {
		tb.Fatal(err)
	}
	api.Compact() // the history of the setup is not the client's
	dir := tb.TempDir()
	if err := api.WriteServiceAccount(dir); err != nil {
		tb.Fatal(err)
	}

	type report struct {
		at time.Time
		ps Peers
	}
	reports := make(chan report, 16)
	src, err := NewPeers(Config{
		Server:       api.URL(),
		TokenFile:    filepath.Join(dir, "token"),
		CAFile:       filepath.Join(dir, "ca.crt"),
		WatchTimeout: 2 * time.Minute / timeScale,
		Backoff:      backoff.NewConstantBackOff(10 * time.Millisecond),
	})
	if err != nil {
		tb.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- src.Run(ctx, func(ps Peers) { reports <- report{time.Now(), ps} }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	}()

	// await returns the first report for which cond holds.
	await := func(what string, cond func(Peers) bool) report {
		tb.Helper()
		deadline := time.After(2 * time.Minute)
		for {
			select {
			case r := <-reports:
				if cond(r.ps) {
					return r
				}
			case <-deadline:
				tb.Fatalf("%s: no report within 2 min", what)
			}
		}
	}
	first := await("first list", func(ps Peers) bool { return ps.Len() == scaleNodes })
	res.listTook = first.at.Sub(start)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	res.heapPerPeer = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / scaleNodes
	runtime.KeepAlive(first.ps)

	// Churn: joins, leaves, opt-outs, opt-ins and address changes, one at a time, each
	// behind a few status updates.
	r := rand.New(rand.NewPCG(17, 5000))
	names := api.Names()
	next := scaleNodes
	var lat []time.Duration
	cpu0 := cpuTime(tb)
	for c := range sc.changes {
		for range sc.touches {
			api.Touch(names[r.IntN(len(names))])
		}
		var (
			t0   time.Time
			cond func(Peers) bool
			what string
		)
		switch c % 5 {
		case 0: // join
			n := scaleNode(next)
			next++
			names = append(names, n.Name)
			what, t0 = "join "+n.Name, time.Now()
			api.Put(n)
			cond = func(ps Peers) bool { _, ok := ps.Get(n.Name); return ok }
		case 1: // leave
			i := r.IntN(len(names))
			name := names[i]
			names = slices.Delete(names, i, i+1)
			what, t0 = "leave "+name, time.Now()
			api.Delete(name)
			cond = func(ps Peers) bool { _, ok := ps.Get(name); return !ok }
		case 2, 3: // opt out, or in
			name := names[r.IntN(len(names))]
			n, _ := api.Get(name)
			key := int64(255)
			if n.Key != 0 {
				key = 0
			}
			what, t0 = fmt.Sprintf("key %d on %s", key, name), time.Now()
			api.SetKey(name, key)
			cond = func(ps Peers) bool { p, _ := ps.Get(name); return p.Encrypting == (key != 0) }
		case 4: // change address
			name := names[r.IntN(len(names))]
			ip := fmt.Sprintf("10.200.%d.%d", c>>8&0xff, c&0xff)
			what, t0 = "address "+ip+" on "+name, time.Now()
			api.SetAddrs(name, ip)
			cond = func(ps Peers) bool {
				p, _ := ps.Get(name)
				return len(p.Addrs) == 1 && p.Addrs[0].String() == ip
			}
		}
		got := await(what, cond)
		d := got.at.Sub(t0)
		lat = append(lat, d)
	}
	res.cpuPerChange = (cpuTime(tb) - cpu0) / time.Duration(max(sc.changes, 1))
	slices.Sort(lat)
	if len(lat) > 0 {
		res.p50, res.p99, res.pMax = lat[len(lat)/2], lat[(len(lat)*99)/100], lat[len(lat)-1]
	}

	// Steady state: count the requests of healthy watching over scaled hours.
	if sc.steadyHours > 0 {
		api.ResetCounts()
		<-time.After(time.Duration(sc.steadyHours) * time.Hour / timeScale) // the measured interval itself, not a wait for something
		counts := api.Counts()
		res.listsSteady, res.watchesSteady = counts[apitest.KindList], counts[apitest.KindWatch]
		total := 0
		for _, n := range counts {
			total += n
		}
		res.requestsPerH = float64(total) / float64(sc.steadyHours)
	}
	res.lists = src.Stats().Lists
	return res
}

// cpuTime returns the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestPeersScale: 5,000 nodes are listed once; each change of churn is reported (how
// soon: BenchmarkPeersScale, whose figures it logs); a healthy hour costs no list.
func TestPeersScale(t *testing.T) {
	if testing.Short() {
		t.Skip("5,000 CiliumNodes: not in -short")
	}
	t.Cleanup(func() { goleak.VerifyNone(t) })
	res := runScale(t, scaleConfig{changes: 100, touches: 2, steadyHours: 1})
	t.Log(res)
	if res.lists != 1 || res.listsSteady != 0 {
		t.Errorf("%d lists in all, %d in steady state; want 1 and 0", res.lists, res.listsSteady)
	}
	// The server ends a watch after 1800–3600 s (scaled): 1 or 2 in an hour, a few more
	// if a slow machine misses a scaled bookmark; never one a bookmark.
	if res.watchesSteady > 10 {
		t.Errorf("%d watch requests in a healthy hour, want a handful", res.watchesSteady)
	}
}

// BenchmarkPeersScale reports the figures of TestPeersScale with more churn. Run it once:
// -benchtime 1x.
func BenchmarkPeersScale(b *testing.B) {
	for b.Loop() {
		res := runScale(b, scaleConfig{changes: 1000, touches: 4, steadyHours: 3})
		b.Log(res)
		b.ReportMetric(res.listTook.Seconds()*1e3, "list-ms")
		b.ReportMetric(float64(res.p50.Microseconds()), "p50-µs")
		b.ReportMetric(float64(res.p99.Microseconds()), "p99-µs")
		b.ReportMetric(res.heapPerPeer, "heap-B/peer")
		b.ReportMetric(float64(res.cpuPerChange.Microseconds()), "process-cpu-µs/change")
		b.ReportMetric(res.requestsPerH, "requests/h")
	}
}

// memoryAPI answers a PeerSource from memory: the list, then a watch stream that events
// produces; no network, no server, so that the client's own costs show.
type memoryAPI struct {
	list   []byte
	events func(ctx context.Context) io.Reader // the body of a watch; it ends when ctx does
}

func (m *memoryAPI) RoundTrip(req *http.Request) (*http.Response, error) {
	var body io.Reader
	if req.URL.Query().Get("watch") == "1" {
		body = m.events(req.Context())
	} else {
		body = bytes.NewReader(m.list)
	}
	return &http.Response{StatusCode: http.StatusOK, Status: "200 OK", Header: http.Header{},
		Body: io.NopCloser(body), Request: req}, nil
}

// renderedCluster returns the list of the scale's 5,000 nodes as the stand-in server
// renders it, and its items.
func renderedCluster(tb testing.TB) (list []byte, items []json.RawMessage) {
	tb.Helper()
	api := apitest.New(tb, apitest.Options{})
	nodes := make([]apitest.Node, scaleNodes)
	for i := range nodes {
		nodes[i] = scaleNode(i)
	}
	if _, err := api.Replace(nodes...); err != nil {
		tb.Fatal(err)
	}
	c := api.Client()
	defer c.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, api.URL()+"/apis/cilium.io/v2/ciliumnodes", nil)
	req.Header.Set("Authorization", "Bearer "+api.Token())
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	if list, err = io.ReadAll(resp.Body); err != nil {
		tb.Fatal(err)
	}
	var l struct{ Items []json.RawMessage }
	if err := json.Unmarshal(list, &l); err != nil {
		tb.Fatal(err)
	}
	return list, l.Items
}

func memorySource(tb testing.TB, m *memoryAPI) *PeerSource {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("t\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	src, err := NewPeers(Config{Server: "https://apiserver.invalid", TokenFile: filepath.Join(dir, "token"),
		HTTPClient: &http.Client{Transport: m}, WatchTimeout: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	return src
}

// heapDelta returns how much more heap is in use, after a collection, while make's result is
// kept than before make ran.
func heapDelta(make func() any) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := make()
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	return float64(int64(after.HeapAlloc) - int64(before.HeapAlloc))
}

// BenchmarkPeersList: one complete list of 5,000 nodes, decoded from memory; and the heap
// the resulting snapshot keeps, per node.
func BenchmarkPeersList(b *testing.B) {
	list, _ := renderedCluster(b)
	src := memorySource(b, &memoryAPI{list: list})
	ctx := context.Background()
	heap := heapDelta(func() any {
		l, err := src.list(ctx)
		if err != nil || len(l.nodes) != scaleNodes {
			b.Fatalf("list: %d nodes, %v", len(l.nodes), err)
		}
		return l
	}) / scaleNodes
	b.SetBytes(int64(len(list)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := src.list(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(heap, "heap-B/peer")
}

// BenchmarkPeersEvent: one watch event among 5,000 nodes, from memory through decode and
// apply: "change" flips a node's key (off, then on again), so every event is reported;
// "status" changes nothing kept (a status update), so none is. The client's CPU per event.
func BenchmarkPeersEvent(b *testing.B) {
	list, items := renderedCluster(b)
	var change, status [][]byte
	for _, it := range items {
		s := string(it)
		on := strings.Replace(s, `"encryption":{}`, `"encryption":{"key":255}`, 1)
		off := strings.Replace(s, `"encryption":{"key":255}`, `"encryption":{}`, 1)
		change = append(change,
			[]byte(`{"type":"MODIFIED","object":`+off+"}\n"),
			[]byte(`{"type":"MODIFIED","object":`+on+"}\n"))
		status = append(status, []byte(`{"type":"MODIFIED","object":`+s+"}\n"))
	}
	for _, bc := range []struct {
		name  string
		lines [][]byte
	}{{"change", change}, {"status", status}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			gate := make(chan struct{}) // the events flow once the timer runs
			src := memorySource(b, &memoryAPI{list: list, events: func(ctx context.Context) io.Reader {
				return &cycleReader{ctx: ctx, gate: gate, lines: bc.lines}
			}})
			var started sync.Once
			ready := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- src.Run(ctx, func(Peers) { started.Do(func() { close(ready) }) })
			}()
			<-ready
			b.ReportAllocs()
			b.ResetTimer()
			close(gate)
			for src.Stats().Events < uint64(b.N) {
				runtime.Gosched()
			}
			b.StopTimer()
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// cycleReader yields lines over and over, until ctx ends.
type cycleReader struct {
	ctx   context.Context
	gate  <-chan struct{} // closed when the lines may flow
	lines [][]byte
	i     int
	off   int
}

func (c *cycleReader) Read(p []byte) (int, error) {
	select {
	case <-c.gate:
	case <-c.ctx.Done():
	}
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n := 0
	for n < len(p) {
		line := c.lines[c.i]
		k := copy(p[n:], line[c.off:])
		n += k
		c.off += k
		if c.off == len(line) {
			c.i, c.off = (c.i+1)%len(c.lines), 0
		}
	}
	return n, nil
}
