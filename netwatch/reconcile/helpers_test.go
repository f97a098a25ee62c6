//go:build linux

package reconcile

import (
	"context"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/internal/fakekernel"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// fakeHost is a small host (fakekernel.NewHost): eth0 with addresses of
// both families, routes in main and in table 900, and the mark-split rules;
// it returns eth0's index.
func fakeHost(t *testing.T) (*netwatchtest.Kernel, uint32) {
	t.Helper()
	e, eth, err := fakekernel.NewHost()
	if err != nil {
		t.Fatal(err)
	}
	k := (*netwatchtest.Kernel)(e)
	t.Cleanup(func() { k.Close() })
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
