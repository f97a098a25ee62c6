//go:build linux

package netwatch

import (
	"errors"
	"fmt"
	"time"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// maxDumpAttempts bounds the retries of a dump the kernel marked
// interrupted before the watcher gives up on the session and reconnects.
const maxDumpAttempts = 10

// redump re-reads what pending says.
func (w *Watcher) redump(rc rtnl.Conn, pending redumps) error {
	if pending.routes[0] || pending.routes[1] {
		if err := w.redumpRoutes(rc, pending); err != nil {
			return err
		}
	}
	for i, f := range []Family{IPv4, IPv6} {
		if len(pending.out[i]) == 0 || pending.routes[i] {
			continue
		}
		if err := w.redumpRoutesOut(rc, f, pending.out[i]); err != nil {
			return err
		}
	}
	if pending.rules {
		return w.redumpRules(rc)
	}
	return nil
}

// fullSync dumps everything into a new state and swaps it in.
func (w *Watcher) fullSync(rc rtnl.Conn, cause resyncCause) error {
	defer w.releaseDumpBuffers()
	start := time.Now()
	next := newState()
	steps := []func(*state) error{
		func(s *state) error { return w.dump(rc, dumpOf{typ: unix.RTM_GETLINK, af: unix.AF_UNSPEC}, s) },
		func(s *state) error { return w.dump(rc, dumpOf{typ: unix.RTM_GETADDR, af: unix.AF_INET}, s) },
		func(s *state) error { return w.dump(rc, dumpOf{typ: unix.RTM_GETADDR, af: unix.AF_INET6}, s) },
		func(s *state) error { return w.dumpRoutes(rc, IPv4, s) },
		func(s *state) error { return w.dumpRoutes(rc, IPv6, s) },
		func(s *state) error { return w.dump(rc, dumpOf{typ: unix.RTM_GETRULE, af: unix.AF_INET}, s) },
		func(s *state) error { return w.dump(rc, dumpOf{typ: unix.RTM_GETRULE, af: unix.AF_INET6}, s) },
	}
	for _, step := range steps {
		if err := step(next); err != nil {
			return err
		}
	}
	w.mu.Lock()
	// Findings of a re-dump whose confirmation this sync cuts short go
	// out first, as the re-dump's.
	w.publishFindings()
	old := w.st
	next.synced = true
	next.gen = old.gen + 1
	if cause != resyncInitial {
		// What differs was changed without an event reaching the cache.
		diffStates(old, next, w.publishResync)
	}
	w.st = next
	w.signal()
	w.mu.Unlock()
	// The dump started after any Barrier sent on an earlier socket.
	w.kickMu.Lock()
	gen := w.kickGen
	w.kickMu.Unlock()
	w.bar.releaseOlder(gen, nil)

	w.statMu.Lock()
	w.stats.Resyncs[cause]++
	w.stats.LastSyncDuration = time.Since(start)
	w.statMu.Unlock()
	if cause != resyncInitial {
		w.log.Info("netwatch: resynced", "cause", cause, "took_ms", float64(time.Since(start).Microseconds())/1000)
	}
	return nil
}

// redumpRoutes re-reads the routes of the marked families after a change
// the kernel makes without events.
func (w *Watcher) redumpRoutes(rc rtnl.Conn, fams redumps) error {
	defer w.releaseDumpBuffers()
	for i, f := range []Family{IPv4, IPv6} {
		if !fams.routes[i] {
			continue
		}
		next := newState()
		if err := w.dumpRoutes(rc, f, next); err != nil {
			return err
		}
		w.mu.Lock()
		diffTables(w.st.tables[i], next.tables[i], w.holdFinding)
		w.st.tables[i] = next.tables[i]
		w.st.gen++
		w.signal()
		w.mu.Unlock()
		w.statMu.Lock()
		w.stats.Resyncs[resyncRoutes]++
		w.statMu.Unlock()
	}
	return nil
}

// maxOutDumps is how many links' routes a re-dump reads link by link;
// more, as a burst of link changes brings, and it reads the family whole.
const maxOutDumps = 16

// redumpRoutesOut re-reads the routes of family f out of the given links,
// each with a dump the kernel filters by output link, and replaces the
// cache's routes out of them with what it lists. Routes through several
// paths, and keys that hold several routes, cannot be replaced link by
// link: when the cache or a dump has one, the family is read whole.
func (w *Watcher) redumpRoutesOut(rc rtnl.Conn, f Family, links []uint32) error {
	if len(links) > maxOutDumps {
		return w.redumpRoutes(rc, familyRedump(f))
	}
	defer w.releaseDumpBuffers()
	af := uint8(unix.AF_INET)
	if f == IPv6 {
		af = unix.AF_INET6
	}
	for _, idx := range links {
		next := newState()
		tables := w.opts.RouteTables
		if tables == nil {
			tables = []Table{0}
		}
		for _, t := range tables {
			if err := w.dump(rc, dumpOf{typ: unix.RTM_GETROUTE, af: af, table: t, oif: idx}, next); err != nil {
				return err
			}
		}
		w.mu.Lock()
		done := w.st.replaceOut(f, idx, next, w.holdFinding)
		if done {
			w.st.gen++
			w.signal()
		}
		w.mu.Unlock()
		if !done {
			return w.redumpRoutes(rc, familyRedump(f))
		}
		w.statMu.Lock()
		w.stats.Resyncs[resyncLinkRoutes]++
		w.statMu.Unlock()
	}
	return nil
}

// familyRedump is a re-dump of every route of family f.
func familyRedump(f Family) redumps {
	var r redumps
	r.routes[fi(f)] = true
	return r
}

// redumpRules re-reads the rules of both families after a rule event the
// cache could not apply unambiguously.
func (w *Watcher) redumpRules(rc rtnl.Conn) error {
	defer w.releaseDumpBuffers()
	next := newState()
	for _, af := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if err := w.dump(rc, dumpOf{typ: unix.RTM_GETRULE, af: af}, next); err != nil {
			return err
		}
	}
	w.mu.Lock()
	for f := range next.rules {
		diffRules(w.st.rules[f], next.rules[f], w.holdFinding)
	}
	w.st.rules = next.rules
	w.st.gen++
	w.signal()
	w.mu.Unlock()
	w.statMu.Lock()
	w.stats.Resyncs[resyncRules]++
	w.statMu.Unlock()
	return nil
}

func (w *Watcher) dumpRoutes(rc rtnl.Conn, f Family, s *state) error {
	af := uint8(unix.AF_INET)
	if f == IPv6 {
		af = unix.AF_INET6
	}
	if w.opts.RouteTables == nil {
		return w.dump(rc, dumpOf{typ: unix.RTM_GETROUTE, af: af}, s)
	}
	for _, t := range w.opts.RouteTables {
		if err := w.dump(rc, dumpOf{typ: unix.RTM_GETROUTE, af: af, table: t}, s); err != nil {
			return err
		}
	}
	return nil
}

// dump runs one dump into s, again while the kernel marks it interrupted.
func (w *Watcher) dump(rc rtnl.Conn, d dumpOf, s *state) error {
	for attempt := 1; ; attempt++ {
		intr, err := w.dumpOnce(rc, d, s)
		if err != nil || !intr {
			return err
		}
		w.statMu.Lock()
		w.stats.Resyncs[resyncInterrupted]++
		w.statMu.Unlock()
		if attempt == maxDumpAttempts {
			return fmt.Errorf("netwatch: dump of type %d family %d interrupted %d times", d.typ, d.af, attempt)
		}
		clearDump(d, s)
	}
}

// clearDump forgets what an interrupted dump put into s.
func clearDump(d dumpOf, s *state) {
	f, _ := familyOf(d.af)
	switch d.typ {
	case unix.RTM_GETLINK:
		clear(s.links)
	case unix.RTM_GETADDR:
		for k := range s.addrs {
			if FamilyOf(k.Prefix.Addr()) == f {
				delete(s.addrs, k)
			}
		}
	case unix.RTM_GETROUTE:
		if d.table == 0 || d.oif != 0 {
			clear(s.tables[fi(f)]) // a dump by link has a state of its own
		} else {
			delete(s.tables[fi(f)], d.table)
		}
	case unix.RTM_GETRULE:
		s.rules[fi(f)] = nil
	}
}

// dumpOnce runs one dump into s and reports whether the kernel marked it
// interrupted. A dump of a table that does not exist (yet) is empty.
func (w *Watcher) dumpOnce(rc rtnl.Conn, d dumpOf, s *state) (intr bool, err error) {
	req, err := rc.Send(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(d.typ), Flags: netlink.Request | netlink.Dump},
		Data:   dumpRequest(d),
	})
	if err != nil {
		return false, fmt.Errorf("netwatch: request dump: %w", err)
	}
	// A dump that fits one datagram (a table of rules, a link's routes, a
	// small node's anything) is cached here; a longer one through a
	// pipe, from its first datagram on.
	var (
		p                 *dumpPipe
		recvErr, applyErr error
	)
	for end := false; !end; {
		var buf []byte
		if p != nil {
			buf = p.buffer()
		} else if n := len(w.dumpBufs); n > 0 {
			buf, w.dumpBufs = w.dumpBufs[n-1], w.dumpBufs[:n-1]
		} else {
			buf = make([]byte, dumpBufferSize)
		}
		var d []byte
		d, recvErr = rc.ReceiveDatagram(buf)
		if recvErr == nil {
			var i bool
			end, i, recvErr = scanDump(d, req.Header.Sequence)
			intr = intr || i
		}
		switch {
		case p == nil && (recvErr != nil || end):
			if recvErr == nil {
				applyErr = s.addDatagram(d, w.tables)
			}
			w.dumpBufs = append(w.dumpBufs, buf)
			end = true
		case recvErr != nil:
			end = true
		case p == nil:
			p = w.newDumpPipe(s, 1)
			fallthrough
		default:
			p.send(d)
		}
	}
	if p != nil {
		applyErr = w.closeDumpPipe(p)
	}
	switch {
	case recvErr != nil && d.table != 0 && errors.Is(recvErr, unix.ENOENT):
		return false, nil // the table does not exist yet
	case recvErr != nil && d.oif != 0 && errors.Is(recvErr, unix.ENODEV):
		return false, nil // the link is gone, and every route out of it
	case recvErr != nil:
		return false, fmt.Errorf("netwatch: dump type %d family %d: %w", d.typ, d.af, recvErr)
	}
	return intr, applyErr
}

// dumpPipe takes a dump's datagrams from the goroutine that reads them to
// one that caches them, and their buffers back. A dump can be a full
// routing table: a datagram is cached while the next is read from the
// kernel, which fills them meanwhile. Datagrams go over in batches: the
// caching goroutine keeps up with the kernel and would otherwise wait,
// and be woken, for every one.
type dumpPipe struct {
	free chan []byte    // buffers to read into
	full chan dumpBatch // datagrams to cache
	done chan error     // the caching goroutine's error, once full is closed
	bufs int            // the buffers in use, at most dumpBuffers
	pend dumpBatch      // datagrams read and not yet sent
}

type dumpBatch struct {
	d [dumpBatchLen][]byte
	n int
}

// newDumpPipe starts a goroutine caching into s the datagrams sent on the
// pipe, with the buffers that the sync's last dump kept and inUse more
// that hold datagrams to be sent.
func (w *Watcher) newDumpPipe(s *state, inUse int) *dumpPipe {
	p := &dumpPipe{
		free: make(chan []byte, dumpBuffers),
		full: make(chan dumpBatch, dumpBuffers/dumpBatchLen),
		done: make(chan error, 1),
		bufs: len(w.dumpBufs) + inUse,
	}
	for _, b := range w.dumpBufs {
		p.free <- b
	}
	go func() {
		var err error
		for b := range p.full {
			for _, d := range b.d[:b.n] {
				if err == nil {
					err = s.addDatagram(d, w.tables)
				}
				p.free <- d[:cap(d)]
			}
		}
		p.done <- err
	}()
	return p
}

// send queues datagram d for caching.
func (p *dumpPipe) send(d []byte) {
	p.pend.d[p.pend.n] = d
	if p.pend.n++; p.pend.n == dumpBatchLen {
		p.flush()
	}
}

func (p *dumpPipe) flush() {
	if p.pend.n > 0 {
		p.full <- p.pend
		p.pend = dumpBatch{}
	}
}

// buffer returns a buffer to read the next datagram into: a free one, else
// a new one while fewer than dumpBuffers exist, else the next one the
// caching goroutine frees.
func (p *dumpPipe) buffer() []byte {
	select {
	case b := <-p.free:
		return b
	default:
	}
	if p.bufs < dumpBuffers {
		p.bufs++
		return make([]byte, dumpBufferSize)
	}
	return <-p.free
}

// closeDumpPipe waits until the datagrams sent are cached and keeps the
// buffers for the sync's next dump. It returns the caching's error.
func (w *Watcher) closeDumpPipe(p *dumpPipe) error {
	p.flush()
	close(p.full)
	err := <-p.done
	clear(w.dumpBufs)
	w.dumpBufs = w.dumpBufs[:0]
	for len(p.free) > 0 {
		w.dumpBufs = append(w.dumpBufs, <-p.free)
	}
	return err
}

// releaseDumpBuffers lets the garbage collector have the dump buffers
// but one once a sync is over: the re-dump that every rule event asks for
// (and a link's routes) fits in one datagram, and allocating its 64 KiB
// each time made the garbage collector run every few seconds beside
// repairs.
func (w *Watcher) releaseDumpBuffers() {
	if len(w.dumpBufs) > 1 {
		clear(w.dumpBufs[1:]) // the array would keep them alive
		w.dumpBufs = w.dumpBufs[:1]
	}
}

// A dump has up to dumpBuffers datagrams in flight, each in a buffer of
// dumpBufferSize: the kernel fills dump datagrams up to 32 KiB (so a
// buffer's second half is never touched, nor its pages resident). A longer
// one (a link with many VFs) comes in a buffer of its own. They go to the
// caching goroutine dumpBatchLen at a time. With 4 buffers and one at a
// time, the reader of a 1,000,000-route dump waited 40–70 ms for free
// buffers (the caching goroutine is faster on average, not at every
// moment), and the hand-over per datagram cost a sync 0.12–0.15× of its
// time in wake-ups. 32 buffers measured ~0.05× faster still than 16, but
// their pages added 0.8 MB to a sync's peak RSS; 16 add nothing
// measurable.
const (
	dumpBuffers    = 16
	dumpBatchLen   = 8
	dumpBufferSize = 64 << 10
)
