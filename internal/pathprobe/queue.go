package pathprobe

import (
	"container/heap"
	"net/netip"
	"time"
)

// queue is the Scheduler's decisions, pure: which peer to search next and
// when, given the times its callers pass in. It reads no clock and is not
// safe for concurrent use (the Scheduler holds its lock).
type queue struct {
	interval time.Duration
	jitter   float64
	rand     func() float64 // in [0, 1)

	peers map[netip.Addr]*entry
	heap  entries // the peers waiting (not being searched)
}

// entry is one peer's schedule.
type entry struct {
	peer    netip.Addr
	max     int
	due     time.Time
	urgent  bool // new, max changed or triggered: before every periodic search
	running bool // being searched: not in the heap
	again   bool // triggered while running: urgent when done
	removed bool // no longer a peer (its search's result is dropped)
	index   int  // in the heap
}

func newQueue(interval time.Duration, jitter float64, rand func() float64) *queue {
	return &queue{interval: interval, jitter: jitter, rand: rand, peers: make(map[netip.Addr]*entry)}
}

// set adds peer, due at once, or updates its max; a changed max makes it
// urgent (its main path changed).
func (q *queue) set(peer netip.Addr, max int, now time.Time) {
	e := q.peers[peer]
	if e == nil {
		e = &entry{peer: peer, max: max, due: now, urgent: true}
		q.peers[peer] = e
		heap.Push(&q.heap, e)
		return
	}
	if e.max != max {
		e.max = max
		q.trigger(peer, now)
	}
}

// remove forgets peer.
func (q *queue) remove(peer netip.Addr) {
	e := q.peers[peer]
	if e == nil {
		return
	}
	delete(q.peers, peer)
	e.removed = true
	if !e.running {
		heap.Remove(&q.heap, e.index)
	}
}

// trigger makes peer urgent; triggers coalesce: an urgent peer stays as it
// is, and a peer being searched is searched once more when done.
func (q *queue) trigger(peer netip.Addr, now time.Time) {
	e := q.peers[peer]
	switch {
	case e == nil:
	case e.running:
		e.again = true
	case e.urgent:
	default:
		e.urgent = true
		e.due = now
		heap.Fix(&q.heap, e.index)
	}
}

// next takes the first peer due at now out of the queue (marking it
// running) and returns it, or returns how long until one is due
// (negative: none is queued).
func (q *queue) next(now time.Time) (*entry, time.Duration) {
	if len(q.heap) == 0 {
		return nil, -1
	}
	if e := q.heap[0]; e.due.After(now) {
		return nil, e.due.Sub(now)
	}
	e := heap.Pop(&q.heap).(*entry)
	e.running = true
	return e, 0
}

// done puts e back after its search ended at now: urgent at once if it was
// triggered meanwhile, else due after the interval with jitter.
func (q *queue) done(e *entry, now time.Time) {
	e.running = false
	if e.removed {
		return
	}
	e.urgent = e.again
	e.again = false
	e.due = now
	if !e.urgent {
		j := time.Duration(float64(q.interval) * q.jitter * (2*q.rand() - 1))
		e.due = now.Add(q.interval + j)
	}
	heap.Push(&q.heap, e)
}

// entries is a heap of entries: urgent first, then by due time.
type entries []*entry

func (h entries) Len() int { return len(h) }
func (h entries) Less(i, j int) bool {
	if h[i].urgent != h[j].urgent {
		return h[i].urgent
	}
	return h[i].due.Before(h[j].due)
}
func (h entries) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *entries) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *entries) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.index = -1
	return e
}
