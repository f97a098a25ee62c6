//go:build linux

package netwatchtest

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/nstest"
	"github.com/marksplit/marksplit/netwatch"
)

// fakeAndReal builds the same host in the fake kernel and, where namespaces
// work, in a real one: eth0 (192.0.2.10/24) and eth1 (198.51.100.10/24), a
// default route out of eth0 in main and one out of eth1 in table 920, and
// rules that send packets from eth1's subnet and packets that came in by eth1
// to table 920. ns is nil where real-kernel tests cannot run.
func fakeAndReal(t *testing.T) (*Kernel, *NetNS) {
	t.Helper()
	k := New()
	t.Cleanup(func() { k.Close() })
	var ns *NetNS
	if os.Getenv("MARKSPLIT_KERNEL_TESTS") == "1" {
		RequireKernel(t)
	}
	if reason := nstest.Unavailable(); reason == "" {
		ns = NewNetNS(t)
		ns.LoUp(t)
		// Forwarded packets (route get … iif) are looked up only where
		// forwarding is on.
		if err := ns.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0) }); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("the fake kernel alone: %s", reason)
	}
	for i, l := range []struct{ name, addr, peer string }{{"eth0", "192.0.2.10/24", "p0"}, {"eth1", "198.51.100.10/24", "p1"}} {
		idx := k.AddLink(l.name, "veth", 1500, true)
		if err := k.AddAddr(idx, netip.MustParsePrefix(l.addr)); err != nil {
			t.Fatal(err)
		}
		if ns != nil {
			ns.AddVeth(t, l.name, nil, l.peer)
			ns.IP(t, "link", "set", l.peer, "up")
			ns.IP(t, "link", "set", l.name, "up")
			ns.IP(t, "addr", "add", l.addr, "dev", l.name)
		}
		gw := []string{"192.0.2.1", "198.51.100.1"}[i]
		table := []netwatch.Table{netwatch.TableMain, 920}[i]
		mtu := []uint32{0, 1355}[i] // table 920's route has an MTU of its own
		if err := k.AddRoute(netwatch.Route{Table: table, Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr(gw),
			Index: idx, Protocol: netwatch.ProtoStatic, MTU: mtu}); err != nil {
			t.Fatal(err)
		}
		if ns != nil {
			args := []string{"route", "add", "default", "via", gw, "dev", l.name, "table", table.String(), "proto", "static"}
			if mtu != 0 {
				args = append(args, "mtu", strconv.Itoa(int(mtu)))
			}
			ns.IP(t, args...)
		}
	}
	for _, r := range []struct {
		rule netwatch.Rule
		ip   []string
	}{
		{netwatch.Rule{Family: netwatch.IPv4, Priority: 920, Table: 920, Src: netip.MustParsePrefix("198.51.100.0/24")},
			[]string{"rule", "add", "from", "198.51.100.0/24", "lookup", "920", "pref", "920"}},
		{netwatch.Rule{Family: netwatch.IPv4, Priority: 921, Table: 920, IIF: "eth1"},
			[]string{"rule", "add", "iif", "eth1", "lookup", "920", "pref", "921"}},
	} {
		if err := k.AddRule(r.rule); err != nil {
			t.Fatal(err)
		}
		if ns != nil {
			ns.IP(t, r.ip...)
		}
	}
	return k, ns
}

// both returns the namespaces of fakeAndReal, the fake's first, as the
// kit hands them out: one test runs on each.
func both(t *testing.T) []*netwatch.NetNS {
	k, ns := fakeAndReal(t)
	nss := []*netwatch.NetNS{k.NetNS()}
	if ns != nil {
		nss = append(nss, ns.NetNS())
	}
	return nss
}

// TestKernelRouteGet: RouteGet follows the rules by source address and
// input link, on the fake kernel as on the real one.
func TestKernelRouteGet(t *testing.T) {
	dst := netip.MustParseAddr("203.0.113.9")
	for i, ns := range both(t) {
		for _, tc := range []struct {
			name  string
			q     Lookup
			dev   string
			table netwatch.Table
		}{
			{"local", Lookup{Dst: dst}, "eth0", netwatch.TableMain},
			{"from a source the rule names", Lookup{Dst: dst, Src: netip.MustParseAddr("198.51.100.10")}, "eth1", 920},
			{"from another source", Lookup{Dst: dst, Src: netip.MustParseAddr("192.0.2.10")}, "eth0", netwatch.TableMain},
			{"in by the link the rule names", Lookup{Dst: dst, Src: netip.MustParseAddr("198.51.100.7"), IIF: "eth1"}, "eth1", 920},
			{"in by another link", Lookup{Dst: dst, Src: netip.MustParseAddr("192.0.2.7"), IIF: "eth0"}, "eth0", netwatch.TableMain},
			{"in by the link, from a source the rule names", Lookup{Dst: dst, Src: netip.MustParseAddr("198.51.100.7"), IIF: "eth0"}, "eth1", 920},
		} {
			t.Run([]string{"fake", "real"}[i]+"/"+tc.name, func(t *testing.T) {
				got, err := RouteGet(ns, tc.q)
				if err != nil {
					t.Fatal(err)
				}
				mtu := uint32(0)
				if tc.table == 920 {
					mtu = 1355
				}
				want := Hop{Dev: tc.dev, Table: tc.table, MTU: mtu}
				if !want.Matches(got) || got.MTU != mtu {
					t.Errorf("got %+v, want %+v", got, want)
				}
			})
		}
		// A locally generated packet from an address the host does not have.
		if _, err := RouteGet(ns, Lookup{Dst: dst, Src: netip.MustParseAddr("10.9.1.1")}); !errors.Is(err, syscall.ENETUNREACH) {
			t.Errorf("%d: from a source not the host's: %v, want ENETUNREACH", i, err)
		}
		if _, err := RouteGet(ns, Lookup{Dst: dst, Src: netip.MustParseAddr("198.51.100.7"), IIF: "nosuch"}); err == nil {
			t.Errorf("%d: a lookup in by a link that does not exist: no error", i)
		}
	}
}

// TestKernelOwnedText: OwnedText lists the same lines on the fake kernel
// as on the real one for the same state.
func TestKernelOwnedText(t *testing.T) {
	const want = "-4 route default via 198.51.100.1 dev eth1 table 920 proto static mtu 1355\n" +
		"-4 rule 920:\tfrom 198.51.100.0/24 lookup 920"
	for _, ns := range both(t) {
		WaitOwned(t, ns, new(SyncBuffer), 920, 920, want)
	}
}

// TestOverflow: Overflow makes a watcher's subscription fail with ENOBUFS,
// and the watcher resyncs.
func TestOverflow(t *testing.T) {
	k := New()
	t.Cleanup(func() { k.Close() })
	w := netwatch.New(netwatch.Options{NetNS: k.NetNS(), RetryMin: time.Millisecond, RetryMax: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	k.Overflow()
	if !Poll(func() bool { return w.Stats().Resyncs["overflow"] == 1 }) {
		t.Fatalf("no resync after the overflow: %+v", w.Stats().Resyncs)
	}
}

// TestKernelRouteMetrics: the fake keeps every metric a route is given,
// "mtu lock" included, and hands it back as netwatch reads it, through
// the Go API and through an Applier alike; deleting names the metrics as
// the kernel's IPv4 delete does.
func TestKernelRouteMetrics(t *testing.T) {
	k := New()
	defer k.Close()
	eth := k.AddLink("eth0", "veth", 1500, true)
	r := netwatch.Route{Family: netwatch.IPv4, Table: 920, Dst: netip.MustParsePrefix("10.9.0.0/16"), Index: eth,
		MTU: 1355, Protocol: netwatch.ProtoStatic, Scope: netwatch.ScopeLink, Type: netwatch.RouteUnicast,
		Metrics: netwatch.Metrics{Locks: 1 << unix.RTAX_MTU, AdvMSS: 1300, HopLimit: 64, CongCtl: "cubic", Features: 1}}
	a, err := netwatch.DialApplier(k.NetNS())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Apply([]netwatch.Op{{Kind: netwatch.RouteReplace, Route: r}}); err != nil {
		t.Fatal(err)
	}
	got := slices.Collect(k.Snapshot().View().Route(r.Key()))
	if len(got) != 1 || !got[0].Equal(r) {
		t.Fatalf("the fake holds %v, want %v", got, r)
	}
	if s := got[0].String(); !strings.Contains(s, "mtu lock 1355") {
		t.Errorf("%q does not say mtu lock 1355", s)
	}
	other := r
	other.Metrics.Locks = 1 << 3 // the window's lock, not the MTU's
	if err := k.DelRoute(other); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("delete with another lock: %v, want ESRCH", err)
	}
	other.Metrics.Locks, other.MTU = r.Metrics.Locks, 1300
	if err := k.DelRoute(other); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("delete with another MTU: %v, want ESRCH", err)
	}
	big := r
	big.Dst, big.MTU = netip.MustParsePrefix("10.8.0.0/16"), 70000
	if err := k.AddRoute(big); err != nil {
		t.Fatal(err)
	}
	if got := slices.Collect(k.Snapshot().View().Route(big.Key())); len(got) != 1 || got[0].MTU != 65520 {
		t.Errorf("mtu 70000: the fake holds %v, want the kernel's clamp to 65520", got)
	}
	if err := k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("10.7.0.0/16"), Index: eth,
		Metrics: netwatch.Metrics{CongCtl: "bbr"}}); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("congctl bbr: %v, want EOPNOTSUPP (not modelled)", err)
	}
	if err := k.DelRoute(r); err != nil {
		t.Errorf("delete with the lock: %v", err)
	}
}
