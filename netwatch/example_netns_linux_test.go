//go:build linux

package netwatch_test

import (
	"context"
	"fmt"
	"time"

	"github.com/marksplit/marksplit/netwatch"
)

// A program that watches a namespace named by a path: /run/netns/NAME
// (ip netns add), /proc/PID/ns/net (a container's), or here the process's
// own, which needs no privilege. The namespace stays open until the
// watcher has stopped: it opens new sockets when it reconnects.
func ExampleOpenNetNS() {
	ns, err := netwatch.OpenNetNS("/proc/self/ns/net")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ns.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := netwatch.New(netwatch.Options{NetNS: ns})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := w.WaitSynced(ctx); err != nil {
		fmt.Println(err)
		return
	}
	w.Read(func(v netwatch.View) {
		lo, ok := v.LinkByName("lo")
		fmt.Println("lo:", ok, lo.Flags&netwatch.LinkLoopback != 0)
	})
	// A path that is not a network namespace fails at once.
	_, err = netwatch.OpenNetNS("/proc/self/ns/pid")
	fmt.Println(err)
	// Output:
	// lo: true true
	// netwatch: /proc/self/ns/pid is a namespace, but not a network namespace
}
