//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"golang.org/x/sys/unix"
)

// linkChanges is how many changes (up, down) of the spare link each size
// measures, and linkPace the time between them.
const (
	linkChanges = 40
	linkPace    = 50 * time.Millisecond
)

// linkResult is what an unrelated link's changes cost netwatch at one
// table size.
type linkResult struct {
	N           int
	Changes     int
	CPUNS       int64  // the watcher process's CPU over the changes and a second after
	FullRedumps uint64 // Resyncs[routes]
	LinkRedumps uint64 // Resyncs[link-routes]
}

// linkCost runs a netwatch watcher in a fresh process in the node
// namespace and changes a spare veth (its peer up, so each up brings
// carrier and IPv6's link-local address) linkChanges times.
func linkCost(self string, t *topo, n, total int) (linkResult, error) {
	res := linkResult{N: n, Changes: linkChanges}
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	ip := func(args ...string) error {
		if out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + t.node.Path(), "ip"}, args...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
		return nil
	}
	if err := ip("link", "add", "spare0", "type", "veth", "peer", "name", "spare1"); err != nil {
		return res, err
	}
	// The link goes away after, and the routes IPv6 gave it with it: the
	// next measurement finds the table as it was.
	defer ip("link", "del", "spare0")
	if err := ip("link", "set", "spare1", "up"); err != nil {
		return res, err
	}
	cmd := t.node.command(ctx, self, "-child", "links", "-expect", strconv.Itoa(total))
	c, err := startReady(cmd, "the watcher")
	if err != nil {
		return res, err
	}
	defer c.close()
	for i := range linkChanges {
		state := "up"
		if i%2 == 1 {
			state = "down"
		}
		if err := ip("link", "set", "spare0", state); err != nil {
			return res, err
		}
		time.Sleep(linkPace)
	}
	time.Sleep(time.Second) // what the last change costs after it
	err = c.result("done", &res)
	res.N, res.Changes = n, linkChanges
	return res, err
}

// childLinks syncs a watcher, says "ready", and at "done" prints its CPU
// and re-dumps since.
func childLinks(expect int) (linkResult, error) {
	var res linkResult
	w := netwatch.New(netwatch.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Minute)
	defer wcancel()
	if err := w.WaitSynced(wctx); err != nil {
		return res, err
	}
	var routes int
	w.Read(func(v netwatch.View) { routes = routeCount(v) })
	if routes < expect {
		return res, fmt.Errorf("netwatch synced %d routes, want %d", routes, expect)
	}
	st0 := w.Stats()
	var ru0, ru1 unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru0)
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "done" {
		return res, errors.New("no done")
	}
	unix.Getrusage(unix.RUSAGE_SELF, &ru1)
	st1 := w.Stats()
	res.CPUNS = ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano()
	res.FullRedumps = st1.Resyncs["routes"] - st0.Resyncs["routes"]
	res.LinkRedumps = st1.Resyncs["link-routes"] - st0.Resyncs["link-routes"]
	return res, nil
}
