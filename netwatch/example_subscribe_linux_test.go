//go:build linux

package netwatch_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// subscribe starts a subscription, with the link names of the view the
// first event follows.
func subscribe(w *netwatch.Watcher) (*netwatch.Subscription, map[uint32]string) {
	names := map[uint32]string{}
	sub := w.Subscribe(1024, func(v netwatch.View) {
		for l := range v.Links() {
			names[l.Index] = l.Name
		}
	})
	return sub, names
}

// printChanges is a Subscribe consumer, the core of a typed `ip monitor`:
// it prints each change with who made it, until n have come or the
// subscription ends. The link events keep the names up to date.
func printChanges(sub *netwatch.Subscription, names map[uint32]string, n int) error {
	defer sub.Close()
	links := func(i uint32) (netwatch.Link, bool) { return netwatch.Link{Index: i, Name: names[i]}, names[i] != "" }
	for ev := range sub.Events() {
		verb := "new"
		if ev.Deleted {
			verb = "del"
		}
		switch ev.Kind {
		case netwatch.KindLink:
			names[ev.Link.Index] = ev.Link.Name
			fmt.Printf("%s link %s %v (%v)\n", verb, ev.Link.Name, ev.Link.Flags, ev.Origin.Kind)
		case netwatch.KindRoute:
			fmt.Printf("%s route %s (%v)\n", verb, ev.Route.Describe(links), ev.Origin.Kind)
		default:
			fmt.Printf("%s %v (%v)\n", verb, ev.Kind, ev.Origin.Kind)
		}
		if n--; n == 0 {
			return nil
		}
	}
	return sub.Err()
}

// A consumer of every change, with its origin. Here the watcher runs on
// netwatch/netwatchtest's fake kernel, so that the example's changes are the
// same on every machine; a program leaves Options.NetNS nil. Another
// program adds a route; then the link goes down: the kernel announces
// the link, flushes the link's IPv4 routes without a word, and the
// watcher's re-dump reports the route gone, as its finding.
func ExampleWatcher_Subscribe() {
	k := netwatchtest.New()
	defer k.Close()
	eth0 := k.AddLink("eth0", "veth", 1500, true)
	if err := k.AddAddr(eth0, netip.MustParsePrefix("192.0.2.10/24")); err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := netwatch.New(netwatch.Options{NetNS: k.NetNS()})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	if err := w.WaitSynced(ctx); err != nil {
		fmt.Println(err)
		return
	}
	sub, names := subscribe(w)
	printed := make(chan error, 1)
	go func() { printed <- printChanges(sub, names, 3) }()

	prog, err := k.DialProgram()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer prog.Close()
	if err := prog.AddRoute(netwatch.Route{Family: netwatch.IPv4, Table: 900, Dst: netip.MustParsePrefix("198.51.100.0/24"),
		Gateway: netip.MustParseAddr("192.0.2.1"), Index: eth0, Protocol: netwatch.ProtoStatic, Type: netwatch.RouteUnicast}); err != nil {
		fmt.Println(err)
		return
	}
	if err := k.SetLinkUp(eth0, false); err != nil {
		fmt.Println(err)
		return
	}
	if err := <-printed; err != nil {
		fmt.Println(err)
	}
	cancel()
	<-done
	// Output:
	// new route 198.51.100.0/24 via 192.0.2.1 dev eth0 table 900 proto static (program)
	// new link eth0 BROADCAST,MULTICAST (kernel)
	// del route 198.51.100.0/24 via 192.0.2.1 dev eth0 table 900 proto static (resync)
}
