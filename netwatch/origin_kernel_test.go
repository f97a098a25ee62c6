//go:build linux

package netwatch

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"
)

// batchIP is one long-lived ip(8) process in a namespace that runs the
// commands written to it: a program whose socket outlives each command, so
// that /proc shows who owns the port its requests come from.
type batchIP struct {
	cmd *exec.Cmd
	in  io.WriteCloser
}

func startBatchIP(t *testing.T, ns *testNS) *batchIP {
	t.Helper()
	cmd := exec.Command("ip", "-n", ns.name, "-batch", "-")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &batchIP{cmd, in}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return b
}

func (b *batchIP) run(t *testing.T, line string) {
	t.Helper()
	if _, err := fmt.Fprintln(b.in, line); err != nil {
		t.Fatal(err)
	}
}

// waitEvent reads sub until an event matches, and returns it.
func waitEvent(t *testing.T, sub *Subscription, what string, match func(Event) bool) Event {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for {
		select {
		case ev, ok := <-sub.Events():
			if !ok {
				t.Fatalf("%s: subscription ended: %v", what, sub.Err())
			}
			if match(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("%s: no event within 2 min", what)
		}
	}
}

// TestKernelOrigins checks on the real kernel who each notification says
// made a change. The port in the header of an RTM_NEWROUTE, RTM_DELROUTE,
// RTM_NEWRULE, RTM_DELRULE, RTM_NEWADDR and RTM_DELADDR notification of an
// IPv4 address is the port of the socket whose request caused it, and a
// process's first netlink socket takes the process ID as its port: a
// long-lived ip(8) is named by its command and PID. Link notifications and
// those of IPv6 addresses carry port 0 whoever asked: the kernel's. This
// process's own requests are its own; the IPv4 routes the kernel flushes
// with a link going down have no notification at all, and a re-dump finds
// them gone.
func TestKernelOrigins(t *testing.T) {
	ns := newTestNS(t)
	ns.ip(t, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	ns.ip(t, "link", "set", "eth0", "up")
	ns.ip(t, "link", "set", "eth1", "up")
	ns.ip(t, "addr", "add", "10.0.0.5/24", "dev", "eth0")
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)
	sub := w.Subscribe(4096, nil)
	defer sub.Close()
	ip := startBatchIP(t, ns)
	pid := ip.cmd.Process.Pid
	program := Origin{Kind: OriginProgram, Port: uint32(pid), PID: pid, Comm: "ip"}
	kernel := Origin{Kind: OriginKernel}

	steps := []struct {
		cmd   string
		what  string
		match func(Event) bool
		want  Origin
	}{
		{"route add 10.1.0.0/16 via 10.0.0.1 table 70000", "route added", func(ev Event) bool {
			return ev.Kind == KindRoute && !ev.Deleted && ev.Route.Dst == netip.MustParsePrefix("10.1.0.0/16")
		}, program},
		{"route del 10.1.0.0/16 via 10.0.0.1 table 70000", "route deleted", func(ev Event) bool {
			return ev.Kind == KindRoute && ev.Deleted && ev.Route.Dst == netip.MustParsePrefix("10.1.0.0/16")
		}, program},
		{"route add fd01::/64 dev eth0 table 70000", "IPv6 route added", func(ev Event) bool {
			return ev.Kind == KindRoute && !ev.Deleted && ev.Route.Dst == netip.MustParsePrefix("fd01::/64")
		}, program},
		{"rule add fwmark 0x1 lookup 70000 pref 70", "rule added", func(ev Event) bool {
			return ev.Kind == KindRule && !ev.Deleted && ev.Rule.Priority == 70
		}, program},
		{"rule del pref 70", "rule deleted", func(ev Event) bool {
			return ev.Kind == KindRule && ev.Deleted && ev.Rule.Priority == 70
		}, program},
		{"addr add 10.0.0.6/24 dev eth0", "IPv4 address added", func(ev Event) bool {
			return ev.Kind == KindAddr && !ev.Deleted && ev.Addr.Prefix == netip.MustParsePrefix("10.0.0.6/24")
		}, program},
		{"addr del 10.0.0.6/24 dev eth0", "IPv4 address deleted", func(ev Event) bool {
			return ev.Kind == KindAddr && ev.Deleted && ev.Addr.Prefix == netip.MustParsePrefix("10.0.0.6/24")
		}, program},
		{"addr add fd00::6/64 dev eth0 nodad", "IPv6 address added", func(ev Event) bool {
			return ev.Kind == KindAddr && !ev.Deleted && ev.Addr.Prefix == netip.MustParsePrefix("fd00::6/64")
		}, kernel},
		{"link set eth0 mtu 1400", "link changed", func(ev Event) bool {
			return ev.Kind == KindLink && ev.Link.Name == "eth0" && ev.Link.MTU == 1400
		}, kernel},
	}
	for _, st := range steps {
		ip.run(t, st.cmd)
		if got := waitEvent(t, sub, st.what, st.match).Origin; got != st.want {
			t.Errorf("%s (%q): origin %+v, want %+v", st.what, st.cmd, got, st.want)
		}
	}

	ap, err := DialApplier(fakeNetNS(ns.dialer()))
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()
	self := Origin{Kind: OriginSelf, Port: ap.c.PID(), PID: os.Getpid(), Comm: readComm(os.Getpid())}
	r := Route{Family: IPv4, Table: 900, Dst: netip.MustParsePrefix("10.2.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"),
		Index: ns.linkIndex(t, "eth0"), Protocol: 77, Type: RouteUnicast}
	if _, err := ap.Apply([]Op{{Kind: RouteReplace, Route: r}}); err != nil {
		t.Fatal(err)
	}
	if got := waitEvent(t, sub, "our route", func(ev Event) bool {
		return ev.Kind == KindRoute && !ev.Deleted && ev.Route.Dst == r.Dst
	}).Origin; got != self {
		t.Errorf("our own route: origin %+v, want %+v", got, self)
	}

	// The link goes down: the kernel flushes its IPv4 routes without a
	// word, and the re-dump after the link's event finds them gone.
	ip.run(t, "link set eth0 down")
	if got := waitEvent(t, sub, "the flushed route", func(ev Event) bool {
		return ev.Kind == KindRoute && ev.Deleted && ev.Route.Dst == r.Dst
	}).Origin; got != (Origin{Kind: OriginResync}) {
		t.Errorf("the route flushed with its link: origin %+v, want resync", got)
	}
}
