//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/nltest"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"golang.org/x/sys/unix"
)

// fakeDialer dials nltest's fake kernel.
type fakeDialer struct{ k *nltest.Kernel }

func (d fakeDialer) Dial(cfg netwatch.DialConfig) (netwatch.Conn, error) {
	return d.k.DialConn(cfg.Groups, cfg.ReadBuffer)
}

// seedKernel is the seed topology on the fake kernel: enp7s0 (MTU 1450,
// 10.0.0.5/16, the gateway 10.0.0.1 on link), the old approach's
// 10.0.0.0/16 via 10.0.0.1 lowered to 1355, cilium_wg0 at 1355.
func seedKernel(t *testing.T) (*nltest.Kernel, uint32, uint32) {
	t.Helper()
	k := nltest.New()
	t.Cleanup(func() { k.Close() })
	enp := k.AddLink("enp7s0", "veth", 1450, true)
	must(t, k.AddAddr(enp, netip.MustParsePrefix("10.0.0.5/16")))
	must(t, k.AddRoute(nltest.Route{Dst: netip.MustParsePrefix("10.0.0.1/32"), Index: enp, Protocol: unix.RTPROT_DHCP,
		Scope: unix.RT_SCOPE_LINK, PrefSrc: netip.MustParseAddr("10.0.0.5")}))
	must(t, k.AddRoute(nltest.Route{Dst: netip.MustParsePrefix("10.0.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"),
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
	"table 900: 10.0.0.1/32 dev enp7s0 scope link src 10.0.0.5 mtu 1355",
	"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
	"rule 900: not fwmark 0xe00/0xf00 lookup 900",
	"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)",
}

var splitRule = nltest.Rule{Family: unix.AF_INET, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 109}

// harness runs a reconciler on a fake kernel and records what it says.
type harness struct {
	t      *testing.T
	k      *nltest.Kernel
	r      *reconciler
	w      *netwatch.Watcher
	met    *metrics
	modes  chan mtupolicy.Mode
	passes chan passResult

	mu    sync.Mutex
	lines []string
	logs  bytes.Buffer
}

func newHarness(t *testing.T, k *nltest.Kernel) *harness {
	t.Helper()
	cfg := mtupolicy.DefaultConfig()
	cfg.Prefixes = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}
	h := &harness{t: t, k: k, modes: make(chan mtupolicy.Mode, 1), passes: make(chan passResult, 1000)}
	log := slog.New(slog.NewTextHandler(lockedWriter{&h.mu, &h.logs}, nil))
	h.w = netwatch.New(netwatch.Options{Dialer: fakeDialer{k}, RouteTables: []netwatch.Table{netwatch.TableMain, cfg.Table}, Logger: log})
	ap, err := netwatch.DialApplier(fakeDialer{k})
	must(t, err)
	t.Cleanup(func() { ap.Close() })
	h.met = newMetrics(h.w, nil, snmpPath)
	h.r = newReconciler(h.w, ap, policyDesire(cfg), log, func(line string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.lines = append(h.lines, line)
	}, h.met)
	h.r.onPass = func(res passResult) { h.passes <- res }
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
	wg.Go(func() { h.r.run(ctx, h.modes) })
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
func (h *harness) waitPass(what string, ok func(passResult) bool) passResult {
	h.t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case res := <-h.passes:
			if ok(res) {
				return res
			}
		case <-deadline.C:
			h.t.Fatalf("no pass %s within 5s; lines %q; log:\n%s", what, h.takeLines(), h.log())
		}
	}
}

func converged(res passResult) bool {
	return res.planned && res.err == nil && res.ops == 0
}

// waitConverged waits for a pass that finds nothing to do.
func (h *harness) waitConverged() { h.t.Helper(); h.waitPass("that finds nothing to do", converged) }

// split reports whether the fake kernel holds the split of the seed.
func (h *harness) split() error {
	var table []string
	for _, r := range h.k.Routes() {
		if r.Table == 900 {
			table = append(table, r.String())
		}
	}
	want := []string{
		"10.0.0.0/16 via 10.0.0.1 dev#2 table 900 src 10.0.0.5 mtu 1355",
		"10.0.0.1/32 dev#2 table 900 src 10.0.0.5 mtu 1355",
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
	for _, r := range h.k.Rules() {
		if r.Family == unix.AF_INET && r.Priority == 900 {
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
	h.modes <- mtupolicy.ModeOn
	res := h.waitPass("that changes something", func(r passResult) bool { return r.applied > 0 })
	if res.applied != 4 || res.err != nil {
		t.Fatalf("first pass: %+v, want 4 changes", res)
	}
	if diff := cmp.Diff(seedLines, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	must(t, h.split())
	h.waitConverged()
	if !h.r.converged.Load() {
		t.Error("not converged after a pass with nothing to do")
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
	res := h.waitPass("after the sync", func(passResult) bool { return true })
	if res.planned {
		t.Fatalf("pass with mode unknown planned: %+v", res)
	}
	k.AddLink("eth9", "veth", 1500, true)
	h.waitPass("after a change", func(passResult) bool { return true })
	for _, req := range k.Requests() {
		switch req.Type {
		case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWRULE, unix.RTM_DELRULE:
			t.Errorf("request %d sent with the mode unknown", req.Type)
		}
	}
	if h.r.converged.Load() {
		t.Error("ready with the mode unknown")
	}
}

// A rule deleted by someone else is restored; the mode turning off
// empties the table and says so.
func TestLoopRestoresAndTurnsOff(t *testing.T) {
	k, _, wg := seedKernel(t)
	h := newHarness(t, k)
	h.start()
	h.modes <- mtupolicy.ModeOn
	h.waitConverged()
	h.takeLines()

	must(t, k.DelRule(splitRule))
	h.waitPass("that restores the rule", func(r passResult) bool { return r.applied == 1 })
	if diff := cmp.Diff([]string{"rule 900: not fwmark 0xe00/0xf00 lookup 900"}, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	must(t, h.split())

	// The tunnel MTU changes: the table follows.
	must(t, k.SetLinkMTU(wg, 1420))
	h.waitPass("that follows the MTU", func(r passResult) bool { return r.applied == 2 })
	want := []string{
		"table 900: 10.0.0.1/32 dev enp7s0 scope link src 10.0.0.5 mtu 1420 (was 1355)",
		"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420 (was 1355)",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}

	h.modes <- mtupolicy.ModeOff
	h.waitPass("that removes the split", func(r passResult) bool { return r.applied == 3 })
	want = []string{
		"node encryption: no",
		"rule 900: removed not fwmark 0xe00/0xf00 lookup 900",
		"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420",
		"table 900: removed 10.0.0.1/32 dev enp7s0 scope link src 10.0.0.5 mtu 1420",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	if n := h.rules900(); n != 0 {
		t.Errorf("%d rules at 900 after off", n)
	}
	for _, r := range k.Routes() {
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
	h.modes <- mtupolicy.ModeOn
	res := h.waitPass("that fails", func(r passResult) bool { return r.err != nil })
	if res.wake.IsZero() {
		t.Errorf("a failed pass asks for no retry: %+v", res)
	}
	h.waitConverged()
	must(t, h.split())
	if got := metricValue(t, h.met, "marksplit_failed_operations_total", "rule-add"); got != 1 {
		t.Errorf("failed rule-adds = %v, want 1", got)
	}
	if !strings.Contains(h.log(), `msg="cannot apply rule 900: not fwmark 0xe00/0xf00 lookup 900"`) {
		t.Errorf("the failure is not logged:\n%s", h.log())
	}
}

// A rule deleted again and again is restored at once Free times, then
// with back-off, with one warning naming it and a metric.
func TestLoopFightDamping(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	cfg := testDampConfig()
	cfg.BackOff = func() backoff.BackOff { return backoff.NewConstantBackOff(300 * time.Millisecond) }
	h.r.damp = newDamper(cfg)
	h.start()
	h.modes <- mtupolicy.ModeOn
	h.waitConverged()

	// The pass that split the seed added the rule: each deletion is an
	// undo of it, and the first Free are repaired at once.
	for range cfg.Free {
		must(t, k.DelRule(splitRule))
		h.waitPass("that restores the rule", func(r passResult) bool { return r.applied == 1 })
		h.waitConverged()
	}
	if strings.Contains(h.log(), "fight") {
		t.Fatalf("a warning before the fight:\n%s", h.log())
	}
	start := time.Now()
	must(t, k.DelRule(splitRule))
	h.waitPass("that damps", func(r passResult) bool { return r.damped == 1 })
	h.waitPass("that restores the rule", func(r passResult) bool { return r.applied == 1 })
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("the damped repair came after %v, want the 300ms back-off", d)
	}
	h.waitConverged()
	warn := fmt.Sprintf(`level=WARN msg="fight: another program keeps undoing \"rule 900: not fwmark 0xe00/0xf00 lookup 900\": undone %d times in `, cfg.Free+1)
	if got := h.log(); strings.Count(got, "fight:") != 1 || !strings.Contains(got, warn) {
		t.Errorf("want one warning %q…, log:\n%s", warn, got)
	}
	if got := metricValue(t, h.met, "marksplit_fights_damped_total", "rule"); got != 1 {
		t.Errorf("fights damped = %v, want 1", got)
	}
	// Every restore logged its line; no duplicates of our own changes.
	lines := h.takeLines()
	if n := slices.Index(lines, "rule 900: not fwmark 0xe00/0xf00 lookup 900"); n < 0 ||
		len(lines)-n != cfg.Free+3 {
		t.Errorf("lines: %q, want the rule line %d times after the seed", lines, cfg.Free+3)
	}
}

// once applies one pass and returns when the cache shows it; a second
// once changes and prints nothing.
func TestOnceOnFakeKernel(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { h.w.Run(ctx) })
	h.modes <- mtupolicy.ModeOn
	must(t, h.r.waitReady(ctx, h.modes, true, 5*time.Second))
	must(t, h.r.once(ctx, 5*time.Second))
	if diff := cmp.Diff(seedLines, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	must(t, h.split())
	must(t, h.r.once(ctx, 5*time.Second))
	if got := h.takeLines(); len(got) != 0 {
		t.Errorf("second once said %q", got)
	}
}

// metricValue returns the value of the counter or gauge name whose one
// label has the value label ("" for none).
func metricValue(t *testing.T, m *metrics, name, label string) float64 {
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
					return c.GetValue()
				}
				return x.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s{%q}", name, label)
	return 0
}

// The periodic safety resync asks the watcher for full dumps; a resync
// that finds nothing new changes and says nothing.
func TestLoopPeriodicResync(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarness(t, k)
	h.r.resyncEvery = 20 * time.Millisecond
	h.start()
	h.modes <- mtupolicy.ModeOn
	h.waitConverged()
	h.takeLines()
	deadline := time.Now().Add(5 * time.Second)
	for h.w.Stats().Resyncs[netwatch.ResyncRequested] < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("resyncs: %v, want 3 requested", h.w.Stats().Resyncs)
		}
		h.waitPass("after a resync", func(passResult) bool { return true })
	}
	if got := h.takeLines(); len(got) != 0 {
		t.Errorf("resyncs said %q", got)
	}
}

// IPv6 routes are split with their metric, and the IPv6 rule is named so.
func TestLoopIPv6(t *testing.T) {
	k, enp, _ := seedKernel(t)
	must(t, k.AddAddr(enp, netip.MustParsePrefix("fd00::5/64")))
	must(t, k.AddRoute(nltest.Route{Dst: netip.MustParsePrefix("fd00:1::/48"), Gateway: netip.MustParseAddr("fd00::1"),
		Index: enp, Protocol: unix.RTPROT_STATIC}))
	h := newHarness(t, k)
	h.r.desire = policyDesire(mtupolicy.Config{TunnelLink: "cilium_wg0", Mark: 0xe00, Mask: 0xf00, Table: 900,
		Priority: 900, Protocol: 109, Repair: true,
		Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("fd00::/16")}})
	h.start()
	h.modes <- mtupolicy.ModeOn
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
