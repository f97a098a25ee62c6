package nodecondition

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

type request struct {
	method, path, contentType string
	cond                      condition
}

// server answers PATCHes of a Node's status, on an apitest server, with the codes of
// answer (200 when it is empty) and hands each request to the test.
func server(t *testing.T, answer func(n int) int) (*kubeapi.Client, <-chan request) {
	t.Helper()
	ch := make(chan request, 100)
	var mu sync.Mutex
	n := 0
	srv := apitest.New(t, apitest.Options{})
	srv.Handle("/api/v1/nodes/", http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Status struct {
				Conditions []condition `json:"conditions"`
			} `json:"status"`
		}
		if err := json.Unmarshal(body, &p); err != nil || len(p.Status.Conditions) != 1 {
			t.Errorf("patch %s: want one condition (%v)", body, err)
			rw.WriteHeader(400)
			return
		}
		mu.Lock()
		n++
		code := 200
		if answer != nil {
			code = answer(n)
		}
		mu.Unlock()
		ch <- request{r.Method, r.URL.Path, r.Header.Get("Content-Type"), p.Status.Conditions[0]}
		rw.WriteHeader(code)
		if code != 200 {
			io.WriteString(rw, `{"kind":"Status","message":"nodes \"n1\" is forbidden: ValidatingAdmissionPolicy denied"}`)
			return
		}
		io.WriteString(rw, `{"kind":"Node"}`)
	}))
	dir := t.TempDir()
	if err := apitest.WriteToken(dir, srv.Token()); err != nil {
		t.Fatal(err)
	}
	client := srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	return &kubeapi.Client{Server: srv.URL(), TokenFile: filepath.Join(dir, "token"), HTTP: client}, ch
}

func next(t *testing.T, ch <-chan request) request {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(2 * time.Minute):
		t.Fatal("no write within 2 min")
		return request{}
	}
}

// fakeClock is a Clock that moves when the test says; its After is never
// due (the tests call writeDue themselves, as Run does when woken).
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock { return &fakeClock{now: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(time.Duration) <-chan time.Time { return nil }

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newWriter(t *testing.T, cfg Config) *Writer {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// pending returns the writes the server has seen and not yet handed out.
func pending(ch <-chan request) []request {
	var got []request
	for {
		select {
		case r := <-ch:
			got = append(got, r)
		default:
			return got
		}
	}
}

// Run writes what Set says and returns when its context ends.
func TestWriterRun(t *testing.T) {
	c, ch := server(t, nil)
	w := newWriter(t, Config{Client: c, NodeName: "node-1"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	w.Set(State{true, "SplitInPlace", "in place"})
	if r := next(t, ch); r.cond.Status != "True" || r.cond.Reason != "SplitInPlace" {
		t.Errorf("condition %+v", r.cond)
	}
	cancel()
	<-done
}

// Each change of state is one strategic-merge PATCH of the one condition on
// the Node's status, at most one per MinInterval; the same state again
// writes nothing; the transition time moves with the status only.
func TestWriter(t *testing.T) {
	c, ch := server(t, nil)
	clk := newClock()
	w := newWriter(t, Config{Client: c, NodeName: "node-1", Clock: clk})
	ctx := context.Background()
	w.Set(State{false, "NoPeerList", "no list of the CiliumNodes yet"})
	if wait := w.writeDue(ctx); wait != DefaultMinInterval {
		t.Errorf("after a write: next in %v, want %v", wait, DefaultMinInterval)
	}
	r1 := next(t, ch)
	if r1.method != "PATCH" || r1.path != "/api/v1/nodes/node-1/status" || r1.contentType != "application/strategic-merge-patch+json" {
		t.Errorf("request %s %s (%s), want a strategic-merge PATCH of /api/v1/nodes/node-1/status", r1.method, r1.path, r1.contentType)
	}
	want := condition{Type: "MarkSplitReady", Status: "False", Reason: "NoPeerList", Message: "no list of the CiliumNodes yet",
		LastHeartbeatTime: "2026-12-03T12:00:00Z", LastTransitionTime: "2026-12-03T12:00:00Z"}
	if diff := cmp.Diff(want, r1.cond); diff != "" {
		t.Errorf("first condition (-want +got):\n%s", diff)
	}
	clk.Advance(time.Second)
	w.Set(State{false, "NotConverged", "the last pass failed"})
	if wait := w.writeDue(ctx); wait != DefaultMinInterval-time.Second {
		t.Errorf("a change 1s after a write: wait %v, want %v", wait, DefaultMinInterval-time.Second)
	}
	if got := pending(ch); len(got) != 0 {
		t.Errorf("a write within MinInterval: %+v", got)
	}
	clk.Advance(DefaultMinInterval)
	w.writeDue(ctx)
	r2 := next(t, ch)
	if r2.cond.Reason != "NotConverged" || r2.cond.LastTransitionTime != want.LastTransitionTime {
		t.Errorf("second condition %+v: want reason NotConverged and the first transition time (the status did not change)", r2.cond)
	}
	clk.Advance(DefaultMinInterval)
	w.Set(State{true, "SplitInPlace", "rule 900 and table 900 in place"})
	w.writeDue(ctx)
	r3 := next(t, ch)
	if r3.cond.Status != "True" || r3.cond.LastTransitionTime == want.LastTransitionTime || r3.cond.LastTransitionTime != r3.cond.LastHeartbeatTime {
		t.Errorf("third condition %+v: want True with a new transition time", r3.cond)
	}
	clk.Advance(DefaultMinInterval)
	w.Set(State{true, "SplitInPlace", "rule 900 and table 900 in place"}) // the same: nothing
	w.writeDue(ctx)
	if got := pending(ch); len(got) != 0 {
		t.Errorf("a write of an unchanged state: %+v", got)
	}
	if st := w.Stats(); st != (Stats{Changes: 3, Written: 3}) {
		t.Errorf("stats %+v", st)
	}
}

// lines is a slog.Handler that hands each message to the test.
type lines chan string

func (l lines) Enabled(context.Context, slog.Level) bool { return true }
func (l lines) Handle(_ context.Context, r slog.Record) error {
	l <- r.Message
	return nil
}
func (l lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l lines) WithGroup(string) slog.Handler      { return l }

// drain returns the lines logged so far.
func drain(l lines) []string {
	var got []string
	for {
		select {
		case m := <-l:
			got = append(got, m)
		default:
			return got
		}
	}
}

// A refusal is logged once and retried, with back-off, until it is
// accepted, which is logged too.
func TestWriterRefused(t *testing.T) {
	c, ch := server(t, func(n int) int {
		if n <= 2 {
			return 403
		}
		return 200
	})
	log := make(lines, 100)
	clk := newClock()
	w := newWriter(t, Config{Client: c, NodeName: "n1", Type: "example.com/Split", Logger: slog.New(log), Clock: clk})
	w.Set(State{true, "NotEncrypting", "the node does not encrypt"})
	for range 3 {
		clk.Advance(w.writeDue(context.Background()))
		if r := next(t, ch); r.cond.Type != "example.com/Split" {
			t.Errorf("type %q", r.cond.Type)
		}
	}
	var got []string
	for _, m := range drain(log) {
		if m != "node condition written" {
			got = append(got, m)
		}
	}
	want := []string{
		`node condition example.com/Split: the API server refused to set it on node n1 (see docs/operations.md, "Node condition"): 403 Forbidden: nodes "n1" is forbidden: ValidatingAdmissionPolicy denied`,
		"node condition example.com/Split: set on node n1 again",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log (-want +got):\n%s", diff)
	}
	if st := w.Stats(); st.Refused != 2 || st.Written != 1 {
		t.Errorf("stats %+v, want 2 refused and 1 written", st)
	}
}

func TestValidType(t *testing.T) {
	for _, ok := range []string{"MarkSplitReady", "example.com/MarkSplitReady", "a"} {
		if err := ValidType(ok); err != nil {
			t.Errorf("ValidType(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Mark Split", "/x", "x/", strings.Repeat("a", 64), "Example.com/x"} {
		if err := ValidType(bad); err == nil {
			t.Errorf("ValidType(%q) = nil", bad)
		}
	}
}
