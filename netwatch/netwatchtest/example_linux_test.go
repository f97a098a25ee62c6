//go:build linux

package netwatchtest_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	"golang.org/x/sys/unix"
)

// viaEth1 is the policy under test: packets marked 0x100/0xff00 leave by
// eth1's default gateway. It owns table 920 and rule priority 920.
func viaEth1(v netwatch.View) (reconcile.Desired, bool) {
	d := reconcile.Desired{Own: reconcile.Own(920, 920), Routes: new(netwatch.RouteSet)}
	eth1, ok := v.LinkByName("eth1")
	if !ok || eth1.Flags&netwatch.LinkUp == 0 {
		d.Notes = []string{"eth1 is missing or down"}
		return d, true
	}
	for _, def := range v.DefaultRoutes(netwatch.IPv4, netwatch.TableMain, eth1.Index) {
		hop, _ := def.PathOut(eth1.Index)
		d.Routes.Add(netwatch.Route{Family: netwatch.IPv4, Table: 920, Dst: def.Dst,
			Gateway: hop.Gateway, Index: eth1.Index, Protocol: 242, Type: netwatch.RouteUnicast})
		d.Rules = append(d.Rules, netwatch.Rule{Family: netwatch.IPv4, Priority: 920, Table: 920,
			Action: netwatch.ActionToTable, Mark: 0x100, Mask: 0xff00, Protocol: 242})
		break // the lowest metric
	}
	return d, true
}

// A policy's loop tested on the fake kernel: the world is built with the
// Kernel's Go API, a Watcher and an Applier are put on it with its NetNS,
// and the Reconciler runs as it does in the program. A change the kernel
// makes without an event (the IPv4 flush when a link goes down) and the
// faults a real kernel cannot be made to produce on demand (FailNext,
// Overflow, SetDumpIntr) are one call each.
func Example() {
	k := netwatchtest.New()
	defer k.Close()
	eth1 := k.AddLink("eth1", "veth", 1500, true)
	k.AddAddr(eth1, netip.MustParsePrefix("192.0.2.10/24"))
	k.AddRoute(netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("0.0.0.0/0"),
		Gateway: netip.MustParseAddr("192.0.2.1"), Index: eth1, Type: netwatch.RouteUnicast})
	k.FailNext(unix.RTM_NEWROUTE, unix.EPERM, 1) // the first install is refused, and retried

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := netwatch.New(netwatch.Options{NetNS: k.NetNS(), RetryMin: time.Millisecond})
	go w.Run(ctx)
	a, err := netwatch.DialApplier(k.NetNS())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	passes := make(chan reconcile.Pass, 8)
	r := &reconcile.Reconciler{Watcher: w, Applier: a, Policy: viaEth1, RetryMin: time.Millisecond,
		OnPass: func(p reconcile.Pass) { passes <- p }}
	go r.Run(ctx)

	// Wait for the pass that converges, then read the result back.
	timeout := time.After(2 * time.Minute)
	for !r.Converged() {
		select {
		case p := <-passes:
			if p.Err != nil {
				fmt.Println("pass failed:", p.Err)
			}
		case <-timeout:
			fmt.Println("not converged")
			return
		}
	}
	w.Read(func(v netwatch.View) {
		for rt := range v.Routes(netwatch.IPv4, 920) {
			fmt.Println(rt.Describe(v.Link))
		}
		for ru := range v.Rules(netwatch.IPv4) {
			if ru.Priority == 920 {
				fmt.Println(ru)
			}
		}
	})
	// Output:
	// pass failed: netwatch: route-replace inet route default via 192.0.2.1 dev if2 table 920 proto 242: operation not permitted (kernel: netwatchtest: injected fault)
	// default via 192.0.2.1 dev eth1 table 920 proto 242
	// 920:	from all fwmark 0x100/0xff00 lookup 920 proto 242
}
