package ciliumnode

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/apitest"
)

// TestPeers15000Nodes: a cluster of 15,000 encrypting dual-stack nodes is listed whole and
// every peer's addresses are wanted (issue 31: beyond 10,000 CiliumNodes the list failed
// and, with no earlier list, no node got its split).
func TestPeers15000Nodes(t *testing.T) {
	if testing.Short() {
		t.Skip("15,000 CiliumNodes: not in -short")
	}
	const n = 15000
	nodes := make([]apitest.Node, n)
	for i := range nodes {
		nodes[i] = apiNode(fmt.Sprintf("node-%05d.example.internal", i), 255,
			fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&0xff, i&0xff), fmt.Sprintf("fd00::%x", i+1))
	}
	h := startLive(t, apitest.Options{}, func(c *Config) { c.RequestTimeout = time.Minute }, nodes...)
	(&harness{t: t}).eventuallyWithin("15,000 nodes listed", 3*time.Minute, func() bool {
		ps, _, _ := h.snapshot()
		return ps.Len() == n
	})
	ps, _, _ := h.snapshot()
	addrs, left := ps.Encrypting("node-00000.example.internal")
	if len(addrs) != 2*(n-1) || left != 0 || ps.Dropped() != 0 || len(ps.Problems()) != 0 {
		t.Errorf("%d peer addresses, %d left out, %d nodes dropped, %d problems; want %d, 0, 0, 0",
			len(addrs), left, ps.Dropped(), len(ps.Problems()), 2*(n-1))
	}
}

// growingBackOff is an exponential back-off without jitter from 1 ms that records the
// waits it hands out.
type growingBackOff struct {
	mu    sync.Mutex
	b     backoff.BackOff
	waits []time.Duration
}

func newGrowingBackOff() *growingBackOff {
	return &growingBackOff{b: backoff.NewExponentialBackOff(backoff.WithInitialInterval(time.Millisecond),
		backoff.WithMaxInterval(50*time.Millisecond), backoff.WithRandomizationFactor(0), backoff.WithMaxElapsedTime(0))}
}

func (r *growingBackOff) NextBackOff() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.b.NextBackOff()
	r.waits = append(r.waits, d)
	return d
}

func (r *growingBackOff) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.b.Reset()
}

func (r *growingBackOff) recorded() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.waits...)
}

// TestHostileEmptyPages: a server that answers every page empty, each with a new continue
// token, gets a few pages a list, each later than the last (a back-off that grows), and the
// list fails saying so; the last nodes stand (issue 31: 1,000 requests a list, retried
// every 0.6-0.75 s).
func TestHostileEmptyPages(t *testing.T) {
	rb := newGrowingBackOff()
	h := startLive(t, apitest.Options{}, func(c *Config) { c.Backoff = rb }, apiNode("worker-1", 255, "10.0.0.5"))
	h.await("listed", "worker-1 on 10.0.0.5")
	if err := h.api.AwaitWatches(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.api.Delete("worker-1"); !ok { // every page of the next list is empty
		t.Fatal("no worker-1 to delete")
	}
	h.eventually("deleted", func() bool { ps, _, _ := h.snapshot(); return ps.Len() == 0 })
	before := h.src.Stats().OK
	waitsBefore := len(rb.recorded())
	h.api.SetEndlessList(true)
	h.api.ExpireWatches()
	h.eventually("the empty list failed", func() bool { return h.logs.has("WARN", "empty pages in a row") })
	pages := h.src.Stats().OK - before
	waits := rb.recorded()[waitsBefore:]
	t.Logf("one failed list: %d requests, waits %v", pages, waits)
	if pages > maxEmptyPages+2 {
		t.Errorf("%d requests for one list of empty pages, want at most %d", pages, maxEmptyPages+2)
	}
	if len(waits) < maxEmptyPages || waits[maxEmptyPages-1] <= waits[0] {
		t.Errorf("waits between the empty pages %v: want %d, growing", waits, maxEmptyPages)
	}
}
