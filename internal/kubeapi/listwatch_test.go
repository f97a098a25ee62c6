package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// traceBackOff is a back-off that records its use in a trace: "wait N" for the Nth delay
// since the last reset, which grows with N, and "reset".
type traceBackOff struct {
	trace *[]string
	n     int
}

func (b *traceBackOff) NextBackOff() time.Duration {
	b.n++
	*b.trace = append(*b.trace, fmt.Sprintf("wait %d", b.n))
	return time.Duration(b.n) * time.Microsecond
}

func (b *traceBackOff) Reset() {
	b.n = 0
	*b.trace = append(*b.trace, "reset")
}

// read is one scripted answer of Read: a resourceVersion, or an error.
type read struct {
	rv  string
	err error
}

// TestListWatch runs the loop against scripted reads and watch ends, and checks the
// requests it makes and its use of the back-off: what to read again, where to resume,
// when to wait, and that the wait grows while failures go on.
func TestListWatch(t *testing.T) {
	fail := errors.New("boom")
	for _, tc := range []struct {
		name    string
		reads   []read
		watches []WatchEnd
		want    []string
	}{{
		name:    "410 reads again",
		reads:   []read{{rv: "1"}, {rv: "2"}},
		watches: []WatchEnd{{Kind: EndGone, RV: "1", Err: fail}},
		// The failed watch delivered nothing: a wait, and the read does not reset it.
		want: []string{"reset", "read", "reset", "watch 1", "wait 1", "read", "watch 2"},
	}, {
		name:    "410 after events reads again at once",
		reads:   []read{{rv: "1"}, {rv: "5"}},
		watches: []WatchEnd{{Kind: EndGone, RV: "4", Progress: true, Err: fail}},
		want:    []string{"reset", "read", "reset", "watch 1", "reset", "read", "reset", "watch 5"},
	}, {
		name:  "failed reads wait longer each time",
		reads: []read{{err: fail}, {err: fail}, {err: fail}, {rv: "7"}},
		want:  []string{"reset", "read", "wait 1", "read", "wait 2", "read", "wait 3", "read", "reset", "watch 7"},
	}, {
		name:  "watches failing right after each read keep growing the wait",
		reads: []read{{rv: "1"}, {rv: "2"}, {rv: "3"}},
		watches: []WatchEnd{
			{Kind: EndCorrupt, RV: "1", Err: fail},
			{Kind: EndCorrupt, RV: "2", Err: fail},
			{Kind: EndClosed, RV: "9", Progress: true},
		},
		want: []string{"reset", "read", "reset", "watch 1", "wait 1", "read", "watch 2", "wait 2", "read", "watch 3", "reset", "watch 9"},
	}, {
		name:    "a failed watch resumes from the last resourceVersion",
		reads:   []read{{rv: "1"}},
		watches: []WatchEnd{{Kind: EndFailed, RV: "3", Progress: true, Err: fail}, {Kind: EndFailed, RV: "3", Err: fail}},
		want:    []string{"reset", "read", "reset", "watch 1", "reset", "wait 1", "watch 3", "wait 2", "watch 3"},
	}, {
		name:    "a clean end without events waits, then resumes",
		reads:   []read{{rv: "1"}},
		watches: []WatchEnd{{Kind: EndClosed, RV: "1"}},
		want:    []string{"reset", "read", "reset", "watch 1", "wait 1", "watch 1"},
	}, {
		name:    "the resync reads again at once",
		reads:   []read{{rv: "1"}, {rv: "2"}},
		watches: []WatchEnd{{Kind: EndResync, RV: "1"}},
		want:    []string{"reset", "read", "reset", "watch 1", "read", "reset", "watch 2"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var trace []string
			reads, watches := tc.reads, tc.watches
			lw := ListWatch{
				Read: func(context.Context) (string, error) {
					trace = append(trace, "read")
					if len(reads) == 0 {
						t.Fatalf("read beyond the script; trace %q", trace)
					}
					r := reads[0]
					reads = reads[1:]
					return r.rv, r.err
				},
				ReadFailed: func(error, time.Duration) {},
				Watch: func(_ context.Context, rv string, _ time.Time) WatchEnd {
					trace = append(trace, "watch "+rv)
					if len(watches) == 0 {
						cancel()
						return WatchEnd{Kind: EndCanceled, RV: rv}
					}
					w := watches[0]
					watches = watches[1:]
					return w
				},
				Backoff: &traceBackOff{trace: &trace},
				Logger:  slog.New(slog.DiscardHandler),
				Prefix:  "test", Attr: "object", What: "x",
				Kept:  func() string { return "keeping it" },
				Again: "reading again",
			}
			lw.Run(ctx)
			if diff := cmp.Diff(tc.want, trace); diff != "" {
				t.Errorf("requests and waits (-want +got):\n%s", diff)
			}
			if len(reads) != 0 {
				t.Errorf("reads left unused: %v", reads)
			}
		})
	}
}

// TestListWatchResync: with a Resync, the watch is given the time the next read is due;
// without one, the zero time.
func TestListWatchResync(t *testing.T) {
	for _, resync := range []time.Duration{0, time.Hour} {
		ctx, cancel := context.WithCancel(t.Context())
		var got time.Time
		before := time.Now()
		lw := ListWatch{
			Read:       func(context.Context) (string, error) { return "1", nil },
			ReadFailed: func(error, time.Duration) {},
			Watch: func(_ context.Context, rv string, resyncAt time.Time) WatchEnd {
				got = resyncAt
				cancel()
				return WatchEnd{Kind: EndCanceled, RV: rv}
			},
			Resync:  resync,
			Backoff: &traceBackOff{trace: new([]string)},
			Logger:  slog.New(slog.DiscardHandler),
		}
		lw.Run(ctx)
		switch {
		case resync == 0 && !got.IsZero():
			t.Errorf("no resync: watch given %v, want the zero time", got)
		case resync > 0 && (got.Before(before.Add(resync)) || got.After(time.Now().Add(resync))):
			t.Errorf("resync %v: watch given %v, want %v from the read", resync, got, resync)
		}
	}
}
