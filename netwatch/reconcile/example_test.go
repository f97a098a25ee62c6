package reconcile_test

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// pin is a policy: packets marked 0x100/0xff00 leave by eth1, through its
// default gateway, in both families. It owns table 920 and rule priority
// 920; what it wants is a pure function of the view.
func pin(v netwatch.View) reconcile.Desired {
	d := reconcile.Desired{Own: reconcile.Own(920, 920), Routes: new(netwatch.RouteSet)}
	eth1, ok := v.LinkByName("eth1")
	if !ok || eth1.Flags&netwatch.LinkUp == 0 {
		// Nothing wanted: Plan removes everything owned; the note says why.
		d.Notes = []string{"eth1 is missing or down"}
		return d
	}
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		defaults := v.DefaultRoutes(f, netwatch.TableMain, eth1.Index) // lowest metric first
		if len(defaults) == 0 {
			continue
		}
		hop, _ := defaults[0].PathOut(eth1.Index)
		r := netwatch.Route{Family: f, Table: 920, Dst: defaults[0].Dst, Gateway: hop.Gateway, Index: eth1.Index,
			Protocol: 242, Type: netwatch.RouteUnicast} // metric 0: IPv6's is the kernel's 1024
		if srcs := v.SourceAddrs(eth1.Index, f); len(srcs) > 0 {
			r.PrefSrc = srcs[0].Prefix.Addr() // usable, global and primary first
		}
		d.Routes.Add(r)
		d.Rules = append(d.Rules, netwatch.Rule{Family: f, Priority: 920, Table: 920, Action: netwatch.ActionToTable,
			Mark: 0x100, Mask: 0xff00, Protocol: 242})
	}
	return d
}

// applied is s after the kernel carried out op.
func applied(s netwatch.Snapshot, op netwatch.Op) netwatch.Snapshot {
	routes := slices.DeleteFunc(slices.Clone(s.Routes), func(r netwatch.Route) bool { return r.Key() == op.Route.Key() })
	rules := slices.DeleteFunc(slices.Clone(s.Rules), func(r netwatch.Rule) bool { return r == op.Rule })
	switch op.Kind {
	case netwatch.RouteReplace:
		routes = append(routes, op.Route)
	case netwatch.RuleAdd:
		rules = append(rules, op.Rule)
	}
	if op.Kind == netwatch.RouteReplace || op.Kind == netwatch.RouteDelete {
		s.Routes = routes
	} else {
		s.Rules = rules
	}
	return s
}

// A policy maps a View to a Desired state and Plan diffs the two, make
// before break. A program reads the view with Watcher.Read and a
// Reconciler applies the operations; here the views are Snapshots: eth1
// with a gateway of each family, then the IPv4 gateway renumbered, then
// eth1 gone.
func Example() {
	up := netwatch.LinkUp | netwatch.LinkLowerUp
	eth1 := netwatch.Link{Index: 3, Name: "eth1", MTU: 1500, Flags: up}
	main := func(dst, gw string, metric uint32) netwatch.Route {
		p := netip.MustParsePrefix(dst)
		return netwatch.Route{Family: netwatch.FamilyOf(p.Addr()), Table: netwatch.TableMain, Dst: p,
			Gateway: netip.MustParseAddr(gw), Index: 3, Metric: metric, Protocol: netwatch.ProtoDHCP, Type: netwatch.RouteUnicast}
	}
	world := netwatch.Snapshot{
		Links: []netwatch.Link{eth1},
		Addrs: []netwatch.Addr{
			{Index: 3, Prefix: netip.MustParsePrefix("192.0.2.10/24")},
			{Index: 3, Prefix: netip.MustParsePrefix("2001:db8::10/64"), Flags: netwatch.AddrTentative}, // not usable yet
			{Index: 3, Prefix: netip.MustParsePrefix("2001:db8::11/64")},
		},
		Routes: []netwatch.Route{main("0.0.0.0/0", "192.0.2.1", 100), main("0.0.0.0/0", "192.0.2.254", 200), main("::/0", "fe80::1", 1024)},
	}
	step := func(name string) {
		v := world.View()
		d := pin(v)
		ops, err := reconcile.Plan(v, d)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: %q\n", name, d.Notes)
		for _, op := range ops {
			fmt.Println(" ", op.Describe(v.Link))
			world = applied(world, op)
		}
	}
	step("eth1 up")
	world.Routes[0].Gateway = netip.MustParseAddr("192.0.2.2") // the DHCP lease renumbers
	step("new gateway")
	world.Links = nil
	step("eth1 gone")
	// Output:
	// eth1 up: []
	//   table 920: default via 192.0.2.1 dev eth1 src 192.0.2.10
	//   table 920: default via fe80::1 dev eth1 src 2001:db8::11 metric 1024
	//   rule 920: fwmark 0x100/0xff00 lookup 920
	//   rule 920 (inet6): fwmark 0x100/0xff00 lookup 920
	// new gateway: []
	//   table 920: default via 192.0.2.2 dev eth1 src 192.0.2.10 (was default via 192.0.2.1 dev eth1 src 192.0.2.10)
	// eth1 gone: ["eth1 is missing or down"]
	//   rule 920: removed fwmark 0x100/0xff00 lookup 920 proto 242
	//   rule 920 (inet6): removed fwmark 0x100/0xff00 lookup 920 proto 242
	//   table 920: removed default via 192.0.2.2 dev if3 proto 242 src 192.0.2.10
	//   table 920: removed default via fe80::1 dev if3 proto 242 src 2001:db8::11 metric 1024
}
