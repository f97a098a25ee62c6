//go:build linux

package netwatch

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ipLines is what ip prints for args, a line per object: continuation
// lines (a multipath route's next hops) joined to theirs, spaces
// collapsed, the expiry (which counts down) blanked.
func (ns *testNS) ipLines(t *testing.T, args ...string) []string {
	t.Helper()
	out := strings.ReplaceAll(ns.ip(t, args...), "\n\t", " ")
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = textNorm(l); l != "" {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return lines
}

var attrsWord = regexp.MustCompile(` attrs \S+`)

func textNorm(s string) string {
	return expiresWord.ReplaceAllString(strings.Join(strings.Fields(s), " "), "expires Nsec")
}

// TestKernelText: every route and rule of a namespace with routes and rules
// of every attribute ip(8) can set, the kernel's own among them (local,
// broadcast, multicast, IPv6 link-local), prints as `ip route show table
// all` and `ip rule show` print it, with link names.
func TestKernelText(t *testing.T) {
	ns, w, _ := fidelityNS(t)
	for _, cmd := range []string{
		"route add 10.1.0.0/16 via 10.0.0.1 dev eth0 table 900 proto 77 src 10.0.0.5 metric 5 onlink realm 5 mtu lock 1355 advmss 1300",
		"route add 10.2.0.1 tos 0x10 dev eth0 table 900 scope link",
		"route add blackhole 10.3.0.0/24 table 900",
		"route add unreachable 10.3.1.0/24 table 900 metric 7",
		"route add prohibit 10.3.2.0/24 table 900",
		"route add throw 10.3.3.0/24 table 900",
		"route add default via 10.0.0.1 dev eth0 proto dhcp metric 100",
		"route add 10.4.0.0/16 table 900 nexthop via 10.0.0.1 dev eth0 weight 2 nexthop via 10.0.0.2 dev eth0",
		"route add 10.9.0.0/16 via 10.0.0.1 dev eth0 proto static initcwnd 10 initrwnd 20 rtt 100ms rttvar 20ms window 1000 hoplimit 9 quickack 1 congctl reno",
		"-6 route add fd01::/64 via fd00::1 dev eth0 table 900 mtu 1355 pref high expires 300",
		"-6 route add fd02::/64 from fd00::/64 via fd00::1 dev eth0 metric 7",
		"-6 route add default via fd00::1 dev eth0 proto ra metric 1024 pref low",
		"rule add not fwmark 0xe00/0xf00 lookup 900 pref 900 proto 77",
		"-6 rule add not fwmark 0xe00/0xf00 lookup 900 pref 900 proto 77",
		"rule add from 192.0.2.10 to 10.0.0.0/8 iif eth0 oif eth1 tos 0x10 ipproto tcp sport 1000-2000 dport 80 uidrange 100-200 lookup 901 pref 901 suppress_prefixlength 0",
		"rule add fwmark 0x100 lookup main pref 902 suppress_ifgroup 5",
		"rule add from 10.0.0.0/16 goto 32766 pref 903",
		"rule add from all blackhole pref 904",
		"-6 rule add from fd00::1 to fd01::/64 lookup 901 pref 901",
	} {
		ns.ip(t, strings.Fields(cmd)...)
	}
	// ip is asked again on each try: the kernel may still add a route of
	// its own (an IPv6 address's, once its duplicate detection ends).
	var wantRoutes, wantRules, gotRoutes, gotRules []string
	deadline := time.Now().Add(2 * time.Minute)
	for ch := w.nextChange(); ; ch = w.nextChange() {
		wantRoutes = slices.Concat(ns.ipLines(t, "-4", "route", "show", "table", "all"), ns.ipLines(t, "-6", "route", "show", "table", "all"))
		wantRules = slices.Concat(ns.ipLines(t, "-4", "rule", "show"), ns.ipLines(t, "-6", "rule", "show"))
		slices.Sort(wantRoutes)
		slices.Sort(wantRules)
		gotRoutes, gotRules = nil, nil
		w.Read(func(v View) {
			snap := v.snapshot()
			for _, r := range snap.Routes {
				gotRoutes = append(gotRoutes, textNorm(r.Describe(v.Link)))
			}
			for _, r := range snap.Rules {
				// The kernel reports attributes iproute2 6.1 does not
				// know (FRA_DPORT_MASK beside a dport): netwatch prints
				// them as "attrs TYPE=HEX", ip not at all.
				gotRules = append(gotRules, textNorm(attrsWord.ReplaceAllString(r.String(), "")))
			}
		})
		slices.Sort(gotRoutes)
		slices.Sort(gotRules)
		if len(gotRoutes) == len(wantRoutes) && len(gotRules) == len(wantRules) {
			break
		}
		select {
		case <-ch:
		case <-time.After(100 * time.Millisecond): // ask ip again
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cache holds %d routes and %d rules, ip shows %d and %d", len(gotRoutes), len(gotRules), len(wantRoutes), len(wantRules))
		}
	}
	if diff := gocmp.Diff(wantRoutes, gotRoutes); diff != "" {
		t.Errorf("routes: Route.Describe differs from `ip route show table all` (-ip +netwatch):\n%s", diff)
	}
	if diff := gocmp.Diff(wantRules, gotRules); diff != "" {
		t.Errorf("rules: Rule.String differs from `ip rule show` (-ip +netwatch):\n%s", diff)
	}
}

// TestKernelLinkMTUChange: a link's MTU going down and up changes the MTU
// of the IPv6 routes through it without an event, and of no IPv4 route;
// after each change the cache equals what ip(8) shows, and only the
// link's routes were dumped again, never a whole family, so that a program
// toggling an MTU costs no dump of a large IPv4 table. Each link event
// the kernel sent costs at most two link-routes re-dumps: one at once and
// one recheckDelay later; on a slow machine (an emulated guest of make
// test-kernels) that later one lands within the same change, on a fast
// one in the next, so they are counted over the whole test.
func TestKernelLinkMTUChange(t *testing.T) {
	ns, w, _ := fidelityNS(t)
	for _, cmd := range []string{
		"route add 10.7.0.0/16 via 10.0.0.1 dev eth0 table 900 mtu 1400",
		"route add 10.8.0.0/16 via 10.0.0.1 dev eth0 table 900",
		"-6 route add fd07::/64 via fd00::1 dev eth0 table 900 mtu 1400",
		"-6 route add fd08::/64 via fd00::1 dev eth0 table 900",
	} {
		ns.ip(t, strings.Fields(cmd)...)
	}
	cacheText := func() []string {
		var got []string
		w.Read(func(v View) {
			for _, r := range v.snapshot().Routes {
				got = append(got, textNorm(r.Describe(v.Link)))
			}
		})
		slices.Sort(got)
		return got
	}
	events := linkEvents(t, ns)
	start := w.Stats().Resyncs
	var announced uint64
	for i, mtu := range []string{"1300", "1500", "1280", "1500"} {
		before := w.Stats().Resyncs
		ns.ip(t, "link", "set", "eth0", "mtu", mtu)
		announced += uint64(events())
		// ip is read again on each try: the kernel may change more than
		// the MTU meanwhile (a slow guest's link-local addresses finish
		// DAD and get their local routes), and the cache must follow it.
		var diff string
		if !pollFor(func() bool {
			want := slices.Concat(ns.ipLines(t, "-4", "route", "show", "table", "all"), ns.ipLines(t, "-6", "route", "show", "table", "all"))
			slices.Sort(want)
			diff = gocmp.Diff(want, cacheText())
			return diff == ""
		}) {
			t.Fatalf("mtu %s: the cache differs from ip (-ip +netwatch):\n%s", mtu, diff)
		}
		after := w.Stats().Resyncs
		if n := after["link-routes"] - before["link-routes"]; n < 1 || after["routes"] != before["routes"] {
			t.Errorf("change %d (mtu %s): %d link-routes and %d whole-family re-dumps, want at least 1 and 0",
				i, mtu, n, after["routes"]-before["routes"])
		}
	}
	if n := w.Stats().Resyncs["link-routes"] - start["link-routes"]; n > 2*announced {
		t.Errorf("%d link-routes re-dumps for %d link events, want at most 2 each", n, announced)
	}
}

// linkEvents subscribes to ns's link events; the function it returns
// counts those queued since its last call (the kernel queues them before
// the request that caused them returns).
func linkEvents(t *testing.T, ns *testNS) func() int {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: ns.fd, Groups: unix.RTMGRP_LINK})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return func() int {
		n := 0
		for {
			if err := c.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			msgs, err := c.Receive()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return n
			}
			if err != nil {
				t.Fatalf("link events: %v", err)
			}
			for _, m := range msgs {
				if m.Header.Type == unix.RTM_NEWLINK {
					n++
				}
			}
		}
	}
}
