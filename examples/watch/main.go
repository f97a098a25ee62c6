//go:build linux

// Command watch is a typed `ip monitor`: it prints a network namespace's
// links, addresses, routes of every table and rules as JSON lines, one
// object per line, after the initial sync; then, unless -once, one line per
// change with "event":"new" or "event":"del".
//
// The lines are the state dump DESIGN.md defines. They equal what
// `ip -j link`, `ip -j addr`, `ip -j route show table all` and `ip -j rule`
// report for the same namespace, which makes watch the way to check the
// netwatch cache against the kernel.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/marksplit/marksplit/netwatch"
	"golang.org/x/sys/unix"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.Bool("json", false, "print JSON lines (the only format so far; kept for the documented command line)")
	once := fs.Bool("once", false, "print the state after the initial sync and exit")
	netns := fs.String("netns", "", "network namespace to watch, as a path (/run/netns/NAME or /proc/PID/ns/net); default: this process's")
	buf := fs.Int("buffer", netwatch.DefaultReadBuffer, "multicast receive buffer in bytes")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	_ = jsonOut
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "watch: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	d := netwatch.KernelDialer{}
	if *netns != "" {
		fd, err := unix.Open(*netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintf(stderr, "watch: open network namespace %s: %v\n", *netns, err)
			return 1
		}
		defer unix.Close(fd)
		d.NetNS = fd
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := watch(ctx, netwatch.New(netwatch.Options{Dialer: d, ReadBuffer: *buf}), *once, stdout); err != nil {
		fmt.Fprintf(stderr, "watch: %v\n", err)
		return 1
	}
	return 0
}

func watch(ctx context.Context, w *netwatch.Watcher, once bool, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	if err := w.WaitSynced(ctx); err != nil {
		return nil // interrupted before the first sync
	}
	bw := bufio.NewWriter(out)
	enc := json.NewEncoder(bw)
	var names map[uint32]string
	var snap netwatch.Snapshot
	sub := w.Subscribe(1<<16, func(v netwatch.View) {
		snap = v.Snapshot()
		names = linkNames(snap.Links)
	})
	defer sub.Close()
	for _, ev := range events(snap) {
		if err := enc.Encode(line(ev, "", names)); err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil || once {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-sub.Events():
			if !ok {
				return sub.Err()
			}
			if ev.Kind == netwatch.KindLink {
				if ev.Op == netwatch.EventDel {
					delete(names, ev.Link.Index)
				} else {
					names[ev.Link.Index] = ev.Link.Name
				}
			}
			if err := enc.Encode(eventLine(ev, names)); err != nil {
				return err
			}
			if len(sub.Events()) == 0 {
				if err := bw.Flush(); err != nil {
					return err
				}
			}
		}
	}
}

func linkNames(ls []netwatch.Link) map[uint32]string {
	m := make(map[uint32]string, len(ls))
	for _, l := range ls {
		m[l.Index] = l.Name
	}
	return m
}

// events lists a snapshot's objects: links, addresses, routes, rules.
func events(s netwatch.Snapshot) []netwatch.Event {
	var evs []netwatch.Event
	for _, l := range s.Links {
		evs = append(evs, netwatch.Event{Kind: netwatch.KindLink, Link: l})
	}
	for _, a := range s.Addrs {
		evs = append(evs, netwatch.Event{Kind: netwatch.KindAddr, Addr: a})
	}
	for _, r := range s.Routes {
		evs = append(evs, netwatch.Event{Kind: netwatch.KindRoute, Route: r})
	}
	for _, r := range s.Rules {
		evs = append(evs, netwatch.Event{Kind: netwatch.KindRule, Rule: r})
	}
	return evs
}
