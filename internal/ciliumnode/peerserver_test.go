package ciliumnode

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/apitest"
	"go.uber.org/goleak"
)

// These tests run a PeerSource against the stand-in API server (package apitest): whole
// behaviours with churn and faults, rather than the request-by-request scripts of
// peersource_test.go.

// live runs a PeerSource against an apitest.Server.
type live struct {
	t    *testing.T
	api  *apitest.Server
	src  *PeerSource
	dir  string // the service-account directory
	logs *logBuffer

	mu      sync.Mutex
	last    Peers
	reports int
	changed chan struct{} // closed and replaced on every report
}

// startLive serves nodes from a new apitest.Server and runs a PeerSource against it until
// the test ends. The source retries after 10 ms and times a watch out after an hour unless
// edit says otherwise.
func startLive(t *testing.T, opts apitest.Options, edit func(*Config), nodes ...apitest.Node) *live {
	t.Helper()
	h := newLive(t, opts, nodes...)
	h.start(edit)
	return h
}

// newLive is startLive's server and harness, without the source: a test
// injects the faults of the first requests before it starts the source,
// which lists at once.
func newLive(t *testing.T, opts apitest.Options, nodes ...apitest.Node) *live {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	h := &live{t: t, api: apitest.New(t, opts), dir: t.TempDir(), logs: &logBuffer{}, changed: make(chan struct{})}
	if err := h.api.WriteServiceAccount(h.dir); err != nil {
		t.Fatal(err)
	}
	if len(nodes) > 0 {
		h.api.MustPut(t, nodes...)
	}
	return h
}

// start starts the source, with its Config edited by edit when set.
func (h *live) start(edit func(*Config)) {
	t := h.t
	t.Helper()
	cfg := Config{
		Server:         h.api.URL(),
		TokenFile:      filepath.Join(h.dir, "token"),
		CAFile:         filepath.Join(h.dir, "ca.crt"),
		WatchTimeout:   time.Hour,
		RequestTimeout: waitFor,
		Backoff:        backoff.NewConstantBackOff(10 * time.Millisecond),
		Logger:         slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if edit != nil {
		edit(&cfg)
	}
	src, err := NewPeers(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.src = src
	runInBackground(t, func(ctx context.Context) error { return src.Run(ctx, h.report) })
}

func (h *live) report(ps Peers) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last, h.reports = ps, h.reports+1
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *live) snapshot() (Peers, int, chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last, h.reports, h.changed
}

// await waits until the last report reads want (summary lines).
func (h *live) await(what string, want ...string) {
	h.t.Helper()
	deadline := time.After(waitFor)
	for {
		ps, n, changed := h.snapshot()
		if n > 0 && cmp.Equal(want, summary(ps)) {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			h.t.Fatalf("%s: the last of %d reports is not what it should be (-want +got):\n%s", what, n, cmp.Diff(want, summary(ps)))
		}
	}
}

// eventually polls cond until it holds or waitFor passes.
func (h *live) eventually(what string, cond func() bool) {
	h.t.Helper()
	(&harness{t: h.t}).eventually(what, cond)
}

func apiNode(name string, key int64, ips ...string) apitest.Node {
	return apitest.Node{Name: name, Key: key, InternalIPs: ips}
}

// three is the cluster of the tests: this node, an encrypting peer, an opted-out one.
var three = []apitest.Node{
	apiNode("worker-1", 255, "10.0.0.5"),
	apiNode("worker-2", 255, "10.0.0.6", "fd00::6"),
	apiNode("cp-1", 0, "10.0.0.2"),
}

// TestPeersLiveChurn: a peer joining, opting out, changing address, opting in and leaving
// is each one report; a status update is none.
func TestPeersLiveChurn(t *testing.T) {
	h := startLive(t, apitest.Options{}, nil, three...)
	h.await("first list", threeSummary...)
	steps := []struct {
		name   string
		change func(s *apitest.Server)
		want   []string
	}{
		{"join", func(s *apitest.Server) { s.Put(apiNode("worker-3", 255, "10.0.1.7")) },
			[]string{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6,fd00::6", "worker-3 on 10.0.1.7"}},
		{"opt out", func(s *apitest.Server) { s.SetKey("worker-2", 0) },
			[]string{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 off 10.0.0.6,fd00::6", "worker-3 on 10.0.1.7"}},
		{"change address", func(s *apitest.Server) { s.SetAddrs("worker-3", "10.0.2.7", "fd00::7") },
			[]string{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 off 10.0.0.6,fd00::6", "worker-3 on 10.0.2.7,fd00::7"}},
		{"opt in", func(s *apitest.Server) { s.SetKey("worker-2", 255) },
			[]string{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6,fd00::6", "worker-3 on 10.0.2.7,fd00::7"}},
		{"leave", func(s *apitest.Server) { s.Delete("worker-2") },
			[]string{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-3 on 10.0.2.7,fd00::7"}},
	}
	for _, st := range steps {
		_, before, _ := h.snapshot()
		h.api.Touch("cp-1") // a status update first: it must not report
		st.change(h.api)
		h.await(st.name, st.want...)
		if _, after, _ := h.snapshot(); after != before+1 {
			t.Errorf("%s: %d reports, want 1", st.name, after-before)
		}
	}
	if got := h.src.Stats(); got.Lists != 1 || got.Events != 2*uint64(len(steps)) || got.Reports != 1+uint64(len(steps)) {
		t.Errorf("Stats %+v: want 1 list, %d events, %d reports", got, 2*len(steps), 1+len(steps))
	}
	if got := h.api.Count(apitest.KindList); got != 1 {
		t.Errorf("%d list requests, want 1", got)
	}
}

// TestPeersLiveFaults: after each fault the set catches up with the server; the counters
// say what happened.
func TestPeersLiveFaults(t *testing.T) {
	after := []string{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 off 10.0.0.6,fd00::6"} // worker-2 opted out
	optOut := func(s *apitest.Server) { s.SetKey("worker-2", 0) }
	tests := []struct {
		name    string
		opts    apitest.Options
		cfg     func(*Config)
		fault   func(h *live) // breaks something, and leaves worker-2 opted out
		want    []string
		lists   int  // list pages served after the first list
		atLeast bool // lists is a minimum (failed lists are retried)
		check   func(t *testing.T, st PeerStats)
	}{
		{
			name: "410 mid-watch lists again",
			fault: func(h *live) {
				h.api.ExpireWatches()
				h.eventually("listed again", func() bool { return h.src.Stats().Lists == 2 })
				optOut(h.api)
			},
			want: after, lists: 1,
			check: func(t *testing.T, st PeerStats) {
				if st.Gone != 1 || st.Lists != 2 {
					t.Errorf("Gone %d, Lists %d; want 1, 2", st.Gone, st.Lists)
				}
			},
		},
		{
			name: "a hung watch is restarted from its resourceVersion",
			cfg:  func(c *Config) { c.WatchTimeout = 100 * time.Millisecond },
			fault: func(h *live) {
				h.api.Inject(apitest.KindWatch, apitest.Fault{Hang: true})
				h.api.EndWatches() // the next watch hangs
				h.eventually("the hung watch restarted", func() bool { return h.src.Stats().WatchRestart >= 2 })
				optOut(h.api)
			},
			want: after,
			check: func(t *testing.T, st PeerStats) {
				if st.Lists != 1 || st.Gone != 0 {
					t.Errorf("Lists %d, Gone %d; want 1, 0: a hang needs no list", st.Lists, st.Gone)
				}
			},
		},
		{
			name: "garbage on the watch resumes it",
			fault: func(h *live) {
				h.api.SendRaw("<html>oops</html>\n")
				// Before the change: else its event may come first, and the
				// counters be read before the garbage is.
				h.eventually("the garbage read", func() bool { return h.src.Stats().DecodeError >= 1 })
				optOut(h.api)
			},
			want: after,
			check: func(t *testing.T, st PeerStats) {
				if st.DecodeError != 1 || st.Lists != 1 {
					t.Errorf("DecodeError %d, Lists %d; want 1, 1", st.DecodeError, st.Lists)
				}
			},
		},
		{
			name: "a dropped watch resumes",
			fault: func(h *live) {
				h.api.DropWatches()
				h.eventually("the drop seen", func() bool { return h.src.Stats().NetworkError >= 1 })
				optOut(h.api)
			},
			want: after,
			check: func(t *testing.T, st PeerStats) {
				if st.NetworkError != 1 || st.Lists != 1 {
					t.Errorf("NetworkError %d, Lists %d; want 1, 1", st.NetworkError, st.Lists)
				}
			},
		},
		{
			name: "a corrupt object: the last set stands until it is fixed",
			fault: func(h *live) {
				h.api.Put(apitest.Node{Name: "worker-2", Key: 255, InternalIPs: []string{"10.0.0.6"}, Patch: func(o map[string]any) {
					o["spec"].(map[string]any)["encryption"] = map[string]any{"key": "0"}
				}})
				h.eventually("the object skipped", func() bool { return h.src.Stats().Problems == 1 })
				if got := summary(h.lastPeers()); !cmp.Equal(got, threeSummary) {
					t.Errorf("while the object is corrupt: %v, want the last set", got)
				}
				if p := h.lastPeers().Problems(); len(p) != 1 || p[0].Name != "worker-2" || !strings.Contains(p[0].Problem, "spec.encryption.key") {
					t.Errorf("while the object is corrupt: problems %+v, want worker-2's key", p)
				}
				h.api.Put(apiNode("worker-2", 0, "10.0.0.6", "fd00::6")) // fixed, and opted out
			},
			want: after,
			check: func(t *testing.T, st PeerStats) {
				if st.Lists != 1 || st.Problems != 0 {
					t.Errorf("Lists %d, Problems %d; want 1, 0: the watch went on", st.Lists, st.Problems)
				}
			},
		},
		{
			name: "token rotation",
			fault: func(h *live) {
				h.api.SetToken("token-2") // the old token stops working
				h.api.EndWatches()
				h.eventually("refused", func() bool { return h.api.Count(apitest.KindUnauthorized) >= 1 })
				if err := apitest.WriteToken(h.dir, "token-2"); err != nil {
					t.Fatal(err)
				}
				optOut(h.api)
			},
			want: after,
			check: func(t *testing.T, st PeerStats) {
				if st.HTTPError == 0 || st.Lists != 1 {
					t.Errorf("HTTPError %d, Lists %d; want > 0, 1", st.HTTPError, st.Lists)
				}
			},
		},
		{
			name: "server restart with lost state: the client lists the new state",
			fault: func(h *live) {
				h.api.Restart()
				h.api.Replace(apiNode("worker-1", 255, "10.0.0.5"), apiNode("worker-9", 255, "10.0.9.9"))
			},
			want:  []string{"worker-1 on 10.0.0.5", "worker-9 on 10.0.9.9"},
			lists: 1,
			check: func(t *testing.T, st PeerStats) {
				if st.Lists != 2 || st.Gone != 1 {
					t.Errorf("Lists %d, Gone %d; want 2, 1", st.Lists, st.Gone)
				}
			},
		},
		{
			name: "the API goes away: the last set stands",
			fault: func(h *live) {
				h.api.SetDown(true)
				h.api.Restart()
				h.eventually("failing", func() bool { return h.src.Stats().NetworkError >= 3 })
				if got := summary(h.lastPeers()); !cmp.Equal(got, threeSummary) {
					t.Errorf("while the API is down: %v, want the last set", got)
				}
				optOut(h.api)
				h.api.SetDown(false)
			},
			// The open watch may see the restart's compaction (410) before its
			// connection is cut: the client then retries lists, not watches,
			// while the API is down, and each failed attempt counts.
			want: after, lists: 1, atLeast: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startLive(t, tc.opts, tc.cfg, three...)
			h.await("first list", threeSummary...)
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			if err := h.api.AwaitWatches(ctx, 1); err != nil {
				t.Fatal(err)
			}
			lists := h.api.Count(apitest.KindList)
			tc.fault(h)
			h.await("after the fault", tc.want...)
			if got := h.api.Count(apitest.KindList) - lists; got != tc.lists && !(tc.atLeast && got > tc.lists) {
				t.Errorf("%d list requests after the fault, want %d", got, tc.lists)
			}
			if tc.check != nil {
				tc.check(t, h.src.Stats())
			}
		})
	}
}

// TestPeersLiveListFailsFirst: nothing is reported before the first good list, however the
// list fails; then the set is complete at once.
func TestPeersLiveListFailsFirst(t *testing.T) {
	h := newLive(t, apitest.Options{MaxPageSize: 2}, three...)
	// Before the source starts: its first list must meet them.
	h.api.Inject(apitest.KindList,
		apitest.Fault{Code: 500}, apitest.Fault{Drop: true}, apitest.Fault{Body: "{garbage"}, apitest.Fault{Code: 403})
	h.start(nil)
	h.await("first list", threeSummary...)
	if _, n, _ := h.snapshot(); n != 1 {
		t.Errorf("%d reports, want 1", n)
	}
	st := h.src.Stats()
	if st.HTTPError != 2 || st.NetworkError != 1 || st.DecodeError != 1 || st.Lists != 1 || st.OK != 2 {
		t.Errorf("Stats %+v: want 2 HTTP errors, 1 network error, 1 decode error, then one list of 2 pages", st)
	}
}

// TestPeersLiveSteadyState: a healthy watch costs no list, however long it runs: bookmarks
// keep it alive, and when the server ends it (its request timeout) it is resumed.
func TestPeersLiveSteadyState(t *testing.T) {
	h := startLive(t, apitest.Options{BookmarkInterval: 20 * time.Millisecond, MinRequestTimeout: 150 * time.Millisecond},
		func(c *Config) { c.WatchTimeout = time.Second }, three...)
	h.await("first list", threeSummary...)
	for i := range 4 {
		h.eventually("the server ended a watch", func() bool { return h.api.Count(apitest.KindWatch) >= i+2 })
		h.api.Touch("cp-1")
	}
	h.api.SetKey("worker-2", 0)
	h.await("after a change", "cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 off 10.0.0.6,fd00::6")
	if got := h.api.Count(apitest.KindList); got != 1 {
		t.Errorf("%d list requests while the watch is healthy, want 1", got)
	}
	if st := h.src.Stats(); st.Lists != 1 || st.WatchRestart < 4 || st.Gone != 0 {
		t.Errorf("Stats %+v: want 1 list, >= 4 resumed watches, no 410", st)
	}
}

func (h *live) lastPeers() Peers {
	ps, _, _ := h.snapshot()
	return ps
}

// TestPeersLiveWrongCA: a server the CA does not vouch for is never believed.
func TestPeersLiveWrongCA(t *testing.T) {
	wrong := filepath.Join(t.TempDir(), "other-ca.crt")
	writeFile(t, wrong, selfSignedCA(t))
	h := startLive(t, apitest.Options{}, func(c *Config) { c.CAFile = wrong }, three...)
	h.eventually("retried", func() bool { return h.src.Stats().NetworkError >= 2 })
	if _, n, _ := h.snapshot(); n != 0 {
		t.Errorf("%d reports from an unverified server", n)
	}
	if got := h.api.Count(apitest.KindList); got != 0 {
		t.Errorf("%d list requests reached the server", got)
	}
	(&harness{t: t, logs: h.logs}).wantLog("WARN", "ciliumnode: list CiliumNodes (page 1): ", "x509: certificate signed by unknown authority")
}
