//go:build linux

package netwatch

import (
	"net/netip"
	"os"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/marksplit/marksplit/netwatch/internal/fakekernel"
	"golang.org/x/sys/unix"
)

func newProgram(t *testing.T, k *fakekernel.Kernel) *fakekernel.Program {
	t.Helper()
	p, err := k.DialProgram()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// seen is an event as the origin tests compare it.
type seen struct {
	Del    bool
	Kind   Kind
	What   string
	Origin Origin
}

func seenOf(ev Event) seen {
	s := seen{Del: ev.Deleted, Kind: ev.Kind, Origin: ev.Origin}
	switch ev.Kind {
	case KindLink:
		s.What = ev.Link.Name
	case KindAddr:
		s.What = ev.Addr.Prefix.String()
	case KindRoute:
		s.What = ev.Route.Family.String() + " " + ev.Route.Dst.String() + " table " + ev.Route.Table.String()
	case KindRule:
		s.What = ev.Rule.String()
	}
	return s
}

// collect reads events until want are all seen (in any order) or 5 s
// pass, and returns what it read.
func collect(t *testing.T, sub *Subscription, n int) []seen {
	t.Helper()
	var got []seen
	deadline := time.After(2 * time.Minute)
	for len(got) < n {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			got = append(got, seenOf(ev))
		case <-deadline:
			t.Fatalf("%d events in 5 s, want %d: %+v", len(got), n, got)
		}
	}
	return got
}

// TestFakeOrigins: every kind of event says who made the change: another
// program's socket (its port), this process's own sockets, the kernel (its
// own changes and, as the kernel does, links and IPv6 addresses whoever
// asked), and a re-dump for what the kernel changes silently.
func TestFakeOrigins(t *testing.T) {
	k, eth := fakeHost(t)
	w, d := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	sub := w.Subscribe(1024, nil)
	defer sub.Close()
	prog := newProgram(t, k)
	ap, err := DialApplier(fakeNetNS(d))
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()

	programOrigin := Origin{Kind: OriginProgram, Port: prog.Port()}
	self := Origin{Kind: OriginSelf, Port: ap.c.PID(), PID: os.Getpid(), Comm: "netwatch.test"}
	kernel := Origin{Kind: OriginKernel}
	resync := Origin{Kind: OriginResync}
	rule := Rule{Family: IPv4, Priority: 900, Table: 900, Action: ActionToTable, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77}
	steps := []struct {
		name string
		do   func()
		want []seen
	}{
		{"a program adds a route", func() {
			must(t, prog.AddRoute(fakekernel.Route{Table: 70000, Dst: netip.MustParsePrefix("10.2.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"), Index: eth}))
		}, []seen{{false, KindRoute, "inet 10.2.0.0/16 table 70000", programOrigin}}},
		{"a program deletes a rule", func() {
			must(t, prog.DelRule(fakekernel.Rule{Family: unix.AF_INET, Priority: 900, Table: 900, Mark: 0xe00, Mask: 0xf00}))
		}, []seen{{true, KindRule, rule.String(), programOrigin}}},
		{"a program adds an IPv4 address", func() {
			must(t, prog.AddAddr(eth, netip.MustParsePrefix("10.0.0.7/16")))
		}, []seen{{false, KindAddr, "10.0.0.7/16", programOrigin}}},
		{"this process adds the rule back", func() {
			if _, err := ap.Apply([]Op{{Kind: RuleAdd, Rule: rule}}); err != nil {
				t.Fatal(err)
			}
		}, []seen{{false, KindRule, rule.String(), self}}},
		{"the kernel's own change", func() { k.AddLink("eth1", "veth", 1500, true) },
			[]seen{{false, KindLink, "eth1", kernel}}},
		{"the link goes down: its IPv4 routes go silently", func() {
			if err := k.SetLinkUp(eth, false); err != nil {
				t.Fatal(err)
			}
		}, []seen{
			{false, KindLink, "eth0", kernel},
			{true, KindRoute, "inet6 fd01::/64 table 900", kernel},
			{true, KindAddr, "fd00::5/64", kernel},
			{true, KindRoute, "inet 10.0.0.0/16 table 900", resync},
			{true, KindRoute, "inet 10.1.0.0/16 table main", resync},
			{true, KindRoute, "inet 10.2.0.0/16 table 70000", resync},
		}},
	}
	for _, st := range steps {
		st.do()
		got := collect(t, sub, len(st.want))
		less := func(a, b seen) bool { return a.What < b.What || a.What == b.What && !a.Del && b.Del }
		if diff := gocmp.Diff(st.want, got, cmpopts.SortSlices(less)); diff != "" {
			t.Errorf("%s: events (-want +got):\n%s", st.name, diff)
		}
	}
}

// TestFakeOriginOverflow: changes whose events an overflow lost are
// reported by the resync that follows, as resync findings.
func TestFakeOriginOverflow(t *testing.T) {
	k, eth := fakeHost(t)
	w, _ := startFake(t, k, Options{ReadBuffer: 4096})
	waitFake(t, w, k, "initial sync")
	sub := w.Subscribe(4096, nil)
	defer sub.Close()
	prog := newProgram(t, k)
	// Hold the cache's lock while a program makes 200 changes: the
	// watcher blocks on its first event and the rest overflow its socket.
	w.Read(func(View) {
		for i := range 200 {
			must(t, prog.AddRoute(fakekernel.Route{Table: 900, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 9, byte(i), 0}), 24),
				Index: eth, Scope: unix.RT_SCOPE_LINK}))
		}
	})
	waitStats(t, w, "overflow resync", func(s Stats) bool { return s.Resyncs[resyncOverflow] >= 1 })
	waitFake(t, w, k, "after the overflow")
	got := collect(t, sub, 200)
	counts := map[OriginKind]int{}
	for _, s := range got {
		if s.Del || s.Kind != KindRoute {
			t.Errorf("unexpected event %+v", s)
		}
		counts[s.Origin.Kind]++
		if s.Origin.Kind == OriginProgram && s.Origin.Port != prog.Port() {
			t.Errorf("event from port %d, want the program's %d", s.Origin.Port, prog.Port())
		}
	}
	if counts[OriginResync] == 0 || counts[OriginProgram]+counts[OriginResync] != 200 {
		t.Errorf("origins of the 200 new routes: %v; want some found by the resync, the rest the program's", counts)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
