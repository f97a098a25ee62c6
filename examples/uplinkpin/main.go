//go:build linux

// Command uplinkpin makes packets that carry a mark leave by a chosen
// uplink, through that uplink's current gateway:
//
//	ip route replace default via GATEWAY dev eth1 table 920 proto 242
//	ip rule add fwmark 0x100/0xff00 lookup 920 pref 920 proto 242
//
// The gateway is learned, per family, from the main table's default route
// out of the uplink (the one a DHCP client or router advertisements
// install; the lowest metric when there are several), so the table follows
// a DHCP renew that changes it. While the uplink is down, has no carrier,
// or has no such default route, the family's route and rule are removed
// and marked packets follow the main table.
//
// uplinkpin owns its table and its rule priority, in both families, and
// nothing else. It leaves its routes in place when it stops; remove them
// with `ip route flush table 920; ip -6 route flush table 920;
// ip rule del pref 920; ip -6 rule del pref 920`.
//
// It is an example of a policy embedding netwatch: watcher → on each
// change, Read → Config.Desired → netwatch.Plan → Applier.Apply.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/netwatch"
	"golang.org/x/sys/unix"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	cancel()
	os.Exit(code)
}

// run is the whole program: it returns the exit code, 0 when ctx ends,
// 2 for bad flags, 1 when it cannot start.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	o, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "uplinkpin: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	// The watcher's own lines (resyncs, reconnects) only when they warn.
	wlog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := serve(ctx, o, log, wlog); err != nil {
		fmt.Fprintf(stderr, "uplinkpin: %v\n", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, o options, log, wlog *slog.Logger) error {
	d := netwatch.KernelDialer{}
	if o.netns != "" {
		fd, err := unix.Open(o.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open network namespace %s: %w", o.netns, err)
		}
		defer unix.Close(fd)
		d.NetNS = fd
	}
	a, err := netwatch.DialApplier(d)
	if err != nil {
		return err
	}
	defer a.Close()
	// The policy reads links, rules, the main table (for the gateway) and
	// its own table: the route cache holds those two tables alone.
	w := netwatch.New(netwatch.Options{Dialer: d, RouteTables: []netwatch.Table{netwatch.TableMain, o.cfg.Table}, Logger: wlog})

	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	log.Info("uplinkpin: started", "uplink", o.cfg.Uplink, "mark", o.cfg.Mark, "mask", o.cfg.Mask,
		"table", o.cfg.Table, "priority", o.cfg.Priority)
	return reconcile(ctx, w, a, o.cfg, o.resync, log)
}

// settleTimeout bounds the wait for the cache to show what a pass applied.
const settleTimeout = time.Second

// reconcile runs a pass after every change of the cache, and again after
// a failed pass, until ctx ends.
func reconcile(ctx context.Context, w *netwatch.Watcher, a *netwatch.Applier, cfg Config, resync time.Duration, log *slog.Logger) error {
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(30*time.Second),
		backoff.WithMaxElapsedTime(0))
	retry := time.NewTimer(0)
	<-retry.C
	defer retry.Stop()
	var tick <-chan time.Time
	if resync > 0 {
		t := time.NewTicker(resync)
		defer t.Stop()
		tick = t.C
	}
	for {
		applied, err := pass(w, a, cfg, log)
		if len(applied) > 0 {
			settle(ctx, w, cfg, applied)
		}
		switch {
		case err != nil:
			d := bo.NextBackOff()
			log.Warn("uplinkpin: pass failed; retrying", "err", err, "in", d)
			retry.Reset(d)
		case len(applied) > 0:
			continue // settle took the notifications: look again now
		default:
			bo.Reset()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick:
			w.Resync() // its result arrives on Notify; this pass has nothing new
		case <-w.Notify():
		case <-retry.C:
		}
	}
}

// pass plans from the cache and applies the plan, logging each change. It
// returns the operations that succeeded.
func pass(w *netwatch.Watcher, a *netwatch.Applier, cfg Config, log *slog.Logger) ([]netwatch.Op, error) {
	var (
		ops    []netwatch.Op
		names  map[uint32]string
		err    error
		synced bool
	)
	w.Read(func(v netwatch.View) {
		if synced = v.Synced(); !synced {
			return
		}
		if ops, err = netwatch.Plan(v, cfg.Desired(v)); err != nil || len(ops) == 0 {
			return
		}
		names = make(map[uint32]string)
		for l := range v.Links() {
			names[l.Index] = l.Name
		}
	})
	if !synced || err != nil || len(ops) == 0 {
		return nil, err // not synced: the watcher notifies when it is
	}
	res, err := a.Apply(ops)
	var applied []netwatch.Op
	for _, r := range res {
		if r.Err == nil {
			log.Info(describe(r.Op, names))
			applied = append(applied, r.Op)
		}
	}
	return applied, err
}

// settle waits until the cache shows the operations a pass applied, or
// settleTimeout. The kernel queues the events of our own changes on the
// watcher's socket before Apply returns, but the watcher may notify for an
// event queued ahead of them first: a pass planned from that view would
// make, and log, the same changes again. If someone undoes a change before
// the cache ever shows it, the wait times out and the next pass redoes it.
func settle(ctx context.Context, w *netwatch.Watcher, cfg Config, applied []netwatch.Op) {
	timeout := time.NewTimer(settleTimeout)
	defer timeout.Stop()
	for inFlight(w, cfg, applied) {
		select {
		case <-ctx.Done():
			return
		case <-timeout.C:
			return
		case <-w.Notify():
		}
	}
}

// inFlight reports whether a plan made now would repeat one of applied.
func inFlight(w *netwatch.Watcher, cfg Config, applied []netwatch.Op) bool {
	again := false
	w.Read(func(v netwatch.View) {
		if !v.Synced() {
			return
		}
		ops, err := netwatch.Plan(v, cfg.Desired(v))
		if err != nil {
			return
		}
		again = slices.ContainsFunc(ops, func(op netwatch.Op) bool {
			return slices.ContainsFunc(applied, func(a netwatch.Op) bool {
				return op.Kind == a.Kind && op.Route.Equal(a.Route) && op.Rule.Equal(a.Rule)
			})
		})
	})
	return again
}
