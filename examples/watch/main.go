//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the whole program: 2 for bad flags, 1 when watching fails.
func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.Bool("json", false, "print JSON lines (the state dump of docs/design.md) instead of ip(8)'s words")
	once := fs.Bool("once", false, "print the state after the initial sync and exit")
	netns := fs.String("netns", "", "network namespace to watch, as a path (/run/netns/NAME or /proc/PID/ns/net); default: this process's")
	buf := fs.Int("buffer", 0, "multicast receive buffer in `bytes`; 0 takes netwatch's default (8 MiB)")
	if err := fs.Parse(args); err != nil {
		return 2
	} else if msg := badArgs(fs, *buf); msg != "" {
		fmt.Fprintln(stderr, "watch: "+msg)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	if err := watchNetNS(ctx, *netns, *buf, *once, *jsonOut, stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "watch: %v\n", err)
		return 1
	}
	return 0
}
