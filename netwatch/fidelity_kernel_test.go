//go:build linux

package netwatch

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// fidelityNS is a namespace with eth0 (10.0.0.5/16, fd00::5/64) and a
// watcher on it.
func fidelityNS(t *testing.T) (*testNS, *Watcher, *Applier) {
	t.Helper()
	ns := newTestNS(t)
	for _, cmd := range [][]string{
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"link", "set", "eth0", "up"},
		{"link", "set", "eth1", "up"},
		{"addr", "add", "10.0.0.5/16", "dev", "eth0"},
		{"addr", "add", "fd00::5/64", "dev", "eth0", "nodad"},
	} {
		ns.ip(t, cmd...)
	}
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)
	a, err := DialApplier(fakeNetNS(ns.dialer()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return ns, w, a
}

// cachedRoute waits until the cache holds a route to dst in table t.
func cachedRoute(t *testing.T, w *Watcher, f Family, table Table, dst string) Route {
	t.Helper()
	var r Route
	deadline := time.Now().Add(2 * time.Minute)
	for ch := w.nextChange(); ; ch = w.nextChange() {
		found := false
		w.Read(func(v View) {
			for x := range v.Routes(f, table) {
				if x.Dst == netip.MustParsePrefix(dst) {
					r, found = x, true
				}
			}
		})
		if found {
			return r
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("route %s table %v not cached", dst, table)
		}
	}
}

var expiresWord = regexp.MustCompile(`expires \d+sec`)

// ipLine is what `ip -d FAMILY route show table T DST` prints, the expiry
// (which counts down) blanked.
func (ns *testNS) ipLine(t *testing.T, args ...string) string {
	t.Helper()
	return textNorm(ns.ip(t, args...))
}

// TestKernelRouteAttributes: a route carrying every attribute ip(8) can
// set is cached with each of them, a replace with the cached route changes
// nothing, and a repair (the route without its MTU, as mtupolicy asks)
// changes only that: `ip -d route` shows the same route without "mtu".
func TestKernelRouteAttributes(t *testing.T) {
	ns, w, a := fidelityNS(t)
	tests := []struct {
		name  string
		fam   Family
		table Table
		dst   string
		add   string // ip route add arguments after the destination
		check func(t *testing.T, r Route)
	}{{
		name: "IPv4, every metric, locks, realm, onlink", fam: IPv4, table: TableMain, dst: "10.1.0.0/16",
		add: "via 10.0.0.1 dev eth0 proto dhcp src 10.0.0.5 metric 1002 onlink realm 7 mtu lock 1355 advmss 1300 " +
			"initcwnd 10 initrwnd 20 rtt 100ms rttvar 20ms quickack 1 congctl reno window 1000 ssthresh 30 cwnd 10 " +
			"reordering 5 hoplimit 9 features ecn rto_min 5ms fastopen_no_cookie 1",
		check: func(t *testing.T, r Route) {
			want := Metrics{Locks: lockMTU | 1<<unix.RTAX_RTO_MIN, Window: 1000, RTT: 800, RTTVar: 80, SSThresh: 30, CWnd: 10,
				AdvMSS: 1300, Reordering: 5, HopLimit: 9, InitCWnd: 10, Features: 1, RTOMin: 5, InitRWnd: 20, QuickAck: 1,
				CongCtl: "reno", FastOpen: 1}
			if diff := gocmp.Diff(want, r.Metrics); diff != "" || r.MTU != 1355 || r.Flow != 7 || r.Flags&RouteOnlink == 0 {
				t.Errorf("cached %+v\nmetrics (-want +got):\n%s", r, diff)
			}
		},
	}, {
		name: "IPv4 tos", fam: IPv4, table: 900, dst: "10.5.0.0/16", add: "tos 0x10 via 10.0.0.1 dev eth0 mtu 1355 table 900",
		check: func(t *testing.T, r Route) {
			if r.TOS != 0x10 || r.MTU != 1355 {
				t.Errorf("cached %+v", r)
			}
		},
	}, {
		name: "IPv4 encapsulation", fam: IPv4, table: 900, dst: "10.6.0.0/16", add: "encap ip id 5 dst 10.0.0.9 dev eth0 mtu 1355 table 900",
		check: func(t *testing.T, r Route) {
			if r.Encap.Type != unix.LWTUNNEL_ENCAP_IP || r.Encap.Data == "" {
				t.Errorf("cached %+v", r)
			}
		},
	}, {
		name: "IPv4 multipath with realms", fam: IPv4, table: 900, dst: "10.8.0.0/16",
		add: "mtu 1355 table 900 nexthop via 10.0.0.1 dev eth0 realm 3 weight 2 nexthop via 10.0.0.2 dev eth0 realm 4",
		check: func(t *testing.T, r Route) {
			if len(r.NextHops) != 2 || r.NextHops[0].Flow != 3 || r.NextHops[1].Flow != 4 || r.NextHops[0].Weight != 2 {
				t.Errorf("cached %+v", r)
			}
		},
	}, {
		name: "IPv6 from a router advertisement: expiry, preference, hop limit", fam: IPv6, table: TableMain, dst: "fd01::/64",
		add: "via fd00::1 dev eth0 proto ra metric 1024 expires 600 mtu 1355 hoplimit 7 pref high",
		check: func(t *testing.T, r Route) {
			if left := time.Until(r.Expires); r.Pref != prefHigh || r.Metrics.HopLimit != 7 || left < 590*time.Second || left > 600*time.Second {
				t.Errorf("cached %+v (expires in %v)", r, left)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fam := "-4"
			if tt.fam == IPv6 {
				fam = "-6"
			}
			ns.ip(t, append([]string{fam, "route", "add", tt.dst}, strings.Fields(tt.add)...)...)
			r := cachedRoute(t, w, tt.fam, tt.table, tt.dst)
			tt.check(t, r)
			show := []string{fam, "-d", "route", "show", "table", itoa(uint32(tt.table)), tt.dst}
			before := ns.ipLine(t, show...)

			// The cached route written back as it is: nothing changes.
			if _, err := a.Apply([]Op{{Kind: RouteReplace, Route: r}}); err != nil {
				t.Fatal(err)
			}
			if after := ns.ipLine(t, show...); after != before {
				t.Errorf("replaced with the cached route:\n got %s\nwant %s", after, before)
			}

			// A repair: the explicit MTU (and its lock) off, the rest kept.
			fix := r
			fix.MTU, fix.Metrics.Locks = 0, r.Metrics.Locks&^lockMTU
			if _, err := a.Apply([]Op{{Kind: RouteReplace, Route: fix, Repair: true}}); err != nil {
				t.Fatal(err)
			}
			want := strings.Replace(strings.Replace(before, " mtu lock 1355", "", 1), " mtu 1355", "", 1)
			if after := ns.ipLine(t, show...); after != want {
				t.Errorf("repaired:\n got %s\nwant %s", after, want)
			}
			got := cachedRoute(t, w, tt.fam, tt.table, tt.dst)
			if !pollFor(func() bool {
				got = cachedRoute(t, w, tt.fam, tt.table, tt.dst)
				return got.Equal(fix)
			}) {
				t.Errorf("cached after the repair:\n got %+v\nwant %+v", got, fix)
			}
		})
	}
}

// TestKernelRuleAttributes: a rule carrying every selector ip(8) can set
// (and FRA_DSCP, which this ip(8) cannot, through Attrs) is cached with
// each of them; deleted with its cached value it goes, and only it; added
// back from the cached value it is the same rule again.
func TestKernelRuleAttributes(t *testing.T) {
	ns, w, a := fidelityNS(t)
	tests := []struct {
		name string
		prio uint32
		add  string // ip rule add arguments
		raw  *Rule  // instead of add: added through the Applier
	}{
		{name: "every selector", prio: 900, add: "not fwmark 0xe00/0xf00 uidrange 100-200 tos 0x10 sport 1000-2000 dport 53 ipproto udp suppress_prefixlength 0 proto 109 iif lo lookup 900"},
		{name: "addresses, realms, goto", prio: 901, add: "from 10.0.0.0/8 to 10.1.0.0/16 realms 3/4 goto 902"},
		{name: "l3mdev", prio: 902, add: "l3mdev"},
		{name: "tunnel id, oif, blackhole", prio: 903, add: "tun_id 7 oif eth0 blackhole"},
		{name: "suppress_ifgroup", prio: 904, add: "suppress_ifgroup 5 lookup 903"},
		{name: "IPv6", prio: 905, add: "-6 from fd00::/64 fwmark 0x1 lookup 905 proto 109"},
		{name: "FRA_DSCP, undecoded", prio: 906, raw: &Rule{Family: IPv4, Priority: 906, Table: 906, Action: ActionToTable,
			Protocol: 109, Attrs: Attrs(appendAttr(nil, 25, []byte{0x2e}))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fam := "-4"
			if tt.raw != nil {
				if _, err := a.Apply([]Op{{Kind: RuleAdd, Rule: *tt.raw}}); err != nil {
					t.Skipf("this kernel refuses FRA_DSCP: %v", err)
				}
			} else {
				args := strings.Fields(tt.add)
				if args[0] == "-6" {
					fam, args = "-6", args[1:]
				}
				ns.ip(t, append([]string{fam, "rule", "add", "pref", itoa(tt.prio)}, args...)...)
			}
			show := []string{fam, "-d", "rule", "show", "pref", itoa(tt.prio)}
			before := ns.ipLine(t, show...)
			var r Rule
			if !pollFor(func() bool {
				found := false
				f := IPv4
				if fam == "-6" {
					f = IPv6
				}
				w.Read(func(v View) {
					for x := range v.Rules(f) {
						if x.Priority == tt.prio {
							r, found = x, true
						}
					}
				})
				return found
			}) {
				t.Fatalf("rule %d not cached", tt.prio)
			}
			// A kernel that knows FRA_DSCP (6.13 and later) reports it and,
			// beside it, its mask (FRA_DSCP_MASK, 30, all bits by default);
			// an older one ignores the attribute it does not know and reports
			// none: the cache holds what the kernel reports, either way.
			if tt.raw != nil {
				reported := kernelRuleHasAttr(t, ns, tt.prio, 25)
				if cached := strings.Contains(attrsText(r.Attrs), "25=2e"); cached != reported {
					t.Errorf("cached %v: FRA_DSCP among the undecoded attributes %v, the kernel reports it %v", r, cached, reported)
				}
				if !reported {
					t.Logf("this kernel ignores FRA_DSCP (before 6.13): the rule was added without it")
				}
			}
			if _, err := a.Apply([]Op{{Kind: RuleDelete, Rule: r}}); err != nil {
				t.Fatal(err)
			}
			if out := ns.ipLine(t, show...); out != "" {
				t.Fatalf("after the delete: %q", out)
			}
			if _, err := a.Apply([]Op{{Kind: RuleAdd, Rule: r}}); err != nil {
				t.Fatal(err)
			}
			if after := ns.ipLine(t, show...); after != before {
				t.Errorf("added back from the cache:\n got %s\nwant %s", after, before)
			}
		})
	}
}

// pollFor calls cond until it is true or 5 seconds have passed.
// kernelRuleHasAttr reports whether the kernel's own dump of the IPv4
// rule at prio holds an attribute of type typ: the oracle for what a
// cache of that rule must keep.
func kernelRuleHasAttr(t *testing.T, ns *testNS, prio uint32, typ uint16) bool {
	t.Helper()
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: ns.fd})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETRULE, Flags: netlink.Request | netlink.Dump},
		Data:   []byte{unix.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	})
	if err != nil {
		t.Fatalf("rule dump: %v", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 12 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[12:])
		if err != nil {
			t.Fatal(err)
		}
		var at bool
		var has bool
		for ad.Next() {
			switch ad.Type() {
			case unix.FRA_PRIORITY:
				at = ad.Uint32() == prio
			case typ:
				has = true
			}
		}
		if at {
			return has
		}
	}
	t.Fatalf("rule %d not in the kernel's dump", prio)
	return false
}

func pollFor(cond func() bool) bool {
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // polling: the kernel has no event for "ip(8) shows it"
	}
	return true
}
