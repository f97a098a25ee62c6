//go:build linux

// Command watch is a typed `ip monitor`: it prints a network namespace's
// links, addresses, routes of every table and rules, one object per line,
// after the initial sync; then, unless -once, one line per change, saying
// whether the object is new or gone and who changed it.
//
// With -json the lines are the state dump docs/design.md defines: JSON
// objects that equal what `ip -j -d link`, `ip -j addr`, `ip -j -d route
// show table all` and `ip -j -d rule` report for the same namespace, every
// attribute included, which makes watch the way to check the netwatch cache
// against the kernel. Without -json they are ip(8)'s words.
//
// A receive buffer overflow, after which the cache is read again, is
// reported on standard error.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"github.com/marksplit/marksplit/netwatch"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.Bool("json", false, "print JSON lines (the state dump of docs/design.md) instead of ip(8)'s words")
	once := fs.Bool("once", false, "print the state after the initial sync and exit")
	netns := fs.String("netns", "", "network namespace to watch, as a path (/run/netns/NAME or /proc/PID/ns/net); default: this process's")
	buf := fs.Int("buffer", 0, "multicast receive buffer in `bytes`; 0 takes netwatch's default (8 MiB)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "watch: unexpected argument %q\n", fs.Arg(0))
		return 2
	case *buf < 0:
		fmt.Fprintf(stderr, "watch: -buffer %d: want a number of bytes, or 0 for the default\n", *buf)
		return 2
	}
	// The watcher's warnings (an overflow and the resync after it, a
	// reconnect) go to standard error.
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := netwatch.Options{ReadBuffer: *buf, Logger: log}
	if *netns != "" {
		ns, err := netwatch.OpenNetNS(*netns)
		if err != nil {
			fmt.Fprintf(stderr, "watch: %v\n", err)
			return 1
		}
		defer ns.Close()
		opts.NetNS = ns
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	w := netwatch.New(opts)
	if err := watch(ctx, w, *once, *jsonOut, stdout); err != nil {
		fmt.Fprintf(stderr, "watch: %v\n", err)
		return 1
	}
	return 0
}

func watch(ctx context.Context, w *netwatch.Watcher, once, jsonOut bool, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	if err := w.WaitSynced(ctx); err != nil {
		return nil // interrupted before the first sync
	}
	bw := bufio.NewWriter(out)
	enc := json.NewEncoder(bw)
	print := func(ev netwatch.Event, event bool, names map[uint32]string) error {
		if !jsonOut {
			_, err := fmt.Fprintln(bw, textLine(ev, event, names))
			return err
		}
		if event {
			return enc.Encode(eventLine(ev, names))
		}
		return enc.Encode(line(ev, "", names))
	}
	// The state, written while the subscription holds its first event:
	// the events that follow it are the changes after it.
	var names map[uint32]string
	var dumpErr error
	sub := w.Subscribe(1<<16, func(v netwatch.View) {
		names = make(map[uint32]string)
		for l := range v.Links() {
			names[l.Index] = l.Name
		}
		dumpErr = newDumper(bw, jsonOut, names).dump(v)
	})
	defer sub.Close()
	if dumpErr != nil {
		return dumpErr
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
				if ev.Deleted {
					delete(names, ev.Link.Index)
				} else {
					names[ev.Link.Index] = ev.Link.Name
				}
			}
			if err := print(ev, true, names); err != nil {
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

// textLine is one object in ip(8)'s words; an event says new or del and
// who made it.
func textLine(ev netwatch.Event, event bool, names map[uint32]string) string {
	links := func(i uint32) (netwatch.Link, bool) {
		n, ok := names[i]
		return netwatch.Link{Index: i, Name: n}, ok
	}
	var s string
	switch ev.Kind {
	case netwatch.KindLink:
		l := ev.Link
		state := "down"
		if l.Flags&netwatch.LinkUp != 0 {
			state = "up"
		}
		s = fmt.Sprintf("link %d %s mtu %d %s", l.Index, l.Name, l.MTU, state)
	case netwatch.KindAddr:
		s = fmt.Sprintf("addr %s dev %s", ev.Addr.Prefix, names[ev.Addr.Index])
		if ev.Addr.Peer.IsValid() {
			s += " peer " + ev.Addr.Peer.String()
		}
	case netwatch.KindRoute:
		s = "route table " + ev.Route.Table.String() + ": " + ev.Route.Describe(links)
	default:
		s = "rule " + ev.Rule.String()
		if ev.Rule.Family == netwatch.IPv6 {
			s = "rule (inet6) " + ev.Rule.String()
		}
	}
	if event {
		s = verb(ev) + " " + s + " (" + ev.Origin.String() + ")"
	}
	return terminalSafe(s)
}

// terminalSafe returns s with every character a terminal would act on
// written as a Go escape: C0 and C1 controls (ESC as \x1b, BEL as \a),
// DEL, other non-printable runes (\u200b) and bytes that are not UTF-8
// (\xff); a backslash is doubled, so that the escapes are unambiguous. A
// link or program name the kernel accepts can thus not move the cursor,
// ring the bell or retitle the window; ordinary text is unchanged. (JSON
// lines escape control characters already.)
func terminalSafe(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == '\\' || r == utf8.RuneError || !unicode.IsPrint(r) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case unicode.IsPrint(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
