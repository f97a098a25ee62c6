//go:build linux

package netwatch

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/marksplit/marksplit/netwatch/internal/fakekernel"
)

// TestStatsDuringEvents: Stats, called as a metrics scrape would be, while
// events are applied. It once took its two locks in the opposite order to
// the event loop, and a scrape during a burst froze the watcher for good.
func TestStatsDuringEvents(t *testing.T) {
	k, eth := fakeHost(t)
	w, _ := startFake(t, k, Options{})
	waitFake(t, w, k, "initial sync")

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			dst := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 100+i/250, i%250))
			if err := k.AddRoute(fakekernel.Route{Dst: dst, Index: eth}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	scrapes := 0
	for running := true; running; scrapes++ {
		select {
		case <-done:
			running = false
		default:
		}
		w.Stats()
	}
	waitFake(t, w, k, "after 2000 routes")
	if s := w.Stats(); s.Events[KindRoute] < 2000 {
		t.Errorf("Stats().Events[route] = %d after %d scrapes, want ≥ 2000", s.Events[KindRoute], scrapes)
	}
}
