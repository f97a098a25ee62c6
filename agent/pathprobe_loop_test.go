//go:build linux

package main

import (
	"context"
	"maps"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/internal/pathprobe"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
)

// fakeSearcher answers every search with the largest size (the path
// carries the tunnel MTU) after probesPerSearch probes, and counts the
// searches by peer.
type fakeSearcher struct {
	mu       sync.Mutex
	searched map[netip.Addr]int
	each     chan netip.Addr // every search's peer, as it starts
}

const probesPerSearch = 3

func newFakeSearcher() *fakeSearcher {
	return &fakeSearcher{searched: make(map[netip.Addr]int), each: make(chan netip.Addr, 100)}
}

func (s *fakeSearcher) Search(ctx context.Context, peer netip.Addr, max int) (pathprobe.Result, error) {
	s.mu.Lock()
	s.searched[peer]++
	s.mu.Unlock()
	s.each <- peer
	return pathprobe.Result{Peer: peer, PathMTU: max, Probes: probesPerSearch}, nil
}

func (s *fakeSearcher) counts() map[netip.Addr]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.searched)
}

// probeHarness is the loop on the fake kernel with a prober searching
// through a fakeSearcher, one search at a time; its Scheduler runs from
// runScheduler until stopScheduler.
type probeHarness struct {
	*harness
	pr     *prober
	fs     *fakeSearcher
	enp    uint32 // enp7s0's index
	cancel context.CancelFunc
	done   chan struct{}
}

func newProbeHarness(t *testing.T) *probeHarness {
	t.Helper()
	k, enp, _ := seedKernel(t)
	h := newHarnessCfg(t, k, peersConfig())
	fs := newFakeSearcher()
	pr, err := newProberWith(h.l, nil, pathprobe.SchedulerConfig{Searcher: fs, Parallel: 1})
	must(t, err)
	h.l.probe = pr
	return &probeHarness{harness: h, pr: pr, fs: fs, enp: enp}
}

func (h *probeHarness) runScheduler() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan struct{})
	go func() { defer close(h.done); _ = h.pr.sched.Run(ctx) }()
	h.t.Cleanup(h.stopScheduler)
}

// stopScheduler stops the Scheduler and waits until it returned: nothing
// is searched after.
func (h *probeHarness) stopScheduler() {
	if h.cancel != nil {
		h.cancel()
		<-h.done
	}
}

// nextSearch waits for the next search to start and returns its peer.
func (h *probeHarness) nextSearch() netip.Addr {
	h.t.Helper()
	select {
	case a := <-h.fs.each:
		return a
	case <-time.After(2 * time.Minute): // only a hang gets here
		h.t.Fatalf("no search; searched %v; log:\n%s", h.fs.counts(), h.log())
	}
	return netip.Addr{}
}

// A peer is probed only when the main route to it has a gateway: one on
// the link itself is not (its path is the link's), until its main route
// changes to go through a router; then it is searched at once.
func TestProberOnlyBeyondTheLink(t *testing.T) {
	h := newProbeHarness(t)
	enp := h.enp
	must(t, h.k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("10.1.0.0/24"), Index: enp, Protocol: unix.RTPROT_KERNEL,
		Scope: unix.RT_SCOPE_LINK, PrefSrc: netip.MustParseAddr("10.0.0.5")}))
	viaGW, onLink := netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("10.1.0.7")
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.l.setPeers(peers("10.0.0.9", "10.1.0.7"))
	h.waitPass("that splits the peers", func(p reconcile.Pass) bool { return len(p.Applied) > 0 })
	h.waitConverged()
	if got := h.pr.sched.Stats().Peers; got != 1 {
		t.Errorf("the scheduler has %d peers, want 1 (%v)", got, viaGW)
	}

	// A queued onLink would be urgent from the start: it would be among
	// the first two searches.
	h.runScheduler()
	if got := h.nextSearch(); got != viaGW {
		t.Errorf("first search of %v, want %v", got, viaGW)
	}
	h.pr.sched.Trigger(onLink)
	h.pr.sched.Trigger(viaGW)
	if got := h.nextSearch(); got != viaGW {
		t.Errorf("second search of %v, want %v", got, viaGW)
	}

	// The main path to onLink now goes through 10.0.0.1.
	must(t, h.k.ReplaceRoute(netwatch.Route{Dst: netip.MustParsePrefix("10.1.0.0/24"), Gateway: netip.MustParseAddr("10.0.0.1"),
		Index: enp, Protocol: unix.RTPROT_KERNEL, PrefSrc: netip.MustParseAddr("10.0.0.5")}))
	if got := h.nextSearch(); got != onLink {
		t.Errorf("after its main path changed: a search of %v, want %v", got, onLink)
	}
	h.stopScheduler()
	want := map[netip.Addr]int{viaGW: 2, onLink: 1}
	if diff := cmp.Diff(want, h.fs.counts()); diff != "" {
		t.Errorf("searches (-want +got):\n%s", diff)
	}
	var m dto.Metric
	must(t, h.pr.probes.Write(&m))
	if got := m.GetCounter().GetValue(); got != 3*probesPerSearch {
		t.Errorf("probes %v, want %v", got, 3*probesPerSearch)
	}
}

// A peer whose path MTU was learned from ICMP is not probed: ICMP already
// measured it (issue 35, "the ICMP peer converges without a single
// probe"), even when it was queued before the value came.
func TestProberSkipsLearnedPeers(t *testing.T) {
	h := newProbeHarness(t)
	probed, learned := netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("10.0.0.11")
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.l.setPeers(peers("10.0.0.9", "10.0.0.11"))
	h.waitPass("that splits the peers", applied(4))
	h.waitConverged()
	if got := h.pr.sched.Stats().Peers; got != 2 {
		t.Fatalf("the scheduler has %d peers before ICMP, want 2", got)
	}
	h.takeLines()

	lr := &learner{l: h.l, dump: func() ([]pathmtu.Exception, error) {
		return []pathmtu.Exception{{Dst: learned, Table: 254, MTU: 1300}}, nil
	}, del: func(pathmtu.Exception) error { return nil }}
	lr.learn()
	h.waitPass("that lowers the learned peer", applied(1))
	if got := h.takeLines(); len(got) != 1 || got[0] != "table 900: 10.0.0.11 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1232 (was 1355)" {
		t.Errorf("lines: %q", got)
	}
	if got := h.pr.sched.Stats().Peers; got != 1 {
		t.Errorf("the scheduler has %d peers after ICMP, want 1", got)
	}

	h.runScheduler()
	if got := h.nextSearch(); got != probed {
		t.Errorf("first search of %v, want %v", got, probed)
	}
	h.pr.sched.Trigger(learned)
	h.pr.sched.Trigger(probed)
	if got := h.nextSearch(); got != probed {
		t.Errorf("second search of %v, want %v", got, probed)
	}
	h.stopScheduler()
	if diff := cmp.Diff(map[netip.Addr]int{probed: 2}, h.fs.counts()); diff != "" {
		t.Errorf("searches (-want +got):\n%s", diff)
	}
	if v := h.l.pmtu.Get(learned); v.Source != pathmtu.SourceLearned || v.Path != 1300 {
		t.Errorf("%v: %+v, want 1300 learned", learned, v)
	}
}
