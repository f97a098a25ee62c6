package pathprobe

import (
	"context"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var t0 = time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)

func addr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

// TestQueue checks the Scheduler's decisions on explicit times.
func TestQueue(t *testing.T) {
	q := newQueue(10*time.Minute, 0.1, func() float64 { return 1 }) // always +10%
	q.set(addr(1), 1450, t0)
	q.set(addr(2), 1450, t0)
	e1, _ := q.next(t0)
	e2, _ := q.next(t0)
	if e1 == nil || e2 == nil || e1.peer != addr(1) || e2.peer != addr(2) {
		t.Fatalf("new peers: got %v %v, want both at once, in order", e1, e2)
	}
	if e, wait := q.next(t0); e != nil || wait >= 0 {
		t.Fatalf("empty queue: got %v, %v", e, wait)
	}
	// Triggers while running coalesce into one search when done.
	q.trigger(addr(1), t0)
	q.trigger(addr(1), t0)
	q.done(e1, t0.Add(time.Second))
	q.done(e2, t0.Add(time.Second))
	if e, _ := q.next(t0.Add(time.Second)); e != e1 {
		t.Fatalf("triggered while running: got %v, want peer 1 at once", e)
	}
	if e, wait := q.next(t0.Add(time.Second)); e != nil || wait != 11*time.Minute {
		t.Fatalf("periodic: got %v in %v, want none for 11m (interval + 10%%)", e, wait)
	}
	q.done(e1, t0.Add(2*time.Second))
	// A changed max is a trigger, and an urgent peer goes before an overdue
	// periodic one; an unchanged max is not.
	later := t0.Add(time.Hour)
	q.set(addr(2), 1450, later)
	q.set(addr(1), 1400, later)
	if e, _ := q.next(later); e == nil || e.peer != addr(1) || e.max != 1400 {
		t.Fatalf("changed max: got %v, want peer 1 with 1400", e)
	}
	// A removed peer is never returned, even one being searched.
	q.remove(addr(2))
	q.remove(addr(1))
	q.done(e1, later)
	if e, wait := q.next(later.Add(time.Hour)); e != nil || wait >= 0 || len(q.peers) != 0 {
		t.Fatalf("after remove: got %v, %v, %d peers", e, wait, len(q.peers))
	}
}

// countingSearcher answers every search at once, counting them per peer.
type countingSearcher struct {
	mu    sync.Mutex
	count map[netip.Addr]int
}

func (c *countingSearcher) Search(_ context.Context, peer netip.Addr, max int) (Result, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.count[peer]++
	return Result{Peer: peer, PathMTU: max, Probes: DefaultSources + 1, Via: ViaResponder}, nil
}

func (c *countingSearcher) searches(peer netip.Addr) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count[peer]
}

// TestSchedulerRun runs a Scheduler in a bubble (fake time): every peer is
// searched at once, then about every interval; a trigger causes one search.
func TestSchedulerRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := &countingSearcher{count: make(map[netip.Addr]int)}
		var delivered atomic.Int64
		s, err := NewScheduler(SchedulerConfig{Searcher: cs, Deliver: func(Result, error) { delivered.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- s.Run(ctx) }()
		peers := make(map[netip.Addr]int)
		for i := range 100 {
			peers[addr(i)] = 1450
		}
		s.Sync(peers)
		synctest.Wait()
		if got := delivered.Load(); got != 100 {
			t.Fatalf("after Sync: %d results, want 100", got)
		}
		s.Trigger(addr(7))
		s.Trigger(addr(7))
		synctest.Wait()
		if got := cs.searches(addr(7)); got != 2 {
			t.Fatalf("after two triggers: peer searched %d times, want 2 (new, then one for both triggers)", got)
		}
		time.Sleep(DefaultInterval * 2) // fake time (synctest): two intervals pass at once, not a wait for a condition
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		for peer, n := range cs.count {
			// new, then at 0.9–1.1 intervals: two or three more in two intervals.
			if n < 2 || n > 4 {
				t.Errorf("%s searched %d times in two intervals", peer, n)
			}
		}
		if st := s.Stats(); st.Peers != 100 || st.Running != 0 || int64(st.Searches) != delivered.Load() {
			t.Errorf("stats %+v, delivered %d", st, delivered.Load())
		}
	})
}

// pathsExchanger answers probes as paths of a per-peer size, and counts
// packets; safe for concurrent use.
type pathsExchanger struct {
	packets atomic.Int64
}

func (x *pathsExchanger) exchange(_ context.Context, peer netip.Addr, probes []probe) ([]bool, error) {
	x.packets.Add(int64(len(probes)))
	size := 1300 + int(peer.As4()[3])%200 // sizes 1300–1499 over the peers
	if peer.As4()[3]%10 == 9 {
		size = 0 // a tenth do not answer
	}
	answered := make([]bool, len(probes))
	for i, p := range probes {
		answered[i] = p.size <= size
	}
	return answered, nil
}

// TestSchedulerRate5000 runs 5,000 peers through a Scheduler and a Prober
// (its rate limit, a fake path per peer) for two hours of fake time, and
// checks that the node-wide rate holds: at most burst + rate·T packets.
func TestSchedulerRate5000(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := newProber(Config{})
		if err != nil {
			t.Fatal(err)
		}
		x := &pathsExchanger{}
		p.udp = x
		var searches, unreachable atomic.Int64
		s, err := NewScheduler(SchedulerConfig{Searcher: p, Deliver: func(r Result, err error) {
			searches.Add(1)
			if r.Unreachable {
				unreachable.Add(1)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		start := time.Now()
		go func() { done <- s.Run(ctx) }()
		peers := make(map[netip.Addr]int)
		for i := range 5000 {
			peers[addr(i)] = 1500
		}
		s.Sync(peers)
		const span = 2 * time.Hour
		time.Sleep(span) // fake time (synctest): the bubble's clock jumps when every goroutine waits
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(start)
		sent := x.packets.Load()
		limit := int64(DefaultSources+1) + int64(DefaultRate*elapsed.Seconds())
		t.Logf("5000 peers, %v of fake time: %d packets (%.2f/s), %d searches (%.1f packets each, %d unreachable)",
			elapsed, sent, float64(sent)/elapsed.Seconds(), searches.Load(), float64(sent)/float64(max(searches.Load(), 1)), unreachable.Load())
		if sent > limit {
			t.Errorf("%d packets in %v: over the rate (%d)", sent, elapsed, limit)
		}
		if float64(sent) < 0.9*DefaultRate*elapsed.Seconds() {
			t.Errorf("%d packets in %v: the scheduler left the rate idle with peers due", sent, elapsed)
		}
	})
}

// BenchmarkScheduler5000 searches 5,000 peers once each through a
// Scheduler with a searcher that answers at once: the CPU per search and
// the memory a peer costs the Scheduler.
func BenchmarkScheduler5000(b *testing.B) {
	const n = 5000
	peers := make(map[netip.Addr]int, n)
	for i := range n {
		peers[addr(i)] = 1450
	}
	b.ReportAllocs()
	var bytesPerPeer float64
	for b.Loop() {
		var delivered atomic.Int64
		all := make(chan struct{})
		cs := &countingSearcher{count: make(map[netip.Addr]int, n)}
		var ms0, ms1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms0)
		s, err := NewScheduler(SchedulerConfig{Searcher: cs, Deliver: func(Result, error) {
			if delivered.Add(1) == n {
				close(all)
			}
		}})
		if err != nil {
			b.Fatal(err)
		}
		s.Sync(peers)
		runtime.GC()
		runtime.ReadMemStats(&ms1)
		bytesPerPeer = float64(ms1.HeapAlloc-ms0.HeapAlloc) / n
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- s.Run(ctx) }()
		<-all
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		runtime.KeepAlive(s)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/search")
	b.ReportMetric(bytesPerPeer, "B/peer")
}
