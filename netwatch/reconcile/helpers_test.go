//go:build linux

package reconcile

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// fakeHost is a small host: eth0 with addresses of both families, routes
// in main and in table 900, and the mark-split rules.
func fakeHost(t *testing.T) (*netwatchtest.Kernel, uint32) {
	t.Helper()
	k := netwatchtest.New()
	t.Cleanup(func() { k.Close() })
	eth := k.AddLink("eth0", "veth", 1450, true)
	k.AddLink("cilium_wg0", "tun", 1355, true)
	for _, err := range []error{
		k.AddAddr(eth, netip.MustParsePrefix("10.0.0.5/16")),
		k.AddAddr(eth, netip.MustParsePrefix("fd00::5/64")),
		k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("10.1.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"), Index: eth}),
		k.AddRoute(netwatch.Route{Table: 900, Dst: netip.MustParsePrefix("10.0.0.0/16"), Gateway: netip.MustParseAddr("10.0.0.1"),
			Index: eth, PrefSrc: netip.MustParseAddr("10.0.0.5"), MTU: 1355, Protocol: 77}),
		k.AddRoute(netwatch.Route{Table: 900, Dst: netip.MustParsePrefix("fd01::/64"), Gateway: netip.MustParseAddr("fd00::1"), Index: eth, MTU: 1355}),
		k.AddRule(netwatch.Rule{Family: netwatch.IPv4, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77}),
		k.AddRule(netwatch.Rule{Family: netwatch.IPv6, Priority: 900, Table: 900, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 77}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return k, eth
}

// startWatcher runs a watcher of k (nil: of opts.NetNS) with opts until the
// test ends; Run must return nil then (a minute: only a hang).
func startWatcher(t *testing.T, k *netwatchtest.Kernel, opts netwatch.Options) *netwatch.Watcher {
	t.Helper()
	if k != nil {
		opts.NetNS = k.NetNS()
	}
	opts.RetryMin, opts.RetryMax = time.Millisecond, time.Millisecond
	w := netwatch.New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	runUntilCleanup(t, ctx, cancel, w.Run)
	return w
}

// runUntilCleanup runs run(ctx) until the test ends, then cancels it: run
// must return nil (a minute: only a hang).
func runUntilCleanup(t *testing.T, ctx context.Context, cancel func(), run func(context.Context) error) {
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(time.Minute): // only a hang: a busy machine under -race takes its time
			t.Errorf("Run did not return within a minute of cancellation")
			<-done
		}
	})
}
