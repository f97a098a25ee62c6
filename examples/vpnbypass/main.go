//go:build linux

// Command vpnbypass sends chosen prefixes through a VPN link for every
// packet except the VPN's own, the shape Tailscale uses:
//
//	ip route replace PREFIX dev tailscale0 src 100.64.0.1 table 910 proto 241
//	ip rule add not fwmark 0x80000/0xff0000 lookup 910 pref 910 proto 241
//
// The VPN's encapsulated packets carry its mark and fall through to the
// main table, so they still leave by the underlay; everything else to
// PREFIX enters the tunnel. The table follows the VPN link: it is filled
// when the link appears and is up, its routes take the link's new address
// as source, and everything vpnbypass owns is removed while the link is
// down or absent.
//
// vpnbypass owns its table and its rule priority, in both families, and
// nothing else. It leaves its routes in place when it stops; remove them
// with `ip route flush table 910; ip -6 route flush table 910;
// ip rule del pref 910; ip -6 rule del pref 910`.
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
		fmt.Fprintf(stderr, "vpnbypass: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	// The watcher's own lines (resyncs, reconnects) only when they warn.
	wlog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := serve(ctx, o, log, wlog); err != nil {
		fmt.Fprintf(stderr, "vpnbypass: %v\n", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, o options, log, wlog *slog.Logger) error {
	// The policy reads links, addresses, rules and its own table: the
	// route cache holds that table alone.
	opts := netwatch.Options{RouteTables: []netwatch.Table{o.cfg.Table}, Logger: wlog}
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

	log.Info("vpnbypass: started", "link", o.cfg.Link, "prefixes", o.cfg.Prefixes,
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
