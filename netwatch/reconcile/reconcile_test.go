//go:build linux

package reconcile

import (
	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/netwatch"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"golang.org/x/sys/unix"
)

// Reconciler tests on netwatch/netwatchtest's fake kernel (fakeHost): a policy
// that keeps table 900 at the tunnel link's MTU, as the agent does.

// tunnelPolicy wants, in table 900, 10.0.0.0/16 and 10.1.0.0/16 via
// 10.0.0.1 dev eth0 at cilium_wg0's MTU, and the IPv4 rule at 900; the
// IPv6 route and rule that fakeHost has at 900 are to go.
func tunnelPolicy(eth uint32) func(netwatch.View) (Desired, bool) {
	return func(v netwatch.View) (Desired, bool) {
		wg, ok := v.LinkByName("cilium_wg0")
		if !ok {
			return Desired{}, false
		}
		d := Desired{Own: Own(900, 900), Routes: new(netwatch.RouteSet)}
		for _, dst := range []string{"10.0.0.0/16", "10.1.0.0/16"} {
			d.Routes.Add(netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: netip.MustParsePrefix(dst),
				Gateway: netip.MustParseAddr("10.0.0.1"), Index: eth, PrefSrc: netip.MustParseAddr("10.0.0.5"),
				MTU: wg.MTU, Protocol: 77, Scope: netwatch.ScopeUniverse, Type: netwatch.RouteUnicast})
		}
		d.Rules = append(d.Rules, netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable,
			Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77})
		return d, true
	}
}

// logRecorder is a slog.Handler that keeps each record as "LEVEL message".
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (h *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logRecorder) WithGroup(string) slog.Handler            { return h }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, r.Level.String()+" "+r.Message)
	r.Attrs(func(a slog.Attr) bool {
		if a.Value.Kind() == slog.KindDuration {
			// A JSON handler prints nanoseconds without a unit.
			h.lines = append(h.lines, "BUG: duration attribute "+a.Key)
		}
		return true
	})
	return nil
}

func (h *logRecorder) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.lines
	h.lines = nil
	return l
}

// passResult is what OnPass reports.
type passResult struct {
	applied []netwatch.Op
	err     error
}

// startReconciler starts r on a watcher of k and an applier, with a
// recording logger and OnPass reporting on the returned channel. Run must
// return nil once the test ends (a minute: only a hang).
func startReconciler(t *testing.T, k *netwatchtest.Kernel, r *Reconciler) (<-chan passResult, *logRecorder) {
	t.Helper()
	w := startWatcher(t, k, netwatch.Options{})
	a, err := netwatch.DialApplier(k.NetNS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	rec := new(logRecorder)
	passes := make(chan passResult, 16)
	r.Watcher, r.Applier, r.Logger = w, a, slog.New(rec)
	ctx, cancel := context.WithCancel(context.Background())
	r.OnPass = func(p Pass) {
		if len(p.Applied)+len(p.Already) == 0 && p.Err == nil {
			return // nothing to do
		}
		select {
		case passes <- passResult{p.Applied, p.Err}:
		case <-ctx.Done():
		}
	}
	if r.RetryMin == 0 {
		r.RetryMin, r.RetryMax = time.Millisecond, time.Millisecond
	}
	runUntilCleanup(t, ctx, cancel, r.Run)
	return passes, rec
}

// nextPass waits for the next pass that had something to do.
func nextPass(t *testing.T, passes <-chan passResult, what string) passResult {
	t.Helper()
	select {
	case p := <-passes:
		return p
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s: no pass within 2 min", what)
	}
	panic("unreachable")
}

// describeAll describes ops with the fake kernel's link names.
func describeAll(k *netwatchtest.Kernel, ops []netwatch.Op) []string {
	links := func(index uint32) (netwatch.Link, bool) {
		for _, l := range k.Snapshot().Links {
			if l.Index == index {
				return netwatch.Link{Index: index, Name: l.Name}, true
			}
		}
		return netwatch.Link{}, false
	}
	var s []string
	for _, op := range ops {
		s = append(s, op.Describe(links))
	}
	return s
}

// TestReconcilerConverges: the first pass makes the policy's changes, each
// applied and logged once; the next pass is the one the next change of the
// world calls for, so nothing was repeated while the cache caught up.
func TestReconcilerConverges(t *testing.T) {
	k, eth := fakeHost(t)
	wg := k.Snapshot().Links[len(k.Snapshot().Links)-1].Index // cilium_wg0, added last
	passes, rec := startReconciler(t, k, &Reconciler{Policy: tunnelPolicy(eth)})

	steps := []struct {
		name string
		do   func() error
		want []string // log lines, in order
	}{
		{"initial", func() error { return nil }, []string{
			"INFO table 900: 10.1.0.0/16 via 10.0.0.1 dev eth0 src 10.0.0.5 mtu 1355",
			"INFO rule 900 (inet6): removed not fwmark 0xe00/0xf00 lookup 900 proto 77",
			"INFO table 900: removed fd01::/64 via fd00::1 dev eth0 metric 1024 mtu 1355",
		}},
		{"the tunnel's MTU changes", func() error { return k.SetLinkMTU(wg, 1300) }, []string{
			"INFO table 900: 10.0.0.0/16 via 10.0.0.1 dev eth0 src 10.0.0.5 mtu 1300 (was 1355)",
			"INFO table 900: 10.1.0.0/16 via 10.0.0.1 dev eth0 src 10.0.0.5 mtu 1300 (was 1355)",
		}},
		{"someone deletes the rule", func() error {
			return k.DelRule(netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77})
		}, []string{
			"INFO rule 900: not fwmark 0xe00/0xf00 lookup 900",
		}},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		p := nextPass(t, passes, st.name)
		if p.err != nil {
			t.Fatalf("%s: pass failed: %v", st.name, p.err)
		}
		got := rec.take()
		if diff := gocmp.Diff(st.want, got); diff != "" {
			t.Errorf("%s: log (-want +got):\n%s", st.name, diff)
		}
		if diff := gocmp.Diff(st.want, prefixAll("INFO ", describeAll(k, p.applied))); diff != "" {
			t.Errorf("%s: applied (-want +got):\n%s", st.name, diff)
		}
	}
}

func prefixAll(p string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = p + s
	}
	return out
}

// TestReconcilerRetries: a pass the kernel refuses is retried, the
// operations it made are not made again, and the failure is logged once.
func TestReconcilerRetries(t *testing.T) {
	k, eth := fakeHost(t)
	k.FailNext(unix.RTM_NEWROUTE, unix.EPERM, 1)
	passes, rec := startReconciler(t, k, &Reconciler{Policy: tunnelPolicy(eth)})

	first := nextPass(t, passes, "refused pass")
	if !errors.Is(first.err, unix.EPERM) {
		t.Fatalf("first pass: err %v, want EPERM", first.err)
	}
	var ae *netwatch.ApplyError
	if !errors.As(first.err, &ae) || ae.Op.Kind != netwatch.RouteReplace || ae.Op.Route.Table != 900 {
		t.Errorf("first pass: err %#v, want an *ApplyError of the route replace", first.err)
	}
	second := nextPass(t, passes, "retry")
	if second.err != nil {
		t.Fatalf("retry: %v", second.err)
	}
	got := describeAll(k, append(first.applied, second.applied...))
	want := []string{
		"table 900: 10.1.0.0/16 via 10.0.0.1 dev eth0 src 10.0.0.5 mtu 1355",
		"rule 900 (inet6): removed not fwmark 0xe00/0xf00 lookup 900 proto 77",
		"table 900: removed fd01::/64 via fd00::1 dev eth0 metric 1024 mtu 1355",
	}
	slices.Sort(got)
	slices.Sort(want)
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("applied over both passes (-want +got):\n%s", diff)
	}
	warns := 0
	for _, l := range rec.take() {
		if l == "WARN reconcile: pass failed; retrying" {
			warns++
		}
	}
	if warns != 1 {
		t.Errorf("%d failure lines, want 1", warns)
	}
	if rt := slices.IndexFunc(k.Snapshot().Routes, func(r netwatch.Route) bool {
		return r.Table == 900 && r.Dst == netip.MustParsePrefix("10.1.0.0/16")
	}); rt < 0 {
		t.Errorf("10.1.0.0/16 is not in table 900 after the retry: %v", k.Snapshot().Routes)
	}
}

// TestReconcilerWaits: nothing is changed while the policy cannot tell,
// and Run still returns at cancellation.
func TestReconcilerWaits(t *testing.T) {
	k, eth := fakeHost(t)
	before := k.Snapshot().Rules
	asked := make(chan struct{}, 1)
	passes, _ := startReconciler(t, k, &Reconciler{Policy: func(v netwatch.View) (Desired, bool) {
		select {
		case asked <- struct{}{}:
		default:
		}
		return Desired{}, false
	}})
	select {
	case <-asked:
	case <-time.After(2 * time.Minute):
		t.Fatal("the policy was never asked")
	}
	if err := k.SetLinkUp(eth, false); err != nil { // a change: another pass
		t.Fatal(err)
	}
	<-asked
	select {
	case p := <-passes:
		t.Fatalf("a pass did something: %+v", p)
	default:
	}
	after := k.Snapshot().Rules
	if diff := gocmp.Diff(fmt.Sprint(before), fmt.Sprint(after)); diff != "" {
		t.Errorf("rules changed (-before +after):\n%s", diff)
	}
}

// TestReconcilerResync: Resync asks the watcher for re-dumps.
func TestReconcilerResync(t *testing.T) {
	k, eth := fakeHost(t)
	r := &Reconciler{Policy: tunnelPolicy(eth), Resync: 5 * time.Millisecond}
	startReconciler(t, k, r)
	// Count link dumps in the fake kernel rather than poll Stats: the
	// resyncs are what the test is about, not the watcher's account of them.
	linkDumps := func() int {
		n := 0
		for _, q := range k.Requests() {
			if q.Type == unix.RTM_GETLINK {
				n++
			}
		}
		return n
	}
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for linkDumps() < 3 { // the initial sync and two resyncs
		select {
		case <-deadline.C:
			t.Fatalf("%d link dumps in 2 min with Resync every 5 ms, want 3", linkDumps())
		case <-tick.C:
		}
	}
}

// TestReconcilerIncomplete: Run refuses to start without its parts.
func TestReconcilerIncomplete(t *testing.T) {
	for _, r := range []*Reconciler{
		{},
		{Watcher: netwatch.New(netwatch.Options{}), Policy: func(netwatch.View) (Desired, bool) { return Desired{}, false }},
	} {
		if err := r.Run(context.Background()); !errors.Is(err, errIncomplete) {
			t.Errorf("Run(%+v): %v, want errIncomplete", r, err)
		}
	}
}

// hotDeleter deletes rule as fast as it can from another program's socket
// until stop is closed, and counts its successful deletions.
func hotDeleter(t *testing.T, k *netwatchtest.Kernel, rule netwatch.Rule, stop <-chan struct{}) <-chan int {
	t.Helper()
	prog, err := k.DialProgram()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	n := make(chan int, 1)
	go func() {
		deleted := 0
		for {
			select {
			case <-stop:
				n <- deleted
				return
			default:
			}
			if prog.DelRule(rule) == nil {
				deleted++
			}
			time.Sleep(50 * time.Microsecond) // a program in a loop; not a wait for a condition
		}
	}()
	return n
}

// TestReconcilerFight: another program deletes the rule as fast as it can.
// The rule is repaired at most RepairBurst times at once and then once per
// RepairInterval, one warning names the program, OnFight hears of the
// fight and of its end, and once the program stops the rule is back.
func TestReconcilerFight(t *testing.T) {
	k, eth := fakeHost(t)
	var fmu sync.Mutex
	var fights []Fight
	r := &Reconciler{Policy: tunnelPolicy(eth), RepairInterval: 20 * time.Millisecond, OnFight: func(f Fight) {
		fmu.Lock()
		defer fmu.Unlock()
		fights = append(fights, f)
	}}
	passes, rec := startReconciler(t, k, r)
	nextPass(t, passes, "initial")
	rule := netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Action: netwatch.ActionToTable, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77}

	stop := make(chan struct{})
	start := time.Now()
	deleted := hotDeleter(t, k, netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Mark: 0xe00, Mask: 0xf00}, stop)
	// Let it fight for 40 repair intervals.
	deadline := time.After(2 * time.Minute)
	repairs := 0
	for time.Since(start) < 40*r.RepairInterval {
		select {
		case p := <-passes:
			repairs += len(p.applied)
		case <-deadline:
			t.Fatal("the fight did not end in 2 min")
		}
	}
	close(stop)
	elapsed := time.Since(start)
	n := <-deleted
	if n < 5 {
		t.Fatalf("the program deleted the rule only %d times: no fight to test", n)
	}
	// At most the burst, then one per interval (twice that, for the
	// scheduler's slack); and the fight must not have starved it either.
	if limit := defaultRepairBurst + 2*int(elapsed/r.RepairInterval); repairs > limit {
		t.Errorf("%d repairs in %v, more than %d: the rate limit did not hold", repairs, elapsed, limit)
	}
	waitRule(t, k, rule, "after the program stopped")
	waitFights(t, &fmu, &fights, 2)
	fmu.Lock()
	got := fights
	fmu.Unlock()
	if got[0].Over || !got[1].Over || got[0].Object != "rule 900" || got[0].By.Kind != netwatch.OriginProgram || got[0].Undos < fightUndos {
		t.Errorf("fights: %+v; want a start and an end, on rule 900, by the program", got)
	}
	warns := 0
	for _, l := range rec.take() {
		if strings.HasPrefix(l, "WARN fight: rule 900: not fwmark 0xe00/0xf00 lookup 900 undone ") {
			warns++
			if !strings.Contains(l, " by netlink port ") || !strings.HasSuffix(l, "; repairing at most every 20ms") {
				t.Errorf("warning %q: want the program's port and the interval", l)
			}
		}
	}
	if warns != 1 {
		t.Errorf("%d fight warnings, want 1", warns)
	}
}

// TestReconcilerKernelFlushIsNoFight: the kernel flushing the table's
// IPv4 routes with their link, again and again, is repaired every time and
// is no fight.
func TestReconcilerKernelFlushIsNoFight(t *testing.T) {
	k, eth := fakeHost(t)
	var fights atomic.Int32
	r := &Reconciler{Policy: tunnelPolicy(eth), OnFight: func(Fight) { fights.Add(1) }}
	_, rec := startReconciler(t, k, r)
	route := netwatch.Route{Table: 900, Dst: netip.MustParsePrefix("10.1.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"),
		Index: eth, PrefSrc: netip.MustParseAddr("10.0.0.5"), MTU: 1355, Protocol: 77}
	for i := range 10 {
		waitRoute(t, k, route, fmt.Sprintf("flap %d", i))
		for _, up := range []bool{false, true} {
			if err := k.SetLinkUp(eth, up); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitRoute(t, k, route, "after the flaps")
	for _, l := range rec.take() {
		if strings.Contains(l, "fight") {
			t.Errorf("logged %q for the kernel's own flushes", l)
		}
	}
	if n := fights.Load(); n != 0 {
		t.Errorf("%d fights reported for the kernel's own flushes", n)
	}
}

func waitRule(t *testing.T, k *netwatchtest.Kernel, r netwatch.Rule, what string) {
	t.Helper()
	if !netwatchtest.Poll(func() bool {
		for _, kr := range k.Snapshot().Rules {
			if kr.Family == netwatch.IPv4 && kr.Priority == r.Priority && kr.Table == r.Table && kr.Invert == r.Invert {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("%s: rule %v not back", what, r)
	}
}

func waitRoute(t *testing.T, k *netwatchtest.Kernel, r netwatch.Route, what string) {
	t.Helper()
	if !netwatchtest.Poll(func() bool {
		return slices.ContainsFunc(k.Snapshot().Routes, func(kr netwatch.Route) bool {
			return kr.Table == r.Table && kr.Dst == r.Dst && kr.MTU == r.MTU && kr.Index == r.Index
		})
	}) {
		t.Fatalf("%s: route %v not in the kernel: %v", what, r, k.Snapshot().Routes)
	}
}

func waitFights(t *testing.T, mu *sync.Mutex, fights *[]Fight, n int) {
	t.Helper()
	if !netwatchtest.Poll(func() bool { mu.Lock(); defer mu.Unlock(); return len(*fights) >= n }) {
		t.Fatalf("fights: %+v, want %d reports", *fights, n)
	}
}

// TestReconcilerTableNotCached: a policy that owns a table the watcher
// does not cache (Options.RouteTables leaves it out) gets a PlanError,
// logged once, and nothing is applied: an empty-looking table is not
// filled again on every pass.
func TestReconcilerTableNotCached(t *testing.T) {
	k, eth := fakeHost(t)
	w := startWatcher(t, k, netwatch.Options{RouteTables: []netwatch.Table{netwatch.TableMain}})
	a, err := netwatch.DialApplier(k.NetNS())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rec := new(logRecorder)
	passes := make(chan Pass, 64)
	r := &Reconciler{Watcher: w, Applier: a, Policy: tunnelPolicy(eth), Logger: slog.New(rec),
		OnPass: func(p Pass) {
			select {
			case passes <- p:
			default:
				t.Error("more passes than the test can take: the plan error is retried")
			}
		}, RetryMin: time.Millisecond, RetryMax: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var p Pass
	for p = <-passes; !p.Planned; p = <-passes {
	}
	var pe *PlanError
	if !errors.As(p.Err, &pe) || !strings.Contains(p.Err.Error(), "owned table 900 is not in the cache") {
		t.Fatalf("pass error %v, want a PlanError about table 900", p.Err)
	}
	k.AddLink("eth9", "veth", 1500, true) // another pass
	for p = <-passes; !p.Planned; p = <-passes {
	}
	if len(p.Applied) != 0 {
		t.Errorf("applied %v from an owned table the cache does not hold", p.Applied)
	}
	select {
	case p := <-passes:
		t.Errorf("a pass without a change: %+v (the plan error was retried)", p)
	case <-time.After(50 * time.Millisecond): // many retry intervals of 1 ms
	}
	n := 0
	for _, l := range rec.take() {
		if strings.Contains(l, "cannot be planned") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the plan error was logged %d times, want once", n)
	}
}

// TestReconcilerNotes: the Reconciler logs each of the policy's notes once
// while it holds (its numbers may change meanwhile), and again when it
// comes back.
func TestReconcilerNotes(t *testing.T) {
	k, _ := fakeHost(t)
	var note atomic.Pointer[string]
	say := func(n string) { note.Store(&n) }
	say("link wg9 not found")
	calls := make(chan struct{}, 100)
	r := &Reconciler{Policy: func(v netwatch.View) (Desired, bool) {
		d := Desired{Own: Own(901, 901)}
		if n := *note.Load(); n != "" {
			d.Notes = []string{n, "another note"}
		}
		calls <- struct{}{}
		return d, true
	}}
	_, rec := startReconciler(t, k, r)
	// A pass has logged its notes once the next one has called the policy.
	pass := func() {
		t.Helper()
		select {
		case <-calls:
		case <-time.After(2 * time.Minute):
			t.Fatal("no pass within 2 min")
		}
	}
	pass() // the first
	for _, n := range []string{"link wg9 not found", "", "link wg9 not found",
		"inet6: MTU 1200 is below 1280", "inet6: MTU 1100 is below 1280"} {
		say(n)
		r.Trigger()
		pass()
	}
	r.Trigger()
	pass()
	var got []string
	for _, l := range rec.take() {
		if strings.HasPrefix(l, "WARN ") {
			got = append(got, l)
		}
	}
	want := []string{"WARN link wg9 not found", "WARN another note", "WARN link wg9 not found", "WARN another note",
		"WARN inet6: MTU 1200 is below 1280"} // not again when only its numbers change
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}
}

// TestReconcilerNoRetryWhenInvalid: a pass the kernel refuses as invalid
// (EINVAL) schedules no retry, unlike one it refuses otherwise; a change of
// the world still runs a pass.
func TestReconcilerNoRetryWhenInvalid(t *testing.T) {
	op := netwatch.Op{Kind: netwatch.RouteReplace}
	l := &loop{bo: backoff.NewExponentialBackOff(backoff.WithMaxElapsedTime(0))}
	for _, tc := range []struct {
		err   error
		retry bool
	}{
		{&netwatch.ApplyError{Op: op, Err: unix.EINVAL}, false},
		{&PlanError{errors.New("no")}, false},
		{&netwatch.ApplyError{Op: op, Err: unix.EPERM}, true},
		{&netwatch.ApplyError{Op: op, Err: unix.ENODEV}, true},
	} {
		if got := !l.next(Pass{Err: tc.err}).IsZero(); got != tc.retry {
			t.Errorf("after %v: a retry is scheduled: %t, want %t", tc.err, got, tc.retry)
		}
	}

	k, eth := fakeHost(t)
	k.FailAll(unix.RTM_NEWROUTE, unix.EINVAL)
	passes, rec := startReconciler(t, k, &Reconciler{Policy: tunnelPolicy(eth)})
	if p := nextPass(t, passes, "refused pass"); !errors.Is(p.err, unix.EINVAL) {
		t.Fatalf("first pass: err %v, want EINVAL", p.err)
	}
	k.ClearFaults()
	if err := k.SetLinkMTU(eth, 1400); err != nil { // a change: a pass
		t.Fatal(err)
	}
	if p := nextPass(t, passes, "pass after a change"); p.err != nil {
		t.Fatalf("pass after a change: %v", p.err)
	}
	var errs, retries int
	for _, line := range rec.take() {
		switch line {
		case "ERROR reconcile: the kernel refuses a change of the desired state as invalid; waiting for a change":
			errs++
		case "WARN reconcile: pass failed; retrying":
			retries++
		}
	}
	if errs != 1 || retries != 0 {
		t.Errorf("%d lines saying the change is invalid (want 1), %d saying it is retried (want 0)", errs, retries)
	}
}

// TestReconcilerFlushIsOneFight: a program flushing the owned table in a
// loop fights over every route in it at once; that is one episode, with
// one warning, one "fight over" line and one OnFight at each end, however
// many routes it takes (issue 22: 52 routes were 52 warnings and 52
// metric series).
func TestReconcilerFlushIsOneFight(t *testing.T) {
	k, eth := fakeHost(t)
	const n = 30
	policy := func(v netwatch.View) (Desired, bool) {
		d := Desired{Own: Own(900, 0), Routes: new(netwatch.RouteSet)}
		for i := range n {
			d.Routes.Add(netwatch.Route{Family: netwatch.IPv4, Table: 900,
				Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 50, byte(i), 0}), 24), Gateway: netip.MustParseAddr("10.0.0.1"),
				Index: eth, Protocol: 77, Type: netwatch.RouteUnicast})
		}
		return d, true
	}
	var fmu sync.Mutex
	var fights []Fight
	r := &Reconciler{Policy: policy, RepairInterval: 20 * time.Millisecond, OnFight: func(f Fight) {
		fmu.Lock()
		defer fmu.Unlock()
		fights = append(fights, f)
	}}
	passes, rec := startReconciler(t, k, r)
	nextPass(t, passes, "initial")
	prog, err := k.DialProgram()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	// Flush until every route has been undone often enough to fight.
	undone := make(map[netip.Prefix]int)
	flushes := 0
	for deadline := time.Now().Add(2 * time.Minute); ; flushes++ { // only a hang's
		fought := 0
		for _, kr := range k.Snapshot().Routes {
			if kr.Table == 900 && kr.Dst.Addr().As4()[1] == 50 && prog.DelRoute(kr) == nil {
				undone[kr.Dst]++
			}
		}
		for _, u := range undone {
			if u >= fightUndos {
				fought++
			}
		}
		if fought == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d flushes only %d of %d routes were undone %d times", flushes, fought, n, fightUndos)
		}
		// Wait for the repair of the last route flushed, as a program
		// flushing in a loop meets it again.
		select {
		case <-passes:
		case <-time.After(2 * time.Minute):
			t.Fatal("no repair within 2 min")
		}
	}
	waitFights(t, &fmu, &fights, 2) // the start, and the end once the flushes stop
	var warns, overs []string
	for _, l := range rec.take() {
		switch {
		case strings.HasPrefix(l, "WARN fight: "):
			warns = append(warns, l)
		case strings.HasPrefix(l, "INFO fight over: "):
			overs = append(overs, l)
		}
	}
	fmu.Lock()
	defer fmu.Unlock()
	if len(fights) != 2 || fights[0].Over || !fights[1].Over || fights[1].Objects != n {
		t.Errorf("fights: %+v; want one start and one end over %d objects", fights, n)
	}
	if len(warns) != 1 || len(overs) != 1 || !strings.Contains(overs[0], fmt.Sprintf(" and %d other objects undone ", n-1)) {
		t.Errorf("fight lines: %q and %q; want one warning and one line at the end naming %d other objects", warns, overs, n-1)
	}
}

// TestReconcilerSpacing: an expensive plan spaces the passes after it, so
// that a program changing the kernel without pause (an MTU toggled in a
// loop, with 100,000 routes through the link) cannot keep the agent busy;
// a cheap one leaves the coalescing window alone, an expensive one takes
// at most a fifth of a CPU, and no spacing exceeds maxSpacing.
func TestReconcilerSpacing(t *testing.T) {
	for _, tc := range []struct{ plan, want time.Duration }{
		{100 * time.Microsecond, defaultCoalesce},
		{10 * time.Millisecond, 50 * time.Millisecond},
		{160 * time.Millisecond, 800 * time.Millisecond},
		{700 * time.Millisecond, 3500 * time.Millisecond},
		{3 * time.Second, maxSpacing},
	} {
		l := &loop{window: defaultCoalesce, lastPlan: tc.plan}
		if got := l.spacing(); got != tc.want {
			t.Errorf("after a plan of %v: next pass %v after the last began, want %v", tc.plan, got, tc.want)
		}
	}
}
