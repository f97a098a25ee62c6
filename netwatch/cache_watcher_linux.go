//go:build linux

package netwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// defaultReadBuffer is the multicast socket's receive buffer unless
// Options.ReadBuffer says otherwise: enough for bursts of tens of thousands
// of route changes.
const defaultReadBuffer = 8 << 20

// The rtnetlink multicast groups a watcher joins.
var groups = []uint32{
	unix.RTNLGRP_LINK,
	unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
	unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE,
	unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE,
	// Nexthop objects are not cached, but deleting one changes the
	// routes that use it without route events.
	unix.RTNLGRP_NEXTHOP,
}

// Options configure a Watcher. The zero value watches the calling thread's network
// namespace with the default buffer and caches every table.
type Options struct {
	// NetNS is the network namespace (OpenNetNS); nil means the calling
	// thread's, as it is when New is called.
	NetNS *NetNS
	// ReadBuffer is the multicast socket's receive buffer in bytes;
	// default 8 MiB.
	ReadBuffer int
	// RouteTables, when not nil, restricts the route cache to these
	// tables: dumps ask the kernel for them alone and events for other
	// tables are dropped undecoded. Links, addresses and rules are always
	// cached whole.
	RouteTables []Table
	// Logger receives the watcher's few log lines (resyncs, reconnects);
	// default discard.
	Logger *slog.Logger
	// RetryMin and RetryMax pace reconnection after a socket failure,
	// doubling from RetryMin (default 100 ms) to RetryMax (30 s), for
	// ever.
	RetryMin, RetryMax time.Duration
}

// resyncCause says why the whole cache, or a part, was dumped again: a
// key of Stats.Resyncs.
type resyncCause = string

// Causes of a resync, as Stats.Resyncs names them.
const (
	resyncInitial     resyncCause = "initial"     // first sync of a session
	resyncOverflow    resyncCause = "overflow"    // ENOBUFS: events were lost
	resyncInterrupted resyncCause = "interrupted" // a dump came back with NLM_F_DUMP_INTR
	resyncReconnect   resyncCause = "reconnect"   // the sockets failed and were reopened
	resyncRequested   resyncCause = "requested"   // Watcher.Resync was called
	resyncRoutes      resyncCause = "routes"      // routes re-dumped after a silent kernel change
	resyncRules       resyncCause = "rules"       // rules re-dumped after an ambiguous rule event
	resyncLinkRoutes  resyncCause = "link-routes" // a link's routes re-dumped after a change of the link
)

// resyncCauses are the keys Stats.Resyncs always has.
var resyncCauses = [...]resyncCause{resyncInitial, resyncOverflow, resyncInterrupted, resyncReconnect,
	resyncRequested, resyncRoutes, resyncRules, resyncLinkRoutes}

// Stats are counters for metrics.
type Stats struct {
	Synced bool
	Events map[Kind]uint64 // events applied, by kind
	// Resyncs counts dumps by cause, each of which is always a key:
	// initial, overflow (events were lost), interrupted (a dump marked
	// interrupted), reconnect, requested (Watcher.Resync or an
	// undecodable message), routes (after a silent kernel change), rules
	// and link-routes (a link's routes, after a change of the link).
	Resyncs          map[string]uint64
	Reconnects       uint64
	Malformed        uint64 // messages that failed to decode (each forces a resync)
	LastSyncDuration time.Duration
	Generation       uint64
	// MappedBytes is the memory the cached routes hold outside the Go
	// heap, which runtime.MemStats does not count: a large table's
	// routes are mapped in chunks of their own (about 160 KiB per 4,096
	// IPv4 routes) so that their growth does not pace the garbage
	// collector.
	MappedBytes int64
}

// Watcher keeps a cache of a network namespace's links, addresses, routes
// and rules, fed by rtnetlink multicast. Create it with New, start it with
// Run, and read it with Read and Subscribe (Barrier waits for it to hold
// a change the caller made).
//
// Run is called once. Every other method is safe to call from any
// goroutine, during Run or not: Read holds a read lock while its callback
// runs (events wait), so the callback must not call Barrier or
// WaitSynced, which wait for Run.
type Watcher struct {
	opts   Options
	dialer rtnl.Dialer // the kernel in opts.NetNS, or a fake kernel
	tables tableFilter
	log    *slog.Logger

	mu sync.RWMutex // guards st, subs
	st *state
	// subs receive every change; see Subscribe.
	subs map[*Subscription]struct{}

	// changed is closed at the next change of st and replaced; see
	// Changed. Guarded by mu; now holds it too, with st's synced and gen.
	changed chan struct{}
	now     atomic.Pointer[cacheState]
	// journal keeps the latest changes for View.Changes; guarded by mu.
	journal journal
	// findings are the differences the last re-dump found, applied to st
	// and not yet published: an event on its way may yet say who made
	// them (claim, settleFindings). Guarded by mu.
	findings []Event
	// owners finds the processes behind the ports of notifications.
	owners ownerFinder

	resyncReq atomic.Bool
	// rechecks are links whose IPv6 routes are due to be read again
	// (recheckLater); guarded by recheckMu.
	recheckMu   sync.Mutex
	rechecks    []linkFamily
	recheckWait map[linkFamily]bool // in a timer or in rechecks
	kickMu      sync.Mutex
	kick        rtnl.Conn // the multicast conn to interrupt, while a session runs
	kickGen     uint64    // counts the changes of kick
	bar         barriers

	statMu sync.Mutex
	stats  Stats

	running atomic.Bool
	// dumpBufs are the receive buffers of dumps, kept from one dump to
	// the next of a sync, and one of them between syncs; only Run's
	// goroutine and a dump's caching goroutine use them.
	dumpBufs [][]byte
}

// New returns a Watcher that does nothing until Run.
func New(opts Options) *Watcher {
	if opts.ReadBuffer == 0 {
		opts.ReadBuffer = defaultReadBuffer
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = 100 * time.Millisecond
	}
	if opts.RetryMax < opts.RetryMin {
		opts.RetryMax = max(opts.RetryMin, 30*time.Second)
	}
	w := &Watcher{
		opts:    opts,
		dialer:  dialerOf(opts.NetNS),
		tables:  newTableFilter(opts.RouteTables),
		log:     opts.Logger,
		st:      newState(),
		subs:    make(map[*Subscription]struct{}),
		changed: make(chan struct{}),
		stats:   Stats{Events: make(map[Kind]uint64), Resyncs: make(map[string]uint64)},
	}
	if d, ok := w.dialer.(interface{ owners() ownerFinder }); ok {
		w.owners = d.owners()
	}
	for _, c := range resyncCauses {
		w.stats.Resyncs[c] = 0
	}
	w.now.Store(&cacheState{changed: w.changed})
	return w
}

// Read calls fn with a consistent view of the cache. Events wait while fn
// runs, so fn should compute and return, leaving kernel I/O to the caller.
func (w *Watcher) Read(fn func(View)) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	fn(w.view())
}

// view is the cache as a View; called with mu held.
func (w *Watcher) view() View {
	return View{s: w.st, j: &w.journal, changed: w.changed, tables: w.tables, held: len(w.findings) > 0}
}

// synced reports whether the cache currently mirrors the kernel (as
// Stats.Synced and View.Synced say).
func (w *Watcher) synced() bool { return w.now.Load().synced }

// nextChange returns a channel that is closed at the next change of the cache
// after the call: an event applied, a resync swapped in, the cache becoming
// synced or unsynced. Any number of goroutines may wait on it; to wait for
// a condition, take the channel, check the condition, then wait:
//
//	for ch := w.nextChange(); !cond(); ch = w.nextChange() {
//		<-ch
//	}
func (w *Watcher) nextChange() <-chan struct{} { return w.now.Load().changed }

// WaitSynced waits until the cache is synced, or returns ctx's error.
func (w *Watcher) WaitSynced(ctx context.Context) error {
	for {
		ch := w.nextChange()
		if w.synced() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// Resync asks a running watcher to dump everything again, as a periodic
// safety net. It does not wait.
func (w *Watcher) Resync() {
	w.resyncReq.Store(true)
	w.interrupt()
}

// Stats returns a copy of the counters.
func (w *Watcher) Stats() Stats {
	w.mu.RLock()
	mapped := w.st.mapped()
	w.mu.RUnlock()
	now := w.now.Load()
	w.statMu.Lock()
	defer w.statMu.Unlock()
	s := w.stats
	s.Synced, s.Generation = now.synced, now.gen
	s.Events = maps.Clone(w.stats.Events)
	s.Resyncs = maps.Clone(w.stats.Resyncs)
	s.MappedBytes = mapped
	return s
}

// recheckDelay is how long after a link event its routes are read once
// more (see applyLink): the kernel changes them in the notifier chain that
// sent the event, which linkwatch may run up to a second later for a
// carrier change, and not always with an event of its own.
const recheckDelay = 1500 * time.Millisecond

// linkFamily names the routes of one family (an index of state.tables) out
// of one link.
type linkFamily struct {
	f     int
	index uint32
}

// recheckLater has the receive loop read the routes in later (by family)
// again after recheckDelay. Routes already waiting for their re-read are not
// added again, so a stream of link events costs one timer and one re-read
// per link, family and delay, however many events there are.
func (w *Watcher) recheckLater(later [2][]uint32) {
	w.recheckMu.Lock()
	defer w.recheckMu.Unlock()
	if w.recheckWait == nil {
		w.recheckWait = make(map[linkFamily]bool)
	}
	var add []linkFamily
	for f, links := range later {
		for _, idx := range links {
			if lf := (linkFamily{f, idx}); !w.recheckWait[lf] {
				w.recheckWait[lf] = true
				add = append(add, lf)
			}
		}
	}
	if len(add) == 0 {
		return
	}
	time.AfterFunc(recheckDelay, func() {
		w.recheckMu.Lock()
		w.rechecks = append(w.rechecks, add...)
		w.recheckMu.Unlock()
		w.interrupt()
	})
}

// takeRechecks returns the routes due for a re-read, and forgets them.
func (w *Watcher) takeRechecks() []linkFamily {
	w.recheckMu.Lock()
	defer w.recheckMu.Unlock()
	due := w.rechecks
	w.rechecks = nil
	for _, lf := range due {
		delete(w.recheckWait, lf)
	}
	return due
}

func (w *Watcher) interrupt() {
	w.kickMu.Lock()
	defer w.kickMu.Unlock()
	if w.kick != nil {
		w.kick.SetReadDeadline(time.Unix(1, 0))
	}
}

// setKick records the session's multicast conn, nil when it ends.
func (w *Watcher) setKick(mc rtnl.Conn) {
	w.kickMu.Lock()
	defer w.kickMu.Unlock()
	w.kick = mc
	w.kickGen++
}

// errRunning is returned by a second concurrent Run.
var errRunning = errors.New("netwatch: watcher already running")

// Run keeps the cache until ctx ends, then returns nil. Socket failures
// are retried with backoff: meanwhile the cache keeps its last content but
// is not synced. Run returns an error only for a second concurrent call.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer w.running.Store(false)
	defer w.bar.releaseOlder(^uint64(0), errNotRunning)

	stop := context.AfterFunc(ctx, w.interrupt)
	defer stop()
	if o, ok := w.owners.(interface{ run(context.Context) }); ok {
		// The look-ups that would delay events run beside them.
		octx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); o.run(octx) }()
		defer func() { cancel(); <-done }()
	}

	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(w.opts.RetryMin),
		backoff.WithMaxInterval(w.opts.RetryMax),
		backoff.WithMaxElapsedTime(0))
	cause := resyncInitial
	for {
		err := w.session(ctx, cause, bo)
		if ctx.Err() != nil {
			return nil
		}
		w.setUnsynced()
		w.statMu.Lock()
		w.stats.Reconnects++
		w.statMu.Unlock()
		d := bo.NextBackOff()
		w.log.Warn("netwatch: rtnetlink session failed; reconnecting", "err", err, "retry_in_s", d.Seconds())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		cause = resyncReconnect
	}
}

func (w *Watcher) setUnsynced() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.st.synced {
		w.st.synced = false
		w.st.gen++
		w.signal()
	}
}

// session runs one pair of sockets until it fails or ctx ends.
func (w *Watcher) session(ctx context.Context, cause resyncCause, bo backoff.BackOff) error {
	mc, err := w.dialer.Dial(rtnl.DialConfig{Groups: groups, ReadBuffer: w.opts.ReadBuffer})
	if err != nil {
		return err
	}
	s := &receiveLoop{w: w, mc: mc}
	defer func() { s.mc.Close() }() // s.mc is replaced after an overflow
	rc, err := w.dialer.Dial(rtnl.DialConfig{})
	if err != nil {
		return err
	}
	defer rc.Close()
	s.rc = rc

	w.setKick(mc)
	defer w.setKick(nil)
	stopRC := context.AfterFunc(ctx, func() { rc.SetReadDeadline(time.Unix(1, 0)) })
	defer stopRC()
	if ctx.Err() != nil {
		return ctx.Err()
	}

	// The multicast socket joined its groups when it was dialed: events
	// from now on queue in it while the dump runs, and are applied after.
	if err := w.fullSync(rc, cause); err != nil {
		return err
	}
	bo.Reset()
	return s.run(ctx)
}

// receiveLoop is a session once it has synced: its sockets, and what one
// round of reading the multicast socket leaves for the next.
type receiveLoop struct {
	w       *Watcher
	mc      rtnl.Conn // the multicast socket; replaced after an overflow
	rc      rtnl.Conn // the request socket, for dumps
	batch   []change  // the events of the round, its array reused
	replies []uint32  // to Barrier calls, read in this round
	buf     []byte    // the datagrams of the round, its array reused
	pending redumps   // re-dumps waiting for the drain
	drain   uint32    // the drain request's sequence; 0 when none is out
	// confirming: the drain out is the one after a re-dump that found
	// differences, which wait for it to be published.
	confirming bool
}

// run reads and applies events a round at a time, a round being what one
// read of the multicast socket returns, until a socket fails or ctx ends.
// A round ends with a resync when one is due, else with the pending
// re-dumps; then the Barrier calls answered in it end, unless they wait for
// a re-dump.
func (s *receiveLoop) run(ctx context.Context) error {
	w := s.w
	for {
		drained, recvErr := s.receive()
		switch {
		case recvErr == nil:
		case ctx.Err() != nil:
			return nil
		case errors.Is(recvErr, os.ErrDeadlineExceeded):
			// Interrupted to resync; clear the deadline and go on.
			if err := s.mc.SetReadDeadline(time.Time{}); err != nil {
				return err
			}
		case errors.Is(recvErr, errTruncated):
			w.log.Warn("netwatch: rtnetlink datagram cut short; resyncing", "err", recvErr)
			if err := s.resync(resyncOverflow); err != nil {
				return err
			}
			continue
		case errors.Is(recvErr, unix.ENOBUFS):
			w.log.Warn("netwatch: rtnetlink receive buffer overflowed; resyncing", "buffer", w.opts.ReadBuffer)
			if err := s.reopen(); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			if err := s.resync(resyncOverflow); err != nil {
				return err
			}
			continue
		default:
			return fmt.Errorf("netwatch: receive events: %w", recvErr)
		}
		if w.resyncReq.Swap(false) {
			if err := s.resync(resyncRequested); err != nil {
				return err
			}
			continue
		}
		for _, lf := range w.takeRechecks() {
			w.mu.RLock()
			_, ok := w.st.links[lf.index]
			w.mu.RUnlock()
			if ok {
				s.pending.addOut(lf.f, lf.index)
			}
		}
		if s.pending.any() {
			// A re-dump takes the RTNL lock and a few round trips: let
			// the goroutines that the events just woke (a Reconciler
			// about to repair) run first, on this thread.
			runtime.Gosched()
		}
		waiting, err := s.redumpPending(drained)
		if err != nil {
			return err
		}
		if !waiting {
			s.doneRound()
		}
	}
}

// receive reads one round's messages from the multicast socket (every
// datagram queued, ReceiveBatch) and applies their events under one lock.
// It reports whether the drain's reply was among them, and the read's
// error, which comes after the messages read before it.
func (s *receiveLoop) receive() (drained bool, recvErr error) {
	s.batch = s.batch[:0]
	pid := s.mc.PID()
	var data []byte
	data, recvErr = s.mc.ReceiveBatch(s.buf[:0])
	s.buf = data[:0]
	for len(data) > 0 {
		h, body, rest, err := nextMessage(data)
		if err != nil {
			s.malformed(h.Type, err)
			break
		}
		data = rest
		if s.take(netlink.Message{Header: h, Data: body}, pid) {
			drained = true
		}
	}
	if len(s.batch) > 0 {
		rd := s.w.applyBatch(s.batch)
		s.pending.add(rd)
		if len(rd.later[0]) > 0 || len(rd.later[1]) > 0 {
			s.w.recheckLater(rd.later)
		}
	}
	return drained, recvErr
}

// malformed counts a message that cannot be read and asks for a resync:
// it may have changed anything.
func (s *receiveLoop) malformed(typ netlink.HeaderType, err error) {
	w := s.w
	w.log.Warn("netwatch: undecodable event; resyncing", "type", typ, "err", err)
	w.statMu.Lock()
	w.stats.Malformed++
	w.statMu.Unlock()
	w.resyncReq.Store(true)
}

// take sorts one message received on the multicast socket, whose port is
// pid, into the round's replies, re-dumps or batch. It reports whether m
// is the drain's reply.
func (s *receiveLoop) take(m netlink.Message, pid uint32) (drain bool) {
	w := s.w
	if m.Header.PID == pid {
		// A reply to our own request: the drain's or a Barrier's.
		if s.drain != 0 && m.Header.Sequence == s.drain {
			return true
		}
		s.replies = append(s.replies, m.Header.Sequence)
		return false
	}
	if m.Header.Type == unix.RTM_DELNEXTHOP {
		// The kernel flushes the IPv4 routes that used the
		// object and shrinks the groups it was in, silently.
		s.pending.add(allRoutes)
		return false
	}
	if m.Header.Type < unix.RTM_BASE {
		return false // NLMSG_NOOP, _DONE and _OVERRUN carry no change
	}
	ev, err := decode(m, w.tables)
	if errors.Is(err, errSkip) {
		return false
	}
	if err != nil {
		s.malformed(m.Header.Type, err)
		return false
	}
	ev.Origin = w.origin(m.Header.PID)
	s.batch = append(s.batch, ev)
	return false
}

// reopen replaces the multicast socket after an overflow. The kernel then
// drops events without reporting another overflow until the socket's queue
// has been read empty (NETLINK_S_CONGESTED): what it drops while the dump
// runs would be lost silently. A new socket starts empty and reports the
// next overflow; the dump covers what the old one held.
func (s *receiveLoop) reopen() error {
	next, err := s.w.dialer.Dial(rtnl.DialConfig{Groups: groups, ReadBuffer: s.w.opts.ReadBuffer})
	if err != nil {
		return err
	}
	s.mc.Close()
	s.mc = next
	s.w.setKick(s.mc)
	return nil
}

// resync dumps everything again and starts afresh: the dump covers the
// pending re-dumps, a late drain reply is ignored, and the Barrier calls
// answered in this round end, the dump having brought in what came before
// their replies.
func (s *receiveLoop) resync(cause resyncCause) error {
	if err := s.w.fullSync(s.rc, cause); err != nil {
		return err
	}
	s.pending, s.drain, s.confirming = redumps{}, 0, false
	s.doneRound()
	return nil
}

// redumpPending re-dumps what the kernel may have changed without events,
// once the drain has come back. It reports whether the round's Barrier
// calls must wait, as they do for a re-dump that is not done yet.
func (s *receiveLoop) redumpPending(drained bool) (waiting bool, err error) {
	if s.confirming {
		if !drained {
			return true, nil
		}
		s.drain, s.confirming, drained = 0, false, false
		s.w.settleFindings()
	}
	if !s.pending.any() {
		return false, nil
	}
	if s.drain == 0 {
		// The kernel makes its silent changes under the RTNL lock after
		// sending the event that implies them, and may send more events
		// meanwhile (the IPv6 routes of a link going down). Wait for the
		// lock, then read what it queued before re-dumping: those events
		// keep their origins, and the re-dump compares with a cache that
		// has them. Barriers wait for the re-dump.
		rtnlBarrier(s.rc)
		s.drain = s.w.bar.next()
		return true, sendBarrier(s.mc, s.drain)
	}
	if !drained {
		return true, nil
	}
	s.drain = 0
	if err := s.w.redump(s.rc, s.pending); err != nil {
		return false, err
	}
	s.pending = redumps{}
	if !s.w.hasFindings() {
		return false, nil
	}
	// The re-dump found differences. A dump can see a change before its
	// event is read: the kernel announces rule changes after it releases
	// the RTNL lock, and a route can change between the drain and the
	// dump. Another drain brings such events in; each claims the finding
	// it explains, with its origin, and what is left was the kernel's
	// silent doing.
	rtnlBarrier(s.rc)
	s.drain, s.confirming = s.w.bar.next(), true
	return true, sendBarrier(s.mc, s.drain)
}

// doneRound ends the Barrier calls whose replies came in this round,
// once what came before them is in the cache.
func (s *receiveLoop) doneRound() {
	if len(s.replies) > 0 {
		s.w.bar.release(s.replies)
		s.replies = s.replies[:0]
	}
}

// applyBatch applies events to the cache under one lock and tells
// subscribers.
func (w *Watcher) applyBatch(batch []change) (redump redumps) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	var byKind [5]uint64
	for i := range batch {
		ev := &batch[i]
		changed, rd := w.st.apply(ev)
		redump.add(rd)
		if !changed {
			w.claim(ev.Event)
			continue
		}
		n++
		byKind[ev.Kind]++
		w.publish(*ev)
	}
	if n > 0 {
		w.st.gen += uint64(n)
		w.signal()
	}
	w.statMu.Lock()
	for k, c := range byKind {
		if c > 0 {
			w.stats.Events[Kind(k)] += c
		}
	}
	w.statMu.Unlock()
	return redump
}

// signal wakes the waiters of Changed; called with mu held for writing.
func (w *Watcher) signal() {
	close(w.changed)
	w.changed = make(chan struct{})
	w.now.Store(&cacheState{synced: w.st.synced, gen: w.st.gen, changed: w.changed})
}

// cacheState is what the Watcher's Synced and Stats and a View's Changed read without the lock, so
// that a Read or Subscribe callback may call them.
type cacheState struct {
	synced  bool
	gen     uint64
	changed chan struct{}
}

// selfPID is this process's ID, asked once: origin needs it per event.
var selfPID = os.Getpid()

// origin names who caused a notification sent with port in its header.
func (w *Watcher) origin(port uint32) Origin {
	if port == 0 {
		return Origin{Kind: OriginKernel}
	}
	o := Origin{Kind: OriginProgram, Port: port}
	if w.owners != nil {
		if pid, comm, ok := w.owners.find(port); ok {
			o.PID, o.Comm = pid, comm
			if pid == selfPID {
				o.Kind = OriginSelf
			}
		}
	}
	return o
}
