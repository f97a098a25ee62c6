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
// change, Read → Config.Desired → reconcile.Plan → Applier.Apply, which
// reconcile.Reconciler does.
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
	"syscall"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
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
	// The policy reads links, rules, the main table (for the gateway) and
	// its own table: the route cache holds those two tables alone.
	opts := netwatch.Options{RouteTables: []netwatch.Table{netwatch.TableMain, o.cfg.Table}, Logger: wlog}
	if o.netns != "" {
		ns, err := netwatch.OpenNetNS(o.netns)
		if err != nil {
			return err
		}
		defer ns.Close() // after the watcher and the applier, which use it
		opts.NetNS = ns
	}
	a, err := netwatch.DialApplier(opts.NetNS)
	if err != nil {
		return err
	}
	defer a.Close()
	w := netwatch.New(opts)

	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	log.Info("uplinkpin: started", "uplink", o.cfg.Uplink, "mark", o.cfg.Mark, "mask", o.cfg.Mask,
		"table", o.cfg.Table, "priority", o.cfg.Priority)
	r := &reconcile.Reconciler{
		Watcher:  w,
		Applier:  a,
		Policy:   func(v netwatch.View) (reconcile.Desired, bool) { return o.cfg.Desired(v), true },
		Resync:   o.resync,
		Logger:   log,
		Describe: netwatch.Op.DescribeWhole,
	}
	return r.Run(ctx)
}
