//go:build linux

package reconcile

import (
	"context"
	"errors"
	"fmt"
	"github.com/marksplit/marksplit/internal/kerneltest"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// rejectPolicy wants, in table 900, a route of each reject type in each
// family, written as an embedder writes them: no output link.
func rejectPolicy(v netwatch.View) (Desired, bool) {
	d := Desired{Own: Own(900, 0), Routes: new(netwatch.RouteSet)}
	for i, typ := range []netwatch.RouteType{netwatch.RouteUnreachable, netwatch.RouteThrow, netwatch.RouteBlackhole, netwatch.RouteProhibit} {
		d.Routes.Add(
			netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: netip.MustParsePrefix(fmt.Sprintf("10.93.%d.0/24", i)), Type: typ, Protocol: 77},
			netwatch.Route{Family: netwatch.IPv6, Table: 900, Dst: netip.MustParsePrefix(fmt.Sprintf("fd93:%d::/64", i)), Type: typ, Protocol: 77})
	}
	return d, true
}

// TestReconcilerRejectRoutesConverge: the kernel reports an IPv6 reject
// route as "dev lo"; the one pass that installs them is the last.
func TestReconcilerRejectRoutesConverge(t *testing.T) {
	k, _ := fakeHost(t)
	onceConverges(t, k.NetNS(), rejectPolicy)
}

// TestKernelRejectRoutesConverge is TestReconcilerRejectRoutesConverge on
// the real kernel.
func TestKernelRejectRoutesConverge(t *testing.T) {
	ns := kerneltest.NewNetNS(t)
	ns.LoUp(t)
	nns, err := netwatch.OpenNetNS(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nns.Close() })
	onceConverges(t, nns, rejectPolicy)
	got := ns.IP(t, "-6", "route", "show", "table", "900")
	for _, want := range []string{"unreachable fd93::/64 dev lo proto 77", "throw fd93:1::/64 dev lo proto 77",
		"blackhole fd93:2::/64 dev lo proto 77", "prohibit fd93:3::/64 dev lo proto 77"} {
		if !strings.Contains(got, want) {
			t.Errorf("ip -6 route show table 900:\n%s\nwant a line starting %q", got, want)
		}
	}
}

// onceConverges runs Once for policy in ns: it must converge, and a second
// Once must find nothing to do.
func onceConverges(t *testing.T, ns *netwatch.NetNS, policy func(netwatch.View) (Desired, bool)) {
	t.Helper()
	w := startWatcher(t, nil, netwatch.Options{NetNS: ns, RouteTables: []netwatch.Table{900}})
	a, err := netwatch.DialApplier(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	var applied [2]int
	for i := range applied {
		r := &Reconciler{Watcher: w, Applier: a, Policy: policy, OnChange: func(netwatch.Op, string) { applied[i]++ }}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		err := r.Once(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Once #%d: %v", i+1, err)
		}
	}
	if applied[0] == 0 || applied[1] != 0 {
		t.Errorf("changes applied by the first Once %d, by the second %d; want some, then none", applied[0], applied[1])
	}
}

// fakeHostWatched is fakeHost with a watcher of table 900 and an Applier
// on it, both until the test ends.
func fakeHostWatched(t *testing.T) (*netwatchtest.Kernel, uint32, *netwatch.Watcher, *netwatch.Applier) {
	t.Helper()
	k, eth := fakeHost(t)
	w := startWatcher(t, k, netwatch.Options{RouteTables: []netwatch.Table{900}})
	a, err := netwatch.DialApplier(k.NetNS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return k, eth, w, a
}

// lockedBuffer is a log destination the test reads while the loop writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestReconcilerWarnsWhenKernelKeepsOtherwise: a desired IPv6 route with
// scope link, which the kernel stores as universe (IPv6 routes have no
// scope), is rewritten on every pass with no one else involved. One
// warning names the route and the field; the passes go on.
func TestReconcilerWarnsWhenKernelKeepsOtherwise(t *testing.T) {
	_, eth, w, a := fakeHostWatched(t)
	var log lockedBuffer
	passes := make(chan Pass, 100)
	r := &Reconciler{Watcher: w, Applier: a, Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Policy: func(v netwatch.View) (Desired, bool) {
			return Desired{Own: Own(900, 0), Routes: new(netwatch.RouteSet).Add(netwatch.Route{Family: netwatch.IPv6, Table: 900,
				Dst: netip.MustParsePrefix("fd94::/64"), Index: eth, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast, Protocol: 77})}, true
		},
		OnPass: func(p Pass) {
			if len(p.Applied) > 0 {
				select {
				case passes <- p:
				default:
				}
			}
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	runUntilCleanup(t, ctx, cancel, r.Run)
	for i := range 5 {
		r.Trigger()
		select {
		case <-passes:
		case <-time.After(2 * time.Minute):
			t.Fatalf("pass %d: none within 2 min; log:\n%s", i+1, log.String())
		}
	}
	const want = `level=WARN msg="reconcile: the kernel keeps a route otherwise than desired, so every pass rewrites it; desire it as the kernel reports it" route="table 900: fd94::/64 dev eth0 scope link (was unset) metric 1024" differs="Scope: link, kernel global"`
	if got := log.String(); strings.Count(got, "reconcile: the kernel keeps a route") != 1 || !strings.Contains(got, want) {
		t.Errorf("log:\n%s\nwant once: %s", got, want)
	}
}

// TestOnceStopsWhenCanceledMidPass: a context that ends during a pass over
// more than a chunk stops the pass after its chunk, and Once returns the
// context's cause, where it went on planning from views that lagged behind
// what it applied (a busy node's `marksplit cleanup` then failed with "not
// converged after 4 passes" for routes already gone).
func TestOnceStopsWhenCanceledMidPass(t *testing.T) {
	k, eth, w, a := fakeHostWatched(t)
	const n = 2500 // three chunks
	policy := func(netwatch.View) (Desired, bool) {
		d := Desired{Own: Own(900, 0), Routes: new(netwatch.RouteSet)}
		for i := range n {
			d.Routes.Add(netwatch.Route{Family: netwatch.IPv4, Table: 900, Type: netwatch.RouteUnicast, Index: eth, Protocol: 77,
				Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 8), byte(i), 0}), 24)})
		}
		return d, true
	}
	stalled := fmt.Errorf("no change for a while")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	changes := 0
	r := &Reconciler{Watcher: w, Applier: a, Policy: policy, OnChange: func(netwatch.Op, string) {
		if changes++; changes == 1 {
			cancel(stalled)
		}
	}}
	err := r.Once(ctx)
	if !errors.Is(err, stalled) || !strings.Contains(err.Error(), "stopped before converging") {
		t.Fatalf("Once = %v; want \"stopped before converging\" and the context's cause", err)
	}
	in900 := 0
	for _, r := range k.Snapshot().Routes {
		if r.Table == 900 && r.Protocol == 77 && r.Dst.Bits() == 24 {
			in900++
		}
	}
	if changes != chunkOps || in900 != chunkOps {
		t.Errorf("%d changes, %d routes of the policy in table 900; want one chunk (%d) of %d", changes, in900, chunkOps, n)
	}
}

// TestRunConvergesAfterChunkedPass: a pass over exactly two chunks ends
// with a chunk that finds nothing left, planned from a view that already
// holds everything the pass applied. Run must still confirm the pass with
// another: it waited for a change after that view instead, and none came,
// so the agent over 5,000 peers (4,999 routes and a rule: five full
// chunks) stayed unready until the next resync, five minutes later.
func TestRunConvergesAfterChunkedPass(t *testing.T) {
	k, eth, w, a := fakeHostWatched(t)
	const n = 2 * chunkOps // new routes; the host's two in table 900 stay
	policy := func(v netwatch.View) (Desired, bool) {
		d := Desired{Own: Own(900, 0), Routes: new(netwatch.RouteSet)}
		for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
			for r := range v.Routes(f, 900) {
				if r.Dst.Bits() != 24 {
					d.Routes.Add(r)
				}
			}
		}
		for i := range n {
			d.Routes.Add(netwatch.Route{Family: netwatch.IPv4, Table: 900, Type: netwatch.RouteUnicast, Index: eth, Protocol: 77,
				Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 8), byte(i), 0}), 24)})
		}
		return d, true
	}
	converged := make(chan struct{})
	var once sync.Once
	var changes atomic.Int64
	r := &Reconciler{Watcher: w, Applier: a, Policy: policy, OnChange: func(netwatch.Op, string) { changes.Add(1) }}
	r.OnPass = func(Pass) {
		if r.Converged() {
			once.Do(func() { close(converged) })
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	runUntilCleanup(t, ctx, cancel, r.Run)
	select {
	case <-converged:
	case <-time.After(2 * time.Minute): // only a hang: the pass itself takes a second
		t.Fatalf("no converged pass within 2 min after %d changes", changes.Load())
	}
	in900 := 0
	for _, r := range k.Snapshot().Routes {
		if r.Table == 900 {
			in900++
		}
	}
	if in900 != n+2 {
		t.Errorf("%d routes in table 900, want %d", in900, n+2)
	}
}
