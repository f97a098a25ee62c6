//go:build linux

package netwatch

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/netwatch/internal/fakekernel"
	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// Fault tests on netwatch/netwatchtest's fake kernel: one test per way the
// watcher can lose track of the kernel, each checking the stats it
// reports and that the cache ends equal to the fake kernel's state.

// fakeDialer dials the fake kernel and wraps each multicast socket in a
// faultConn the test can reach.
type fakeDialer struct {
	k *fakekernel.Kernel

	mu       sync.Mutex
	mcs      []*faultConn    // multicast sockets, in dial order
	requests int             // request sockets dialed
	ports    map[uint32]bool // of every socket dialed: this process's
	fail     error           // returned by Dial while set
	// onRouteDump, when set, runs once, when a request socket receives
	// the first datagram of routes after it was set.
	onRouteDump atomic.Pointer[func()]
}

// hookConn is a request socket of a fakeDialer.
type hookConn struct {
	rtnl.Conn
	d *fakeDialer
}

func (c hookConn) ReceiveDatagram(b []byte) ([]byte, error) {
	dg, err := c.Conn.ReceiveDatagram(b)
	if err == nil && len(dg) >= unix.NLMSG_HDRLEN && binary.NativeEndian.Uint16(dg[4:6]) == unix.RTM_NEWROUTE {
		if f := c.d.onRouteDump.Swap(nil); f != nil {
			(*f)()
		}
	}
	return dg, err
}

func (d *fakeDialer) Dial(cfg rtnl.DialConfig) (rtnl.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail != nil {
		return nil, d.fail
	}
	c, err := d.k.DialConn(cfg.Groups, cfg.ReadBuffer)
	if err != nil {
		return nil, err
	}
	if d.ports == nil {
		d.ports = make(map[uint32]bool)
	}
	d.ports[c.PID()] = true
	if len(cfg.Groups) == 0 {
		d.requests++
		return hookConn{c, d}, nil
	}
	fc := &faultConn{Conn: c, fake: c}
	d.mcs = append(d.mcs, fc)
	return fc, nil
}

// owners says that the sockets the dialer opened are this process's, as
// the kernel's portOwners would.
func (d *fakeDialer) owners() ownerFinder { return fakeOwners{d} }

type fakeOwners struct{ d *fakeDialer }

func (o fakeOwners) find(port uint32) (int, string, bool) {
	o.d.mu.Lock()
	defer o.d.mu.Unlock()
	if o.d.ports[port] {
		return os.Getpid(), "netwatch.test", true
	}
	return 0, "", false
}

// mc returns the newest multicast socket.
func (d *fakeDialer) mc() *faultConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mcs[len(d.mcs)-1]
}

func (d *fakeDialer) multicastDials() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.mcs)
}

// faultConn passes a conn through, except that the message received after
// arm goes through the armed function first.
type faultConn struct {
	rtnl.Conn
	fake *fakekernel.FakeConn

	mu     sync.Mutex
	mutate func(netlink.Message) (netlink.Message, error)
}

func (c *faultConn) arm(f func(netlink.Message) (netlink.Message, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mutate = f
}

// ReceiveBatch hands the first message of the batch to the armed fault,
// which may change it or fail the read.
func (c *faultConn) ReceiveBatch(b []byte) ([]byte, error) {
	start := len(b)
	b, err := c.Conn.ReceiveBatch(b)
	c.mu.Lock()
	f := c.mutate
	if err == nil && len(b) > start {
		c.mutate = nil
	}
	c.mu.Unlock()
	if f == nil || err != nil || len(b) == start {
		return b, err
	}
	h, body, rest, perr := nextMessage(b[start:])
	if perr != nil {
		return b, perr
	}
	m, ferr := f(netlink.Message{Header: h, Data: body})
	if ferr != nil {
		return b[:start], ferr
	}
	out := append([]byte(nil), b[:start]...)
	out = binary.NativeEndian.AppendUint32(out, uint32(16+len(m.Data)))
	out = binary.NativeEndian.AppendUint16(out, uint16(m.Header.Type))
	out = binary.NativeEndian.AppendUint16(out, uint16(m.Header.Flags))
	out = binary.NativeEndian.AppendUint32(out, m.Header.Sequence)
	out = binary.NativeEndian.AppendUint32(out, m.Header.PID)
	out = append(out, m.Data...)
	for len(out)%4 != 0 {
		out = append(out, 0)
	}
	return append(out, rest...), nil
}

func (c *faultConn) ReceiveIter() iter.Seq2[netlink.Message, error] {
	return func(yield func(netlink.Message, error) bool) {
		for m, err := range c.Conn.ReceiveIter() {
			if err == nil {
				c.mu.Lock()
				f := c.mutate
				c.mutate = nil
				c.mu.Unlock()
				if f != nil {
					m, err = f(m)
				}
			}
			if !yield(m, err) || err != nil {
				return
			}
		}
	}
}

// fakeHost is fakekernel.NewHost, closed when the test ends.
func fakeHost(t *testing.T) (*fakekernel.Kernel, uint32) {
	t.Helper()
	k, eth, err := fakekernel.NewHost()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k, eth
}

// fakeState is what the fake kernel and the cache are compared on: the
// fields the fake models.
type fakeState struct {
	Links  []string
	Addrs  []string
	Routes []string
	Rules  []string
}

func fakeStateOf(k *fakekernel.Kernel) fakeState {
	var s fakeState
	for _, l := range k.Links() {
		s.Links = append(s.Links, fmt.Sprintf("%d %s kind=%q mtu=%d flags=%#x oper=%d", l.Index, l.Name, l.Kind, l.MTU, uint32(l.Flags), l.OperState))
	}
	for _, a := range k.Addrs() {
		s.Addrs = append(s.Addrs, fmt.Sprintf("%d %v scope=%d flags=%#x label=%q", a.Index, a.Prefix, a.Scope, uint32(a.Flags), a.Label))
	}
	for _, r := range k.Routes() {
		f := IPv4
		if r.Family() == unix.AF_INET6 {
			f = IPv6
		}
		s.Routes = append(s.Routes, routeString(f, r.Table, r.Dst, r.TOS, r.Metric, r.Gateway, r.Index, r.PrefSrc, r.MTU, r.Protocol, r.Scope, r.Type))
	}
	for _, r := range k.Rules() {
		s.Rules = append(s.Rules, ruleString(r.Family == unix.AF_INET6, r.Priority, r.Table, r.Action, r.Invert, r.Mark, r.Mask, r.Protocol, r.Src, r.Dst, r.TOS, r.IIF, r.OIF))
	}
	slices.Sort(s.Addrs)
	slices.Sort(s.Routes)
	return s
}

func routeString(f Family, t uint32, dst netip.Prefix, tos uint8, metric uint32, gw netip.Addr, index uint32, psrc netip.Addr, mtu uint32, proto, scope, typ uint8) string {
	return fmt.Sprintf("%v table %d %v tos %d metric %d via %v dev %d src %v mtu %d proto %d scope %d type %d",
		f, t, dst, tos, metric, gw, index, psrc, mtu, proto, scope, typ)
}

func ruleString(v6 bool, prio, table uint32, action uint8, invert bool, mark, mask uint32, proto uint8, src, dst netip.Prefix, tos uint8, iif, oif string) string {
	return fmt.Sprintf("v6=%t %d: table %d action %d not=%t fwmark %#x/%#x proto %d from %v to %v tos %d iif %q oif %q",
		v6, prio, table, action, invert, mark, mask, proto, src, dst, tos, iif, oif)
}

func fakeStateOfView(v View) fakeState {
	var s fakeState
	snap := v.snapshot()
	for _, l := range snap.Links {
		s.Links = append(s.Links, fmt.Sprintf("%d %s kind=%q mtu=%d flags=%#x oper=%d", l.Index, l.Name, l.Kind, l.MTU, uint32(l.Flags), l.OperState))
	}
	for _, a := range snap.Addrs {
		s.Addrs = append(s.Addrs, fmt.Sprintf("%d %v scope=%d flags=%#x label=%q", a.Index, a.Prefix, a.Scope, uint32(a.Flags), a.Label))
	}
	for _, r := range snap.Routes {
		s.Routes = append(s.Routes, routeString(r.Family, uint32(r.Table), r.Dst, r.TOS, r.Metric, r.Gateway, r.Index, r.PrefSrc, r.MTU, uint8(r.Protocol), uint8(r.Scope), uint8(r.Type)))
	}
	for _, r := range snap.Rules {
		s.Rules = append(s.Rules, ruleString(r.Family == IPv6, r.Priority, uint32(r.Table), uint8(r.Action), r.Invert, uint32(r.Mark), uint32(r.Mask), uint8(r.Protocol), r.Src, r.Dst, r.TOS, r.IIF, r.OIF))
	}
	slices.Sort(s.Addrs)
	slices.Sort(s.Routes)
	return s
}

// waitFake polls until the cache is synced and equals the fake kernel.
func waitFake(t *testing.T, w *Watcher, k *fakekernel.Kernel, what string) {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	diff := "never synced"
	for {
		if w.synced() {
			var got fakeState
			w.Read(func(v View) { got = fakeStateOfView(v) })
			if diff = gocmp.Diff(fakeStateOf(k), got); diff == "" {
				return
			}
		}
		select {
		case <-deadline.C:
			t.Fatalf("%s: cache did not converge with the fake kernel; stats %+v\n(-fake +cache):\n%s", what, w.Stats(), diff)
		case <-tick.C:
		}
	}
}

// waitStats polls until cond holds for the watcher's stats.
func waitStats(t *testing.T, w *Watcher, what string, cond func(Stats) bool) Stats {
	t.Helper()
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if st := w.Stats(); cond(st) {
			return st
		}
		select {
		case <-deadline.C:
			t.Fatalf("%s: not reached; stats %+v", what, w.Stats())
		case <-tick.C:
		}
	}
}

func startFake(t *testing.T, k *fakekernel.Kernel, opts Options) (*Watcher, *fakeDialer) {
	t.Helper()
	d := &fakeDialer{k: k}
	opts.NetNS = fakeNetNS(d)
	if opts.RetryMin == 0 {
		opts.RetryMin, opts.RetryMax = time.Millisecond, time.Millisecond
	}
	return startWatcher(t, opts), d
}

// TestFakeForeignChanges: every kind of change made by someone else reaches
// the cache through events alone.
func TestFakeForeignChanges(t *testing.T) {
	k, eth := fakeHost(t)
	w, _ := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	base := w.Stats()
	steps := []struct {
		name string
		do   func() error
	}{
		{"add link", func() error { k.AddLink("eth1", "veth", 1500, true); return nil }},
		{"link mtu", func() error { return k.SetLinkMTU(eth, 1400) }},
		{"add address", func() error { return k.AddAddr(eth, netip.MustParsePrefix("10.0.0.6/16")) }},
		{"add route", func() error {
			return k.AddRoute(fakekernel.Route{Table: 70000, Dst: netip.MustParsePrefix("10.2.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"), Index: eth, Metric: 5})
		}},
		{"replace route", func() error {
			return k.ReplaceRoute(fakekernel.Route{Table: 70000, Dst: netip.MustParsePrefix("10.2.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.2"), Index: eth, Metric: 5, MTU: 1300})
		}},
		{"add blackhole", func() error {
			return k.AddRoute(fakekernel.Route{Table: 900, Dst: netip.MustParsePrefix("10.3.0.0/16"), Type: unix.RTN_BLACKHOLE})
		}},
		{"delete route", func() error {
			return k.DelRoute(fakekernel.Route{Table: 70000, Dst: netip.MustParsePrefix("10.2.0.0/16"), Metric: 5})
		}},
		{"add rule", func() error {
			return k.AddRule(fakekernel.Rule{Family: unix.AF_INET, Priority: 100, Table: 70000, Mark: 1})
		}},
		{"delete rule", func() error {
			return k.DelRule(fakekernel.Rule{Family: unix.AF_INET6, Priority: 900, Table: 900, Mark: 0xe00, Mask: 0xf00})
		}},
		{"delete address", func() error { return k.DelAddr(eth, netip.MustParsePrefix("10.0.0.6/16")) }},
		{"delete link", func() error { return k.DelLink(eth + 2) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		waitFake(t, w, k, s.name)
	}
	st := w.Stats()
	if st.Resyncs[resyncOverflow]+st.Resyncs[resyncRequested]+st.Resyncs[resyncReconnect] != 0 || st.Resyncs[resyncInitial] != 1 {
		t.Errorf("resyncs without a cause: %v", st.Resyncs)
	}
	if st.Events[KindRoute] <= base.Events[KindRoute] || st.Events[KindRule] <= base.Events[KindRule] ||
		st.Events[KindLink] <= base.Events[KindLink] || st.Events[KindAddr] <= base.Events[KindAddr] {
		t.Errorf("events not counted by kind: before %v, after %v", base.Events, st.Events)
	}
	if st.LastSyncDuration <= 0 || !st.Synced || st.Generation == 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestFakeENOBUFS: an injected overflow makes the watcher resync on a new
// multicast socket, counted as an overflow.
func TestFakeENOBUFS(t *testing.T) {
	k, eth := fakeHost(t)
	w, d := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	first := d.mc()
	k.InjectENOBUFS(first.fake)
	// A change the watcher only learns from the resync: its event goes
	// to the old socket, which is not read any more.
	st := waitStats(t, w, "overflow resync", func(s Stats) bool { return s.Resyncs[resyncOverflow] == 1 })
	if err := k.AddRoute(fakekernel.Route{Table: 900, Dst: netip.MustParsePrefix("10.4.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	waitFake(t, w, k, "after the overflow")
	if n := d.multicastDials(); n != 2 {
		t.Errorf("multicast sockets dialed: %d, want 2 (a fresh one after the overflow)", n)
	}
	if st.Reconnects != 0 {
		t.Errorf("an overflow counted as a reconnect: %+v", st)
	}
}

// TestFakeOverflow: a real overrun of a small receive buffer, while the
// watcher is held up, is noticed and repaired.
func TestFakeOverflow(t *testing.T) {
	k, eth := fakeHost(t)
	w, _ := startFake(t, k, Options{ReadBuffer: 4096})
	waitFake(t, w, k, "initial sync")
	// Hold the cache's lock: the watcher blocks on its first event, and
	// the rest pile up in its socket.
	w.Read(func(View) {
		for i := range 200 {
			r := fakekernel.Route{Table: 900, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 5, byte(i), 0}), 24), Gateway: netip.MustParseAddr("10.0.0.1"), Index: eth}
			if err := k.AddRoute(r); err != nil {
				t.Error(err)
			}
		}
	})
	waitFake(t, w, k, "after the overflow")
	if st := w.Stats(); st.Resyncs[resyncOverflow] == 0 {
		t.Errorf("no overflow resync: %+v", st)
	}
}

// TestFakeOverflowCongested: after an overflow the kernel drops every
// event for that socket, silently, until its queue has been read empty
// (netwatchtest's TestKernelCongestion). A route deleted while the watcher
// re-dumps, after the dump listed it, is known from its event alone: the
// watcher must resync on a new socket, or that event is lost with the
// old socket's congestion.
func TestFakeOverflowCongested(t *testing.T) {
	k, eth := fakeHost(t)
	victim := fakekernel.Route{Table: 900, Dst: netip.MustParsePrefix("10.7.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK}
	if err := k.AddRoute(victim); err != nil {
		t.Fatal(err)
	}
	w, d := startFake(t, k, Options{ReadBuffer: 4096})
	waitFake(t, w, k, "initial sync")
	del := func() {
		if err := k.DelRoute(victim); err != nil {
			t.Error(err)
		}
	}
	// The next route dump, the resync's, deletes the victim after
	// listing it. Then hold the cache's lock, as TestFakeOverflow, so
	// that the events overflow the socket.
	d.onRouteDump.Store(&del)
	w.Read(func(View) {
		for i := range 200 {
			r := fakekernel.Route{Table: 900, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 5, byte(i), 0}), 24), Gateway: netip.MustParseAddr("10.0.0.1"), Index: eth}
			if err := k.AddRoute(r); err != nil {
				t.Error(err)
			}
		}
	})
	waitStats(t, w, "overflow resync", func(s Stats) bool { return s.Resyncs[resyncOverflow] >= 1 })
	if d.onRouteDump.Load() != nil {
		t.Fatal("the resync dumped no routes")
	}
	waitFake(t, w, k, "after the overflow and the deletion")
}

// TestFakeDumpInterrupted: a dump the kernel marks interrupted is done
// again; one interrupted every time ends the session, which reconnects.
func TestFakeDumpInterrupted(t *testing.T) {
	t.Run("twice", func(t *testing.T) {
		k, _ := fakeHost(t)
		k.SetDumpIntr(unix.RTM_GETROUTE, 2)
		w, _ := startFake(t, k, Options{})
		waitFake(t, w, k, "initial sync")
		st := w.Stats()
		if st.Resyncs[resyncInterrupted] != 2 || st.Reconnects != 0 {
			t.Errorf("resyncs %v, reconnects %d; want 2 interrupted dumps, no reconnect", st.Resyncs, st.Reconnects)
		}
	})
	t.Run("always", func(t *testing.T) {
		k, _ := fakeHost(t)
		k.SetDumpIntr(unix.RTM_GETRULE, maxDumpAttempts)
		w, _ := startFake(t, k, Options{})
		waitFake(t, w, k, "sync after giving up on a dump")
		st := w.Stats()
		if st.Resyncs[resyncInterrupted] != maxDumpAttempts || st.Reconnects != 1 || st.Resyncs[resyncReconnect] != 1 {
			t.Errorf("resyncs %v, reconnects %d; want %d interrupted dumps, then a reconnect", st.Resyncs, st.Reconnects, maxDumpAttempts)
		}
	})
}

// TestFakeRequestErrors: a dump that fails ends the session; the watcher
// reconnects with backoff until it succeeds, unsynced meanwhile.
func TestFakeRequestErrors(t *testing.T) {
	t.Run("next", func(t *testing.T) {
		k, _ := fakeHost(t)
		k.FailNext(unix.RTM_GETROUTE, unix.EBUSY, 3)
		w, _ := startFake(t, k, Options{})
		waitFake(t, w, k, "sync after failed dumps")
		if st := w.Stats(); st.Reconnects != 3 || st.Resyncs[resyncReconnect] != 1 || st.Resyncs[resyncInitial] != 0 {
			t.Errorf("stats %+v; want 3 reconnects, then one resync", st)
		}
	})
	t.Run("all", func(t *testing.T) {
		k, _ := fakeHost(t)
		k.FailAll(unix.RTM_GETLINK, unix.EPERM)
		w, _ := startFake(t, k, Options{})
		st := waitStats(t, w, "reconnects", func(s Stats) bool { return s.Reconnects >= 5 })
		if st.Synced || w.synced() {
			t.Errorf("synced although every link dump fails")
		}
		w.Read(func(v View) {
			if v.Synced() {
				t.Errorf("view synced although every link dump fails")
			}
		})
		k.ClearFaults()
		waitFake(t, w, k, "sync after the fault cleared")
	})
	t.Run("after sync", func(t *testing.T) {
		// A failed route re-dump (after a link went down) ends the
		// session; the cache is marked unsynced until the reconnect.
		k, eth := fakeHost(t)
		w, _ := startFake(t, k, Options{})
		waitFake(t, w, k, "initial sync")
		k.FailNext(unix.RTM_GETROUTE, unix.EIO, 1)
		if err := k.SetLinkUp(eth, false); err != nil {
			t.Fatal(err)
		}
		waitFake(t, w, k, "after the failed re-dump")
		if st := w.Stats(); st.Reconnects != 1 || st.Resyncs[resyncReconnect] != 1 {
			t.Errorf("stats %+v; want one reconnect", st)
		}
	})
}

// TestFakeSilentRouteRemoval: the fake kernel, like the real one, removes
// IPv4 routes without events when their link goes down or loses its last
// IPv4 address.
func TestFakeSilentRouteRemoval(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(k *fakekernel.Kernel, eth uint32) error
	}{
		{"link down", func(k *fakekernel.Kernel, eth uint32) error { return k.SetLinkUp(eth, false) }},
		{"last address removed", func(k *fakekernel.Kernel, eth uint32) error {
			return k.DelAddr(eth, netip.MustParsePrefix("10.0.0.5/16"))
		}},
		{"link deleted", func(k *fakekernel.Kernel, eth uint32) error { return k.DelLink(eth) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, eth := fakeHost(t)
			w, _ := startFake(t, k, Options{})
			waitFake(t, w, k, "initial sync")
			k.ResetRequests()
			if err := tc.do(k, eth); err != nil {
				t.Fatal(err)
			}
			waitFake(t, w, k, tc.name)
			if st := w.Stats(); st.Resyncs[resyncRoutes]+st.Resyncs[resyncLinkRoutes] == 0 {
				t.Errorf("no route re-dump: %+v", st)
			}
			if st := w.Stats(); tc.name == "link down" && (st.Resyncs[resyncLinkRoutes] == 0 || st.Resyncs[resyncRoutes] != 0) {
				t.Errorf("link down: stats %+v, want only re-dumps of the link's routes", st)
			}
			// A link going down asks for that link's routes, not the
			// table. (Removing an address, as a deleted link's are, asks
			// for the family: the kernel drops the routes that have the
			// address as source, out of any link.)
			for _, oif := range routeDumpLinks(t, k) {
				if oif != eth && tc.name == "link down" {
					t.Errorf("a route dump of link %d (0: all), want only link %d's", oif, eth)
				}
			}
		})
	}
}

// routeDumpLinks returns the output link of each route dump the fake
// kernel was asked for (0: every link).
func routeDumpLinks(t *testing.T, k *fakekernel.Kernel) []uint32 {
	t.Helper()
	var oifs []uint32
	for _, r := range k.Requests() {
		if r.Type == unix.RTM_GETROUTE && r.Flags&netlink.Dump != 0 {
			rt, ok := r.Object.(fakekernel.Route)
			if !ok {
				t.Fatalf("route dump request %+v does not decode", r)
			}
			oifs = append(oifs, rt.Index)
		}
	}
	return oifs
}

// TestFakeUnrelatedLinkNoRedump: a link that carries no route (a pod's
// veth) goes up and down, changes its MTU and goes away without a single
// route dump: the kernel can have changed no route.
func TestFakeUnrelatedLinkNoRedump(t *testing.T) {
	k, _ := fakeHost(t)
	w, _ := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	spare := k.AddLink("spare0", "veth", 1500, false)
	waitFake(t, w, k, "the spare link")
	k.ResetRequests()
	st0 := w.Stats()
	for i := range 20 {
		must(t, k.SetLinkUp(spare, i%2 == 0))
	}
	must(t, k.SetLinkMTU(spare, 1400))
	must(t, k.DelLink(spare))
	waitFake(t, w, k, "the spare link's changes")
	if oifs := routeDumpLinks(t, k); len(oifs) > 0 {
		t.Errorf("route dumps for links %v; want none", oifs)
	}
	st1 := w.Stats()
	if n := st1.Resyncs[resyncRoutes] + st1.Resyncs[resyncLinkRoutes] - st0.Resyncs[resyncRoutes] - st0.Resyncs[resyncLinkRoutes]; n != 0 {
		t.Errorf("%d route re-dumps, want none", n)
	}
}

// TestFakeRouteTables: with Options.RouteTables the watcher dumps each table
// with a strict filter, takes a missing table (ENOENT) as empty, and drops
// other tables' events.
func TestFakeRouteTables(t *testing.T) {
	k, eth := fakeHost(t)
	w, _ := startFake(t, k, Options{RouteTables: []Table{900, 901}})
	waitSynced(t, w, 2*time.Minute)
	var dumps []uint32
	for _, r := range k.Requests() {
		if r.Type == unix.RTM_GETROUTE {
			rt, ok := r.Object.(fakekernel.Route)
			if !ok {
				t.Fatalf("route dump request %+v does not decode", r)
			}
			dumps = append(dumps, rt.Table)
			if r.Errno != 0 && rt.Table != 901 {
				t.Errorf("dump of table %d failed: %v", rt.Table, r.Errno)
			}
		}
	}
	if want := []uint32{900, 901, 900, 901}; !slices.Equal(dumps, want) {
		t.Errorf("route dumps of tables %v, want %v (IPv4 then IPv6)", dumps, want)
	}
	for _, r := range []fakekernel.Route{
		{Table: 901, Dst: netip.MustParsePrefix("10.6.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK},
		{Table: 902, Dst: netip.MustParsePrefix("10.7.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK},
		{Dst: netip.MustParsePrefix("10.8.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK},
	} {
		if err := k.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	want := func() []string {
		var rs []string
		for _, r := range fakeStateOf(k).Routes {
			if strings.Contains(r, " table 900 ") || strings.Contains(r, " table 901 ") {
				rs = append(rs, r)
			}
		}
		return rs
	}()
	deadline := time.After(2 * time.Minute)
	for {
		var got []string
		ch := w.nextChange()
		w.Read(func(v View) { got = fakeStateOfView(v).Routes })
		if slices.Equal(got, want) {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("routes of tables 900 and 901 (-want +got):\n%s", gocmp.Diff(want, got))
		case <-ch:
		}
	}
}

// TestFakeRuleDuplicates: the kernel adds a duplicate for NLM_F_REPLACE on
// rules; the event of an identical rule is resolved by a rule re-dump.
func TestFakeRuleDuplicates(t *testing.T) {
	k, _ := fakeHost(t)
	w, _ := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	c, err := k.DialConn(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := encodeRule(Rule{Family: IPv4, Priority: 900, Table: 900, Action: ActionToTable, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Execute(netlink.Message{Header: netlink.Header{Type: unix.RTM_NEWRULE, Flags: netlink.Request | netlink.Acknowledge | netlink.Create | netlink.Replace}, Data: b}); err != nil {
		t.Fatal(err)
	}
	waitFake(t, w, k, "after a rule replace")
	if n := len(fakeStateOf(k).Rules); n != 8 {
		t.Fatalf("fake kernel has %d rules, want 8 (the replace adds a duplicate)", n)
	}
	if st := w.Stats(); st.Resyncs[resyncRules] != 1 {
		t.Errorf("stats %+v; want one rule re-dump", st)
	}
}

// TestFakeMalformedEvent: an event that does not decode may hide any
// change; it is counted and answered with a full resync.
func TestFakeMalformedEvent(t *testing.T) {
	k, eth := fakeHost(t)
	w, d := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	d.mc().arm(func(m netlink.Message) (netlink.Message, error) {
		m.Data = m.Data[:len(m.Data)-1] // a truncated attribute
		return m, nil
	})
	if err := k.AddRoute(fakekernel.Route{Table: 900, Dst: netip.MustParsePrefix("10.9.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	st := waitStats(t, w, "resync after a malformed event", func(s Stats) bool { return s.Resyncs[resyncRequested] == 1 })
	if st.Malformed != 1 {
		t.Errorf("Malformed = %d, want 1", st.Malformed)
	}
	waitFake(t, w, k, "after the resync")
}

// TestFakeSocketFailure: a receive error other than an overflow or a
// deadline ends the session; the watcher reconnects and resyncs.
func TestFakeSocketFailure(t *testing.T) {
	k, eth := fakeHost(t)
	w, d := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	d.mc().arm(func(netlink.Message) (netlink.Message, error) {
		return netlink.Message{}, &netlink.OpError{Op: "receive", Err: unix.EBADF}
	})
	if err := k.SetLinkMTU(eth, 1400); err != nil {
		t.Fatal(err)
	}
	waitFake(t, w, k, "after the reconnect")
	if st := w.Stats(); st.Reconnects != 1 || st.Resyncs[resyncReconnect] != 1 {
		t.Errorf("stats %+v; want one reconnect and its resync", st)
	}
	if n := d.multicastDials(); n != 2 {
		t.Errorf("multicast sockets dialed: %d, want 2", n)
	}
}

// TestFakeRequestedResync: Resync dumps everything again on a running
// watcher and counts it.
func TestFakeRequestedResync(t *testing.T) {
	k, _ := fakeHost(t)
	w, _ := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	w.Resync()
	waitStats(t, w, "requested resync", func(s Stats) bool { return s.Resyncs[resyncRequested] == 1 })
	waitFake(t, w, k, "after the resync")
}

// TestRunStops: Run returns on cancellation (a minute is only a hang's) wherever it
// is: waiting to reconnect, blocked in a receive, in the middle of a dump.
// It returns errRunning for a second concurrent call.
func TestRunStops(t *testing.T) {
	stop := func(t *testing.T, w *Watcher, cancel context.CancelFunc, done <-chan error) {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(time.Minute): // only a hang: a busy machine under -race takes its time
			t.Errorf("Run did not return within a minute of cancellation; stats %+v", w.Stats())
			<-done
		}
	}
	run := func(t *testing.T, opts Options) (*Watcher, context.CancelFunc, <-chan error) {
		t.Helper()
		w := New(opts)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		return w, cancel, done
	}

	t.Run("backoff", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		d := &fakeDialer{k: fakekernel.New(), fail: errors.New("no kernel today")}
		defer d.k.Close()
		w, cancel, done := run(t, Options{NetNS: fakeNetNS(d), RetryMin: time.Hour, RetryMax: time.Hour})
		waitStats(t, w, "first failure", func(s Stats) bool { return s.Reconnects == 1 })
		if w.synced() {
			t.Errorf("synced without a kernel")
		}
		stop(t, w, cancel, done)
	})
	t.Run("receive", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		k, _ := fakeHost(t)
		w, cancel, done := run(t, Options{NetNS: fakeNetNS(&fakeDialer{k: k})})
		waitSynced(t, w, 2*time.Minute)
		if err := w.Run(context.Background()); !errors.Is(err, errRunning) {
			t.Errorf("second Run: %v, want errRunning", err)
		}
		stop(t, w, cancel, done)
	})
	t.Run("dump", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		k, _ := fakeHost(t)
		k.FailAll(unix.RTM_GETRULE, unix.EBUSY)
		w, cancel, done := run(t, Options{NetNS: fakeNetNS(&fakeDialer{k: k}), RetryMin: time.Millisecond, RetryMax: time.Millisecond})
		waitStats(t, w, "failing dumps", func(s Stats) bool { return s.Reconnects >= 3 })
		stop(t, w, cancel, done)
	})
}

// TestFakeSubscribe: the start view plus the events of a subscription is
// the cache, across events and resyncs; a reader that falls behind is
// told so.
func TestFakeSubscribe(t *testing.T) {
	k, eth := fakeHost(t)
	w, d := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")

	var start Snapshot
	sub := w.Subscribe(1024, func(v View) { start = v.snapshot() })
	defer sub.Close()
	m := newReplay(start)
	for i := range 5 {
		if err := k.AddRoute(fakekernel.Route{Table: 900, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 10, byte(i), 0}), 24), Index: eth, Scope: unix.RT_SCOPE_LINK}); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.AddRule(fakekernel.Rule{Family: unix.AF_INET, Priority: 5, Table: 5}); err != nil {
		t.Fatal(err)
	}
	// Changes the watcher learns from a resync, as differences.
	k.InjectENOBUFS(d.mc().fake)
	waitStats(t, w, "overflow", func(s Stats) bool { return s.Resyncs[resyncOverflow] == 1 })
	if err := k.SetLinkUp(eth, false); err != nil {
		t.Fatal(err)
	}
	if err := k.DelRule(fakekernel.Rule{Family: unix.AF_INET, Priority: 900, Table: 900, Mark: 0xe00, Mask: 0xf00}); err != nil {
		t.Fatal(err)
	}
	waitFake(t, w, k, "after the changes")

	deadline := time.After(2 * time.Minute)
	for {
		var want Snapshot
		w.Read(func(v View) { want = v.snapshot() })
		if diff := gocmp.Diff(stateOf(want), stateOf(m.snapshot())); diff == "" {
			break
		} else {
			select {
			case ev, ok := <-sub.Events():
				if !ok {
					t.Fatalf("subscription ended: %v", sub.Err())
				}
				m.apply(ev)
			case <-deadline:
				t.Fatalf("start view + events != cache (-cache +replay):\n%s", diff)
			}
		}
	}

	// Three events for a subscriber with room for one that reads nothing
	// until the watcher has applied them.
	lag := w.Subscribe(1, nil)
	for i := range 3 {
		if err := k.AddRule(fakekernel.Rule{Family: unix.AF_INET, Priority: uint32(10 + i), Table: 5}); err != nil {
			t.Fatal(err)
		}
	}
	waitFake(t, w, k, "after three rules")
	deadline = time.After(2 * time.Minute)
	for open := true; open; {
		select {
		case _, open = <-lag.Events():
		case <-deadline:
			t.Fatal("lagging subscription never ended")
		}
	}
	if !errors.Is(lag.Err(), ErrLagged) {
		t.Errorf("lagging subscription ended with %v, want ErrLagged", lag.Err())
	}
	sub.Close()
	sub.Close()
	if !errors.Is(sub.Err(), errUnsubscribed) {
		t.Errorf("closed subscription: %v, want errUnsubscribed", sub.Err())
	}
}

// replay rebuilds a cache from a snapshot and events, as a subscriber would.
type replay struct {
	links  map[uint32]Link
	addrs  map[addrKey]Addr
	routes []Route
	rules  []Rule
}

func newReplay(s Snapshot) *replay {
	m := &replay{links: map[uint32]Link{}, addrs: map[addrKey]Addr{}, routes: slices.Clone(s.Routes), rules: slices.Clone(s.Rules)}
	for _, l := range s.Links {
		m.links[l.Index] = l
	}
	for _, a := range s.Addrs {
		m.addrs[a.key()] = a
	}
	return m
}

func (m *replay) apply(ev Event) {
	switch ev.Kind {
	case KindLink:
		delete(m.links, ev.Link.Index)
		if !ev.Deleted {
			m.links[ev.Link.Index] = ev.Link
		}
	case KindAddr:
		delete(m.addrs, ev.Addr.key())
		if !ev.Deleted {
			m.addrs[ev.Addr.key()] = ev.Addr
		}
	case KindRoute:
		// The fake keeps one route per key: new replaces.
		m.routes = slices.DeleteFunc(m.routes, func(r Route) bool { return r.Key() == ev.Route.Key() })
		if !ev.Deleted {
			m.routes = append(m.routes, ev.Route)
		}
	case KindRule:
		if ev.Deleted {
			if i := slices.IndexFunc(m.rules, func(r Rule) bool { return r.Equal(ev.Rule) }); i >= 0 {
				m.rules = slices.Delete(m.rules, i, i+1)
			}
			return
		}
		m.rules = append(m.rules, ev.Rule)
	}
}

func (m *replay) snapshot() Snapshot {
	var s Snapshot
	for _, l := range m.links {
		s.Links = append(s.Links, l)
	}
	for _, a := range m.addrs {
		s.Addrs = append(s.Addrs, a)
	}
	s.Routes = slices.Clone(m.routes)
	s.Rules = slices.Clone(m.rules)
	slices.SortStableFunc(s.Rules, func(a, b Rule) int {
		if a.Family != b.Family {
			return int(a.Family) - int(b.Family)
		}
		return int(a.Priority) - int(b.Priority)
	})
	slices.SortFunc(s.Links, func(a, b Link) int { return int(a.Index) - int(b.Index) })
	return s
}

// TestFakeApply: Apply is idempotent (adding what exists and deleting what
// is gone succeed), stops at the first failure, keeps the errno matchable
// and the kernel's message readable.
func TestFakeApply(t *testing.T) {
	k, eth := fakeHost(t)
	ap, err := DialApplier(fakeNetNS(&fakeDialer{k: k}))
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()
	route := Route{Family: IPv4, Table: 900, Dst: netip.MustParsePrefix("10.20.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"),
		Index: eth, MTU: 1355, Protocol: 77, Type: RouteUnicast}
	rule := Rule{Family: IPv4, Priority: 901, Table: 900, Action: ActionToTable, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77}
	ops := []Op{
		{Kind: RouteReplace, Route: route},
		{Kind: RouteReplace, Route: route},
		{Kind: RuleAdd, Rule: rule},
		{Kind: RuleAdd, Rule: rule},
		{Kind: RuleDelete, Rule: rule},
		{Kind: RuleDelete, Rule: rule},
		{Kind: RouteDelete, Route: route},
		{Kind: RouteDelete, Route: route},
	}
	res, err := ap.Apply(ops)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	for i, r := range res {
		if r.Err != nil || r.Op.Kind != ops[i].Kind {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if want := fakeStateOf(nltestHostOnly(t)).Routes; !slices.Equal(fakeStateOf(k).Routes, want) {
		t.Errorf("routes after add and delete:\n%s", gocmp.Diff(want, fakeStateOf(k).Routes))
	}

	k.FailNext(unix.RTM_NEWRULE, unix.EPERM, 1)
	bad := route
	bad.PrefSrc = netip.MustParseAddr("10.9.9.9") // not an address of the host
	res, err = ap.Apply([]Op{{Kind: RuleAdd, Rule: rule}, {Kind: RouteReplace, Route: route}})
	if !errors.Is(err, unix.EPERM) || !strings.HasPrefix(err.Error(), "netwatch: rule-add rule 901: not fwmark 0xe00/0xf00 lookup 900") {
		t.Errorf("Apply with a refused rule: %v", err)
	}
	if len(res) != 1 || !errors.Is(res[0].Err, unix.EPERM) {
		t.Errorf("results of an Apply that failed at its first operation: %+v, want that one alone", res)
	}
	_, err = ap.Apply([]Op{{Kind: RouteReplace, Route: bad}})
	if !errors.Is(err, unix.EINVAL) || !strings.HasSuffix(err.Error(), "(kernel: Invalid prefsrc address)") {
		t.Errorf("Apply of a route with a foreign prefsrc: %v, want EINVAL with the kernel's message", err)
	}

	split := route
	split.Dst = netip.MustParsePrefix("10.1.0.0/16") // a main-table route's destination
	if _, err := ap.Apply([]Op{{Kind: RouteReplace, Route: split}, {Kind: RuleAdd, Rule: rule}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mark  Mark
		table Table
		mtu   uint32
	}{{0, 900, 1355}, {0xe00, TableMain, 0}} {
		a, err := DialApplier(fakeNetNS(&fakeDialer{k: k}))
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.RouteGet(netip.MustParseAddr("10.1.0.9"), tc.mark)
		a.Close()
		if err != nil {
			t.Fatalf("RouteGet mark %v: %v", tc.mark, err)
		}
		if got.Table != tc.table || got.MTU != tc.mtu {
			t.Errorf("RouteGet 10.1.0.9 mark %v: table %v mtu %d, want table %v mtu %d", tc.mark, got.Table, got.MTU, tc.table, tc.mtu)
		}
	}
}

// nltestHostOnly is fakeHost's kernel, for comparisons with a kernel that
// went through changes and back.
func nltestHostOnly(t *testing.T) *fakekernel.Kernel {
	t.Helper()
	k, _ := fakeHost(t)
	return k
}

// TestFakeBarrier: Barrier returns with the cache holding what came
// before it, and errNotRunning without a session.
func TestFakeBarrier(t *testing.T) {
	k, eth := fakeHost(t)
	ctx := context.Background()
	if err := New(Options{NetNS: fakeNetNS(&fakeDialer{k: k})}).Barrier(ctx); !errors.Is(err, errNotRunning) {
		t.Fatalf("Barrier before Run: %v, want errNotRunning", err)
	}
	w, _ := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	for i := range 100 {
		r := fakekernel.Route{Table: 900, Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 6, byte(i), 0}), 24), Index: eth, Scope: unix.RT_SCOPE_LINK}
		if err := k.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	w.Read(func(v View) {
		for r := range v.Routes(IPv4, 900) {
			if r.Dst.Addr().As4()[1] == 6 {
				n++
			}
		}
	})
	if n != 100 {
		t.Fatalf("%d of the 100 new routes in the cache right after Barrier", n)
	}
}

// TestSubscribeStartMayAsk: Subscribe's start runs under the read lock only:
// it may ask the watcher whether it is synced and for its stats, and
// events made meanwhile are neither lost nor doubled.
func TestSubscribeStartMayAsk(t *testing.T) {
	k, eth := fakeHost(t)
	w, _ := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")
	var routes int
	sub := w.Subscribe(64, func(v View) {
		if !w.synced() || w.Stats().Generation == 0 {
			t.Error("not synced inside start")
		}
		if w.nextChange() == nil { // taking it must not block
			t.Error("no Changed channel")
		}
		routes = v.routeCount(IPv4)
	})
	defer sub.Close()
	if err := k.AddRoute(fakekernel.Route{Table: 900, Dst: netip.MustParsePrefix("10.7.0.0/16"), Index: eth, Scope: unix.RT_SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-sub.Events():
		if ev.Route.Dst != netip.MustParsePrefix("10.7.0.0/16") || routes == 0 {
			t.Errorf("first event %+v after a start view of %d routes", ev, routes)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("no event")
	}
}

// fakeNetNS is a NetNS whose sockets d opens: a fake kernel's.
func fakeNetNS(d rtnl.Dialer) *NetNS { return (*NetNS)(rtnl.FakeNetNS(d)) }
