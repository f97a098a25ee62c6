//go:build linux

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"

	"github.com/marksplit/marksplit/netwatch"
)

// badArgs says what is wrong with the command line that flag does not
// check, or "".
func badArgs(fs *flag.FlagSet, buf int) string {
	switch {
	case fs.NArg() > 0:
		return fmt.Sprintf("unexpected argument %q", fs.Arg(0))
	case buf < 0:
		return fmt.Sprintf("-buffer %d: want a number of bytes, or 0 for the default", buf)
	}
	return ""
}

// watchNetNS watches the network namespace at path ("" for this
// process's) with a receive buffer of buf bytes (0 for the default) until
// ctx ends. The watcher's warnings (an overflow and the resync after it, a
// reconnect) go to stderr.
func watchNetNS(ctx context.Context, path string, buf int, once, jsonOut bool, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opts := netwatch.Options{ReadBuffer: buf, Logger: log}
	if path != "" {
		ns, err := netwatch.OpenNetNS(path)
		if err != nil {
			return err
		}
		defer ns.Close()
		opts.NetNS = ns
	}
	return watch(ctx, netwatch.New(opts), once, jsonOut, stdout)
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
