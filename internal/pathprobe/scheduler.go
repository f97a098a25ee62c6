package pathprobe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Scheduler defaults.
const (
	// DefaultInterval is how often each peer is searched again without a
	// cause: paths between clouds change rarely, and RFC 8899 raises a
	// value no sooner (its PMTU_RAISE_TIMER is 10 minutes).
	DefaultInterval = 10 * time.Minute
	// DefaultJitter spreads the periodic searches over ±10% of the
	// interval, so that peers found at once drift apart.
	DefaultJitter = 0.1
	// DefaultParallel is the number of searches under way at once: enough
	// that peers which do not answer (each round waits for its timeout)
	// do not hold up the others; all share the Prober's rate limit.
	DefaultParallel = 4
)

// Searcher searches one peer: *Prober, or a fake in tests.
type Searcher interface {
	Search(ctx context.Context, peer netip.Addr, max int) (Result, error)
}

// SchedulerConfig configures a Scheduler. Searcher and Deliver are
// required.
type SchedulerConfig struct {
	// Searcher searches the peers (a *Prober).
	Searcher Searcher
	// Deliver receives each search's result, or its error (the Result
	// then has the Peer only). It is called one at a time, never under the
	// Scheduler's locks, and never for a peer removed before the search
	// began; it may be called for one removed during the search. A slow
	// Deliver holds one search slot.
	Deliver func(Result, error)
	// Interval is how often a peer is searched without a cause
	// (DefaultInterval).
	Interval time.Duration
	// Jitter is the fraction of Interval the next periodic search moves by,
	// either way, at random (DefaultJitter; negative: none).
	Jitter float64
	// Parallel is the number of searches under way at once
	// (DefaultParallel).
	Parallel int
	// Logger receives one warning per failed search (default: discard).
	Logger *slog.Logger
}

// Scheduler decides when each peer is searched: when it appears, when its
// max (its main route's MTU) changes, when Trigger says its path changed or
// an ICMP signal fired (triggers coalesce: one search however many), and
// otherwise about every Interval. Searches that are due wait for a slot;
// the rate of packets is the Searcher's to bound, so with thousands of
// peers the cycle stretches instead. Its methods are safe from any
// goroutine.
type Scheduler struct {
	cfg  SchedulerConfig
	wake chan struct{}
	run  atomic.Bool

	deliverMu sync.Mutex // serializes Deliver; never held with mu

	mu       sync.Mutex
	q        *queue // guarded by mu
	running  int    // guarded by mu
	searches uint64 // guarded by mu
	failures uint64 // guarded by mu
}

// NewScheduler returns a Scheduler with no peers; Run starts it.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	if cfg.Searcher == nil || cfg.Deliver == nil {
		return nil, fmt.Errorf("%w: a Scheduler needs a Searcher and Deliver", ErrConfig)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Jitter == 0 {
		cfg.Jitter = DefaultJitter
	}
	cfg.Jitter = min(max(cfg.Jitter, 0), 1)
	if cfg.Parallel == 0 {
		cfg.Parallel = DefaultParallel
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval < 0 || cfg.Parallel < 0 {
		return nil, fmt.Errorf("%w: Interval %v, Parallel %d", ErrConfig, cfg.Interval, cfg.Parallel)
	}
	return &Scheduler{cfg: cfg, wake: make(chan struct{}, 1), q: newQueue(cfg.Interval, cfg.Jitter, rand.Float64)}, nil
}

// Set adds peer, to be searched at once, or sets its max: the largest size
// worth trying, the MTU of the main route to it. A changed max is a
// trigger.
func (s *Scheduler) Set(peer netip.Addr, max int) {
	s.mu.Lock()
	s.q.set(peer.Unmap(), max, time.Now())
	s.mu.Unlock()
	s.poke()
}

// Remove forgets peer.
func (s *Scheduler) Remove(peer netip.Addr) {
	s.mu.Lock()
	s.q.remove(peer.Unmap())
	s.mu.Unlock()
}

// Sync makes the peers exactly those of peers (address → max), as Set and
// Remove would one by one. Its keys are IPv4 addresses as such, not mapped
// into IPv6 (as netip.Addr.Unmap returns them).
func (s *Scheduler) Sync(peers map[netip.Addr]int) {
	now := time.Now()
	s.mu.Lock()
	for peer, max := range peers {
		s.q.set(peer.Unmap(), max, now)
	}
	for peer := range s.q.peers {
		if _, ok := peers[peer]; !ok {
			s.q.remove(peer)
		}
	}
	s.mu.Unlock()
	s.poke()
}

// Trigger searches peer again soon: its main path changed, or an ICMP
// signal fired. A peer not Set is ignored.
func (s *Scheduler) Trigger(peer netip.Addr) {
	s.mu.Lock()
	s.q.trigger(peer.Unmap(), time.Now())
	s.mu.Unlock()
	s.poke()
}

// SchedulerStats counts what a Scheduler did.
type SchedulerStats struct {
	Peers    int    // peers known
	Running  int    // searches under way
	Searches uint64 // searches ended, with a result or an error
	Failures uint64 // searches ended with an error
}

// Stats returns the counts so far.
func (s *Scheduler) Stats() SchedulerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SchedulerStats{Peers: len(s.q.peers), Running: s.running, Searches: s.searches, Failures: s.failures}
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run starts due searches, at most Parallel at once, until ctx ends; then
// it waits for the searches under way (they see ctx end too) and returns
// nil. It may be called once.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.run.CompareAndSwap(false, true) {
		return errors.New("pathprobe: Scheduler.Run called twice")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		wait := s.start(ctx, &wg)
		if wait >= 0 {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// start starts every due search a slot is free for, and returns how long
// until the next is due (negative: none is, or no slot is free).
func (s *Scheduler) start(ctx context.Context, wg *sync.WaitGroup) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for s.running < s.cfg.Parallel {
		e, wait := s.q.next(now)
		if e == nil {
			return wait
		}
		s.running++
		wg.Add(1)
		go s.search(ctx, wg, e, e.peer, e.max)
	}
	return -1
}

// search runs one search, delivers its result and puts the peer back.
func (s *Scheduler) search(ctx context.Context, wg *sync.WaitGroup, e *entry, peer netip.Addr, max int) {
	defer wg.Done()
	res, err := s.cfg.Searcher.Search(ctx, peer, max)
	if ctx.Err() == nil {
		if err != nil {
			s.cfg.Logger.Warn("path MTU search failed", "peer", peer, "error", err)
			res = Result{Peer: peer}
		}
		s.deliverMu.Lock()
		s.cfg.Deliver(res, err)
		s.deliverMu.Unlock()
	}
	s.mu.Lock()
	s.running--
	s.searches++
	if err != nil {
		s.failures++
	}
	s.q.done(e, time.Now())
	s.mu.Unlock()
	s.poke()
}
