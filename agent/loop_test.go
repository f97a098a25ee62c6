//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	"golang.org/x/sys/unix"
)

// seedKernel is the seed topology on the fake kernel: enp7s0 (MTU 1450,
// 10.0.0.5/16, the gateway 10.0.0.1 on link), the old approach's
// 10.0.0.0/16 via 10.0.0.1 lowered to 1355, cilium_wg0 at 1355.
func seedKernel(t *testing.T) (*netwatchtest.Kernel, uint32, uint32) {
	t.Helper()
	k := netwatchtest.New()
	t.Cleanup(func() { k.Close() })
	enp := k.AddLink("enp7s0", "veth", 1450, true)
	must(t, k.AddAddr(enp, netip.MustParsePrefix("10.0.0.5/16")))
	must(t, k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("10.0.0.1/32"), Index: enp, Protocol: unix.RTPROT_DHCP,
		Scope: unix.RT_SCOPE_LINK, PrefSrc: netip.MustParseAddr("10.0.0.5")}))
	must(t, k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("10.0.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"),
		Index: enp, Protocol: unix.RTPROT_DHCP, PrefSrc: netip.MustParseAddr("10.0.0.5"), MTU: 1355}))
	wg := k.AddLink("cilium_wg0", "tun", 1355, true)
	return k, enp, wg
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// seedLines are the changes that split the seed topology.
var seedLines = []string{
	"table 900: 10.0.0.1 dev enp7s0 scope link src 10.0.0.5 mtu 1355",
	"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
	"rule 900: not fwmark 0xe00/0xf00 lookup 900",
	"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)",
}

var splitRule = netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 109}

// harness runs the agent's loop on a fake kernel and records what it says.
type harness struct {
	t      *testing.T
	k      *netwatchtest.Kernel
	l      *loop
	w      *netwatch.Watcher
	met    *metrics
	passes chan reconcile.Pass

	mu    sync.Mutex
	lines []string
	logs  bytes.Buffer
}

func newHarness(t *testing.T, k *netwatchtest.Kernel) *harness {
	return newHarnessCfg(t, k, seedConfig())
}

func seedConfig() mtupolicy.Config {
	cfg := mtupolicy.DefaultConfig()
	cfg.Prefixes = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}
	return cfg
}

func newHarnessCfg(t *testing.T, k *netwatchtest.Kernel, cfg mtupolicy.Config) *harness {
	t.Helper()
	h := &harness{t: t, k: k, passes: make(chan reconcile.Pass, 1000)}
	log := slog.New(slog.NewTextHandler(lockedWriter{&h.mu, &h.logs}, nil))
	h.w = netwatch.New(netwatch.Options{NetNS: k.NetNS(), RouteTables: []netwatch.Table{netwatch.TableMain, cfg.Table}, Logger: log})
	ap, err := netwatch.DialApplier(k.NetNS())
	must(t, err)
	t.Cleanup(func() { ap.Close() })
	h.met = newMetrics(h.w, cfg, nil, snmpPath)
	h.l = newLoop(h.w, ap, cfg, log, func(line string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.lines = append(h.lines, line)
	}, h.met)
	h.l.onPass = func(p reconcile.Pass) { h.passes <- p }
	return h
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// start runs the watcher and the loop until the test ends.
func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { h.w.Run(ctx) })
	wg.Go(func() { h.l.r.Run(ctx) })
	h.t.Cleanup(func() { cancel(); wg.Wait() })
}

// takeLines returns the lines emitted so far and forgets them.
func (h *harness) takeLines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.lines
	h.lines = nil
	return l
}

func (h *harness) log() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.logs.String()
}

// waitPass waits for a pass that satisfies ok.
func (h *harness) waitPass(what string, ok func(reconcile.Pass) bool) reconcile.Pass {
	h.t.Helper()
	deadline := time.NewTimer(hang) // only a hang reaches it
	defer deadline.Stop()
	for {
		select {
		case p := <-h.passes:
			if ok(p) {
				return p
			}
		case <-deadline.C:
			h.t.Fatalf("no pass %s within %v; lines %q; log:\n%s", what, hang, h.takeLines(), h.log())
		}
	}
}

func converged(p reconcile.Pass) bool {
	return p.Planned && p.Err == nil && len(p.Applied)+len(p.Already)+p.Deferred == 0
}

func applied(n int) func(reconcile.Pass) bool {
	return func(p reconcile.Pass) bool { return len(p.Applied) == n }
}

// waitConverged waits for a pass that finds nothing to do.
func (h *harness) waitConverged() { h.t.Helper(); h.waitPass("that finds nothing to do", converged) }

// split reports whether the fake kernel holds the split of the seed.
func (h *harness) split() error {
	var table []string
	for _, r := range h.k.Snapshot().Routes {
		if r.Table == 900 {
			table = append(table, r.String())
		}
	}
	want := []string{
		"10.0.0.0/16 via 10.0.0.1 dev if2 table 900 proto 109 src 10.0.0.5 mtu 1355",
		"10.0.0.1 dev if2 table 900 proto 109 scope link src 10.0.0.5 mtu 1355",
	}
	if diff := cmp.Diff(want, table); diff != "" {
		return fmt.Errorf("table 900 (-want +got):\n%s", diff)
	}
	if n := h.rules900(); n != 1 {
		return fmt.Errorf("%d rules at 900, want 1", n)
	}
	return nil
}

func (h *harness) rules900() int {
	n := 0
	for _, r := range h.k.Snapshot().Rules {
		if r.Family == netwatch.IPv4 && r.Priority == 900 {
			n++
		}
	}
	return n
}

// The seed converges in one pass with the four lines; then a pass after an
// unrelated change logs nothing and changes nothing.
func TestLoopSeedConvergesQuietly(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	res := h.waitPass("that changes something", func(p reconcile.Pass) bool { return len(p.Applied) > 0 })
	if len(res.Applied) != 4 || res.Err != nil {
		t.Fatalf("first pass: %+v, want 4 changes", res)
	}
	if diff := cmp.Diff(seedLines, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	must(t, h.split())
	h.waitConverged()
	if !h.l.r.Converged() {
		t.Error("not converged after a pass with nothing to do")
	}
	if got := metricValue(t, h.met, "marksplit_ready", ""); got != 1 {
		t.Errorf("marksplit_ready = %v, want 1", got)
	}
	if got := metricValue(t, h.met, "marksplit_split_active", ""); got != 1 {
		t.Errorf("marksplit_split_active = %v, want 1", got)
	}

	k.AddLink("eth9", "veth", 1500, true)
	h.waitConverged()
	if got := h.takeLines(); len(got) != 0 {
		t.Errorf("a pass that changes nothing said %q", got)
	}
	if got := metricValue(t, h.met, "marksplit_changes_total", "rule-add"); got != 1 {
		t.Errorf("rule-add changes = %v, want 1", got)
	}
	if got := metricValue(t, h.met, "marksplit_changes_total", "route-repair"); got != 1 {
		t.Errorf("route-repair changes = %v, want 1", got)
	}
}

// Before the mode is known nothing is sent to the kernel but dumps.
func TestLoopUnknownModeEditsNothing(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	h.start()
	res := h.waitPass("after the sync", func(p reconcile.Pass) bool { return h.w.Stats().Synced })
	if res.Planned {
		t.Fatalf("pass with mode unknown planned: %+v", res)
	}
	k.AddLink("eth9", "veth", 1500, true)
	h.waitPass("after a change", func(reconcile.Pass) bool { return true })
	for _, req := range k.Requests() {
		switch req.Type {
		case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWRULE, unix.RTM_DELRULE:
			t.Errorf("request %d sent with the mode unknown", req.Type)
		}
	}
	if h.l.r.Converged() {
		t.Error("ready with the mode unknown")
	}
}

// A rule deleted by someone else is restored; the mode turning off
// empties the table and says so.
func TestLoopRestoresAndTurnsOff(t *testing.T) {
	k, _, wg := seedKernel(t)
	h := newHarness(t, k)
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.waitConverged()
	h.takeLines()

	must(t, k.DelRule(splitRule))
	h.waitPass("that restores the rule", applied(1))
	if diff := cmp.Diff([]string{"rule 900: not fwmark 0xe00/0xf00 lookup 900"}, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	must(t, h.split())

	// The tunnel MTU changes: the table follows.
	must(t, k.SetLinkMTU(wg, 1420))
	h.waitPass("that follows the MTU", applied(2))
	want := []string{
		"table 900: 10.0.0.1 dev enp7s0 scope link src 10.0.0.5 mtu 1420 (was 1355)",
		"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420 (was 1355)",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}

	h.l.setMode(mtupolicy.ModeOff)
	h.waitPass("that removes the split", applied(3))
	want = []string{
		"node encryption: no",
		"rule 900: removed not fwmark 0xe00/0xf00 lookup 900 proto 109",
		"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto 109 src 10.0.0.5 mtu 1420",
		"table 900: removed 10.0.0.1 dev enp7s0 proto 109 scope link src 10.0.0.5 mtu 1420",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	if n := h.rules900(); n != 0 {
		t.Errorf("%d rules at 900 after off", n)
	}
	for _, r := range k.Snapshot().Routes {
		if r.Table == 900 {
			t.Errorf("route left in table 900: %v", r)
		}
	}
}

// A failing operation is logged and counted, and retried with back-off
// until it works.
func TestLoopRetriesFailures(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	k.FailNext(unix.RTM_NEWRULE, unix.EPERM, 1)
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.waitPass("that fails", func(p reconcile.Pass) bool { return p.Err != nil })
	h.waitConverged()
	must(t, h.split())
	if got := metricValue(t, h.met, "marksplit_failed_operations_total", "rule-add"); got != 1 {
		t.Errorf("failed rule-adds = %v, want 1", got)
	}
	if !strings.Contains(h.log(), `msg="reconcile: pass failed; retrying" change="rule 900: not fwmark 0xe00/0xf00 lookup 900" op=rule-add err="operation not permitted (kernel: netwatchtest: injected fault)"`) {
		t.Errorf("the failure is not logged:\n%s", h.log())
	}
}

// A program that deletes the rule as fast as it can: the rule is repaired
// at a bounded rate, one warning names the program, the fight metrics say
// so while it lasts, and the rule is back once the program stops.
func TestLoopFight(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.waitConverged()
	prog, err := k.DialProgram()
	must(t, err)
	defer prog.Close()
	del := netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Mark: 0xe00, Mask: 0xf00}
	start := time.Now()
	for time.Since(start) < time.Second {
		if err := prog.DelRule(del); err != nil && !errors.Is(err, unix.ENOENT) {
			t.Fatal(err)
		}
		if v, ok := metricIf(t, h.met, "marksplit_fight_in_progress", ""); ok && v == 1 {
			break
		}
	}
	if got := metricValue(t, h.met, "marksplit_fight_in_progress", ""); got != 1 {
		t.Fatalf("marksplit_fight_in_progress = %v after a second of deletions, want 1; log:\n%s", got, h.log())
	}
	// The program stops: the rule is back and the fight ends.
	if !netwatchtest.Poll(func() bool {
		return h.rules900() == 1 && metricValue(t, h.met, "marksplit_fight_in_progress", "") == 0
	}) {
		t.Fatalf("after the fight: %d rules at 900, fight in progress %v", h.rules900(), metricValue(t, h.met, "marksplit_fight_in_progress", ""))
	}
	if got := metricValue(t, h.met, "marksplit_fights_total", ""); got != 1 {
		t.Errorf("marksplit_fights_total = %v, want 1", got)
	}
	warn := `level=WARN msg="fight: rule 900: not fwmark 0xe00/0xf00 lookup 900 undone 3 times in `
	if got := h.log(); strings.Count(got, "fight:") != 1 || !strings.Contains(got, warn) || !strings.Contains(got, "by netlink port ") {
		t.Errorf("want one warning %q… by netlink port N, log:\n%s", warn, got)
	}
}

// The underlay bouncing, its DHCP client adding its route back each time,
// is the kernel's flush and a creation, never a fight: the split is back
// after every bounce.
func TestLoopFlapsAreNoFight(t *testing.T) {
	k, enp, _ := seedKernel(t)
	h := newHarness(t, k)
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.waitConverged()
	dhcp, err := k.DialProgram()
	must(t, err)
	defer dhcp.Close()
	for i := range 10 {
		must(t, k.SetLinkUp(enp, false))
		must(t, k.SetLinkUp(enp, true))
		// The DHCP client puts its routes back, lowered as before.
		for _, r := range []netwatch.Route{
			{Dst: netip.MustParsePrefix("10.0.0.1/32"), Index: enp, Protocol: unix.RTPROT_DHCP, Scope: unix.RT_SCOPE_LINK, PrefSrc: netip.MustParseAddr("10.0.0.5")},
			{Dst: netip.MustParsePrefix("10.0.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"), Index: enp, Protocol: unix.RTPROT_DHCP, PrefSrc: netip.MustParseAddr("10.0.0.5"), MTU: 1355},
		} {
			must(t, dhcp.AddRoute(r))
		}
		if !netwatchtest.Poll(func() bool { return h.split() == nil }) {
			t.Fatalf("bounce %d: not split again: %v", i, h.split())
		}
	}
	if got := h.log(); strings.Contains(got, "fight") {
		t.Errorf("the bounces were taken for a fight:\n%s", got)
	}
}

// once applies what the policy wants and returns when the cache shows it;
// a second once changes and prints nothing.
func TestOnceOnFakeKernel(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { h.w.Run(ctx) })
	h.l.setMode(mtupolicy.ModeOn)
	must(t, h.w.WaitSynced(ctx))
	must(t, h.l.r.Once(ctx))
	if diff := cmp.Diff(seedLines, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	must(t, h.split())
	must(t, h.l.r.Once(ctx))
	if got := h.takeLines(); len(got) != 0 {
		t.Errorf("second once said %q", got)
	}
}

// metricValue returns the value of the counter or gauge name whose one
// label has the value label ("" for none).
func metricValue(t *testing.T, m *metrics, name, label string) float64 {
	t.Helper()
	v, ok := metricIf(t, m, name, label)
	if !ok {
		t.Fatalf("no metric %s{%q}", name, label)
	}
	return v
}

// metricIf is metricValue for a metric that may not exist yet.
func metricIf(t *testing.T, m *metrics, name, label string) (float64, bool) {
	t.Helper()
	mfs, err := m.reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, x := range mf.GetMetric() {
			if ls := x.GetLabel(); label == "" && len(ls) == 0 || len(ls) == 1 && ls[0].GetValue() == label {
				if c := x.GetCounter(); c != nil {
					return c.GetValue(), true
				}
				return x.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// The periodic safety resync asks the watcher for full dumps; a resync
// that finds nothing new changes and says nothing.
func TestLoopPeriodicResync(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	h.l.r.Resync = 20 * time.Millisecond
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.waitConverged()
	h.takeLines()
	deadline := time.Now().Add(2 * time.Minute)
	for h.w.Stats().Resyncs["requested"] < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("resyncs: %v, want 3 requested", h.w.Stats().Resyncs)
		}
		h.waitPass("after a resync", func(reconcile.Pass) bool { return true })
	}
	if got := h.takeLines(); len(got) != 0 {
		t.Errorf("resyncs said %q", got)
	}
}

// IPv6 routes are split with their metric, and the IPv6 rule is named so.
func TestLoopIPv6(t *testing.T) {
	k, enp, _ := seedKernel(t)
	must(t, k.AddAddr(enp, netip.MustParsePrefix("fd00::5/64")))
	must(t, k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("fd00:1::/48"), Gateway: netip.MustParseAddr("fd00::1"),
		Index: enp, Protocol: unix.RTPROT_STATIC}))
	h := newHarnessCfg(t, k, mtupolicy.Config{TunnelLink: "cilium_wg0", Mark: 0xe00, Mask: 0xf00, Table: 900,
		Priority: 900, Protocol: 109, Repair: true,
		Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00::/16")}})
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.waitConverged()
	lines := h.takeLines()
	for _, want := range []string{
		"table 900: fd00:1::/48 via fd00::1 dev enp7s0 src fd00::5 metric 1024 mtu 1355",
		"rule 900 (inet6): not fwmark 0xe00/0xf00 lookup 900",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("no line %q in %q", want, lines)
		}
	}
}

// A tunnel below IPv6's minimum MTU: IPv4 is split, IPv6 is not, and the
// log says so once.
func TestLoopTunnelBelowIPv6Minimum(t *testing.T) {
	k, enp, wg := seedKernel(t)
	must(t, k.SetLinkMTU(wg, 1200))
	must(t, k.AddAddr(enp, netip.MustParsePrefix("fd00::5/64")))
	must(t, k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("fd00:1::/48"), Gateway: netip.MustParseAddr("fd00::1"),
		Index: enp, Protocol: unix.RTPROT_STATIC}))
	cfg := seedConfig()
	cfg.Prefixes = append(cfg.Prefixes, netip.MustParsePrefix("fd00::/16"))
	h := newHarnessCfg(t, k, cfg)
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	h.waitConverged()
	k.AddLink("eth9", "veth", 1500, true) // another pass
	h.waitConverged()
	for _, r := range k.Snapshot().Routes {
		if r.Table == 900 && r.Family == netwatch.IPv6 {
			t.Errorf("IPv6 route in table 900 at a tunnel MTU of 1200: %v", r)
		}
	}
	if !slices.Contains(h.takeLines(), "table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1200") {
		t.Error("IPv4 not split")
	}
	note := "inet6: tunnel link cilium_wg0's MTU 1200 is below the family's minimum 1280: inet6 is not split"
	if n := strings.Count(h.log(), note); n != 1 {
		t.Errorf("the note is logged %d times, want once:\n%s", n, h.log())
	}
}
