package kubeevents

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// NC8 of issue 38, for Events: a CiliumNode whose key flips 20 times a
// second for a minute makes the split come and go as often (SplitInstalled,
// SplitRemoved), and a pass that fails with a new message each time is a
// new Event each time. Whatever is recorded, a Recorder writes at most
// Burst + one per Refill: 10 + 60 s / 10 s = 16 in the minute, retries
// included (the writes are counted at the fake API server; the test calls
// writeDue after every record, as Run does when woken).
func TestWritesBounded(t *testing.T) {
	for _, code := range []int{0, 500} {
		t.Run(fmt.Sprintf("answer %d", code), func(t *testing.T) {
			h := newHarness(t, "node-1", nil)
			if code != 0 {
				h.api.setAnswer(func(w http.ResponseWriter, r *http.Request) bool { w.WriteHeader(code); return true })
			}
			ctx := context.Background()
			const flips = 20 * 60
			for i := range flips {
				if i%2 == 0 {
					h.r.Record(Normal, "SplitInstalled", "Install", "split installed")
				} else {
					h.r.Record(Normal, "SplitRemoved", "Remove", "split removed")
				}
				h.r.Record(Warning, "PassFailing", "Reconcile", fmt.Sprintf("reconcile passes keep failing: attempt %d", i))
				h.r.writeDue(ctx)
				h.clock.Advance(time.Second / 20)
			}
			h.r.writeDue(ctx)
			const most = DefaultBurst + int(time.Minute/DefaultRefill)
			got := len(h.api.writes())
			t.Logf("%d records in a minute: %d writes (at most %d)", 2*flips, got, most)
			if got > most || got == 0 {
				t.Errorf("%d writes, want between 1 and %d", got, most)
			}
		})
	}
}
