package wireguard

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marksplit/marksplit/test/wireguard/tunnel"
)

// agentMark is the mark the effect test starts the agent with. Another
// value shows that the test catches an agent that splits on the wrong mark:
//
//	go test -run TestKernelWireGuardEffect -agent-mark=0xd00/0xf00   # FAILs
var agentMark = flag.String("agent-mark", "0xe00/0xf00", "`MARK/MASK` TestKernelWireGuardEffect runs the agent with")

// What the tests send: datagrams that fill cilium_wg0 (MTU 1355) exactly,
// from the worker's tunnel address to the peer's, and a bulk transfer.
const (
	fullSize    = 1355
	fullCount   = 200
	wrongMark   = "0xd00/0xf00"
	ciliumsMark = "0xe00/0xf00"
)

// The bulk transfers and the time limits, for a machine of the usual kind.
// On one that runs everything timeScale times slower (an emulated guest of
// `make test-kernels`), each limit is that many times longer and each bulk
// transfer that many times smaller, so that a transfer still fits its
// limit: the checks stay the same, only the clock is slower.
var (
	timeScale = timeScaleFromEnv()
	bulkBytes = int64(max(20e6/timeScale, 1e6))
	bulkLimit = scaled(3 * time.Second)  // without the agent the transfer starves: what it got in 3 s
	bulkAgent = scaled(10 * time.Second) // with it, 20 MB takes well under a second; room for a loaded machine
	repairSLO = scaled(time.Second)      // DESIGN.md: no repair waits longer than 1 s
)

// timeScaleEnv names how many times slower than usual this machine runs;
// `make test-kernels` sets it in its guests (QEMU under TCG).
const timeScaleEnv = "MARKSPLIT_TIME_SCALE"

func timeScaleFromEnv() float64 {
	f, err := strconv.ParseFloat(os.Getenv(timeScaleEnv), 64)
	if err != nil || f < 1 {
		return 1
	}
	return f
}

func scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * timeScale) }

var (
	echoDst = netip.MustParseAddrPort("10.244.9.1:9000")
	bulkDst = netip.MustParseAddrPort("10.244.9.1:9001")
	nodeDst = netip.MustParseAddrPort("10.0.0.9:9002") // the peer's node address
)

func TestMain(m *testing.M) {
	flag.Parse()
	removeStale()
	code := m.Run()
	if the.dir != "" {
		os.RemoveAll(the.dir)
	}
	os.Exit(code)
}

// fullSize sends fullCount full-size datagrams through the tunnel and
// returns what happened to them.
func (w *world) fullSize(ctx context.Context) tunnel.FullSizeResult {
	w.t.Helper()
	r, err := tunnel.FullSize(ctx, w.worker, w.peer, echoDst, fullSize, fullCount)
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

// effect is the check the agent exists to pass: full-size traffic through
// the tunnel makes the worker fragment nothing, and all of it arrives.
func effect(r tunnel.FullSizeResult) error {
	if r.Sent == 0 {
		return fmt.Errorf("nothing was sent through the tunnel")
	}
	if r.Frag.OKs > 0 || r.Frag.Creates > 0 {
		return fmt.Errorf("WireGuard's packets are still fragmented: %v", r)
	}
	if r.Lost() > 0 {
		return fmt.Errorf("traffic through the tunnel is lost: %v", r)
	}
	return nil
}

// fragmentsWithoutAgent checks that the scenario is real: with the route
// lowered and no agent, every full-size packet through the tunnel leaves
// the worker in fragments.
func (w *world) fragmentsWithoutAgent(ctx context.Context) tunnel.FullSizeResult {
	w.t.Helper()
	r := w.fullSize(ctx)
	if r.Frag.OKs < uint64(r.Sent) || r.Answered == 0 {
		w.t.Fatalf("without the agent, full-size traffic should fragment once per packet and get through: %v", r)
	}
	return r
}

// TestKernelWireGuardEffect runs the same traffic through the tunnel
// without and with the agent: without it FragOKs climbs by one per packet
// and a bulk transfer starves; with it nothing fragments, nothing is lost,
// and the transfer runs at full speed. Host traffic to the peer still uses
// the tunnel MTU.
func TestKernelWireGuardEffect(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()

	before := w.fragmentsWithoutAgent(ctx)
	bulkBefore, err := tunnel.Bulk(ctx, w.worker, w.peer, bulkDst, bulkBytes, bulkLimit)
	if err != nil {
		t.Fatal(err)
	}

	w.startAgent(*agentMark)
	after := w.fullSize(ctx)
	bulkAfter, err := tunnel.Bulk(ctx, w.worker, w.peer, bulkDst, bulkBytes, bulkAgent)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("without the agent: %v", before)
	t.Logf("with the agent --mark=%s: %v", *agentMark, after)
	t.Logf("bulk TCP without the agent: %v", bulkBefore)
	t.Logf("bulk TCP with the agent:    %v", bulkAfter)

	if err := effect(after); err != nil {
		t.Errorf("with the agent (--mark=%s): %v", *agentMark, err)
	}
	// wireguard-go starves without the agent (the kernel refuses its UDP
	// GSO batches larger than the route's MTU), so the agent must make the
	// transfer faster. The kernel's WireGuard sends without GSO and its
	// fragments arrive: without the agent the transfer is fragmented, not
	// starved, and its speed is no measure of the agent (on 5.10 in an
	// emulated guest it was the faster of the two); FragOKs above is.
	if !bulkAfter.Complete() {
		t.Errorf("bulk TCP with the agent should complete: %v", bulkAfter)
	}
	if w.p.wireguardGo != "" && bulkAfter.MBps() <= bulkBefore.MBps() {
		t.Errorf("bulk TCP through wireguard-go with the agent should be faster than without: before %v; after %v", bulkBefore, bulkAfter)
	}
	if !w.unmarkedSplit() {
		t.Errorf("host traffic to the peer should use table 900 at the tunnel MTU:\n%s", w.ipOut(w.worker, "route get 10.0.0.9"))
	}
	if !w.markedMain() {
		t.Errorf("WireGuard's marked packets should use the main route at the link MTU:\n%s", w.ipOut(w.worker, "route get 10.0.0.9 mark 0xe00"))
	}
}

// TestKernelWireGuardWrongMark shows that the effect check catches an
// agent split on a mark WireGuard does not carry: the route shape looks
// right for unmarked traffic, but WireGuard's packets (0xe00) still take
// table 900 at 1355 and fragment.
func TestKernelWireGuardWrongMark(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	w.fragmentsWithoutAgent(ctx)
	w.startAgent(wrongMark)
	r := w.fullSize(ctx)
	err := effect(r)
	if err == nil {
		t.Fatalf("the effect check passed with the agent on --mark=%s, which WireGuard does not carry: it would not catch a wrong mark (%v)", wrongMark, r)
	}
	if r.Frag.OKs == 0 {
		t.Fatalf("with --mark=%s WireGuard's packets should still fragment: %v", wrongMark, r)
	}
	t.Logf("with --mark=%s the effect check fails, as it must: %v", wrongMark, err)
}

// TestKernelWireGuardLinkFlap takes the worker's underlay link down and up
// under traffic through the tunnel. The kernel flushes the link's IPv4
// routes, table 900's included, without a notification; a DHCP client
// puts the main route back; the agent must put the split back within a
// second, after which full-size traffic fragments no more.
func TestKernelWireGuardLinkFlap(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	w.startAgent(ciliumsMark)
	if err := effect(w.fullSize(ctx)); err != nil {
		t.Fatalf("before the flap: %v", err)
	}

	// Traffic through the tunnel all along, in rounds of 20 datagrams.
	tctx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var sent, answered, fragOKs atomic.Uint64
	wg.Go(func() {
		for tctx.Err() == nil {
			r, err := tunnel.FullSize(tctx, w.worker, w.peer, echoDst, fullSize, 20)
			if err != nil {
				return
			}
			sent.Add(uint64(r.Sent))
			answered.Add(uint64(r.Answered))
			fragOKs.Add(r.Frag.OKs)
		}
	})
	defer func() { stopTraffic(); wg.Wait() }()
	if !poll(scaled(5*time.Second), func() bool { return answered.Load() >= 20 }) {
		t.Fatalf("traffic through the tunnel did not start: %d sent, %d answered", sent.Load(), answered.Load())
	}
	sentBefore := sent.Load()

	w.ip(w.worker, "link set enp7s0 down")
	if !poll(scaled(time.Second), func() bool { return !w.unmarkedSplit() }) {
		t.Fatalf("link down should have flushed table 900's route:\n%s", w.ipOut(w.worker, "route show table 900"))
	}
	w.ip(w.worker, "link set enp7s0 up")
	// What the DHCP client does on carrier: its routes again, at the
	// link's MTU (the old loop that lowered it is gone).
	w.ip(w.worker, "route replace 10.0.0.1 dev enp7s0 proto dhcp scope link src 10.0.0.5")
	w.ip(w.worker, "route replace 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5")
	start := time.Now()
	if !poll(scaled(5*time.Second), func() bool { return w.unmarkedSplit() && w.ruleThere() && w.markedMain() }) {
		t.Fatalf("the split was not put back after the flap in %v:\n%s%s", scaled(5*time.Second), w.ipOut(w.worker, "rule"), w.ipOut(w.worker, "route show table all"))
	}
	repair := time.Since(start)
	stopTraffic()
	wg.Wait()

	after := w.fullSize(ctx)
	t.Logf("flap: the split was back %v after the main route", repair.Round(100*time.Microsecond))
	t.Logf("traffic during the test: %d sent, %d answered, FragOKs +%d", sent.Load(), answered.Load(), fragOKs.Load())
	t.Logf("after the flap: %v", after)
	if repair > repairSLO {
		t.Errorf("the split took %v to come back after the flap, more than %v", repair, repairSLO)
	}
	if sent.Load() == sentBefore {
		t.Errorf("no traffic was sent through the tunnel during the flap")
	}
	if err := effect(after); err != nil {
		t.Errorf("after the flap: %v", err)
	}
}

// TestKernelWireGuardHostTraffic sends host traffic to the peer's node
// address through the tunnel, as Cilium's redirect on the underlay's
// egress does (emulated with tc mirred): with the agent the connection
// takes table 900's MTU (MSS 1355 − 40 − options), all of it goes through
// cilium_wg0, and its encrypted packets leave the worker whole.
func TestKernelWireGuardHostTraffic(t *testing.T) {
	w := newWorld(t)
	w.redirect()
	ctx := t.Context()

	measure := func(limit time.Duration) (tunnel.BulkResult, tunnel.Frag, uint64) {
		t.Helper()
		fr0, err := tunnel.ReadFrag(w.worker)
		if err != nil {
			t.Fatal(err)
		}
		tx0 := w.tunnelTxBytes()
		r, err := tunnel.Bulk(ctx, w.worker, w.peer, nodeDst, bulkBytes, limit)
		if err != nil {
			t.Fatal(err)
		}
		fr1, err := tunnel.ReadFrag(w.worker)
		if err != nil {
			t.Fatal(err)
		}
		return r, fr1.Sub(fr0), w.tunnelTxBytes() - tx0
	}

	before, fragBefore, txBefore := measure(bulkLimit)
	w.startAgent(ciliumsMark)
	after, fragAfter, txAfter := measure(bulkAgent)
	t.Logf("host TCP to 10.0.0.9 without the agent: %v; MSS %d; %d bytes into cilium_wg0; %v", before, before.MSS, txBefore, fragBefore)
	t.Logf("host TCP to 10.0.0.9 with the agent:    %v; MSS %d; %d bytes into cilium_wg0; %v", after, after.MSS, txAfter, fragAfter)

	if fragBefore.OKs == 0 {
		t.Errorf("without the agent, host traffic through the tunnel should leave in fragments: %v", fragBefore)
	}
	if !after.Complete() {
		t.Errorf("with the agent, host TCP to the peer should complete: %v", after)
	}
	// 1355 less the IP and TCP headers (40) and the options the stack
	// keeps room for (timestamps: 12; at most 40): built at the tunnel MTU.
	if mss := after.MSS; mss+40 > 1355 || mss+40+40 < 1355 {
		t.Errorf("with the agent, host TCP to the peer has MSS %d, want 1355 − 40 less its options (table 900's MTU)", mss)
	}
	if txAfter < uint64(after.Received) {
		t.Errorf("with the agent, %d bytes went into cilium_wg0 for %d bytes sent: the host traffic did not go through the tunnel", txAfter, after.Received)
	}
	if fragAfter.OKs != 0 || fragAfter.Creates != 0 {
		t.Errorf("with the agent, the tunnel's packets should leave whole: %v", fragAfter)
	}
}
