package nodecondition

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

type request struct {
	method, path, contentType string
	cond                      condition
}

// server answers PATCHes of a Node's status with the codes of answer (200
// when it is empty) and hands each request to the test.
func server(t *testing.T, answer func(n int) int) (*kubeapi.Client, <-chan request) {
	t.Helper()
	ch := make(chan request, 100)
	var mu sync.Mutex
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
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
	t.Cleanup(srv.Close)
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &kubeapi.Client{Server: srv.URL, TokenFile: tok, HTTP: srv.Client()}, ch
}

func next(t *testing.T, ch <-chan request) request {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("no write within 20s")
		return request{}
	}
}

// clock is a Now that moves a second per call.
func clock() func() time.Time {
	var mu sync.Mutex
	t := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Second)
		return t
	}
}

func start(t *testing.T, cfg Config) *Writer {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// Each change of state is one strategic-merge PATCH of the one condition on
// the Node's status; the same state again writes nothing; the transition
// time moves with the status only.
func TestWriter(t *testing.T) {
	c, ch := server(t, nil)
	w := start(t, Config{Client: c, NodeName: "node-1", Now: clock()})
	w.Set(State{false, "NoPeerList", "no list of the CiliumNodes yet"})
	r1 := next(t, ch)
	if r1.method != "PATCH" || r1.path != "/api/v1/nodes/node-1/status" || r1.contentType != "application/strategic-merge-patch+json" {
		t.Errorf("request %s %s (%s), want a strategic-merge PATCH of /api/v1/nodes/node-1/status", r1.method, r1.path, r1.contentType)
	}
	want := condition{Type: "MarkSplitReady", Status: "False", Reason: "NoPeerList", Message: "no list of the CiliumNodes yet",
		LastHeartbeatTime: "2026-12-03T12:00:01Z", LastTransitionTime: "2026-12-03T12:00:01Z"}
	if diff := cmp.Diff(want, r1.cond); diff != "" {
		t.Errorf("first condition (-want +got):\n%s", diff)
	}
	w.Set(State{false, "NoPeerList", "no list of the CiliumNodes yet"}) // the same: nothing
	w.Set(State{false, "NotConverged", "the last pass failed"})
	r2 := next(t, ch)
	if r2.cond.Reason != "NotConverged" || r2.cond.LastTransitionTime != want.LastTransitionTime {
		t.Errorf("second condition %+v: want reason NotConverged and the first transition time (the status did not change)", r2.cond)
	}
	w.Set(State{true, "SplitInPlace", "rule 900 and table 900 in place"})
	r3 := next(t, ch)
	if r3.cond.Status != "True" || r3.cond.LastTransitionTime == want.LastTransitionTime || r3.cond.LastTransitionTime != r3.cond.LastHeartbeatTime {
		t.Errorf("third condition %+v: want True with a new transition time", r3.cond)
	}
	select {
	case r := <-ch:
		t.Errorf("a write of an unchanged state: %+v", r.cond)
	default:
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

// A refusal is logged once and retried until it is accepted, which is
// logged too.
func TestWriterRefused(t *testing.T) {
	c, ch := server(t, func(n int) int {
		if n <= 2 {
			return 403
		}
		return 200
	})
	log := make(lines, 100)
	w := start(t, Config{Client: c, NodeName: "n1", Type: "example.com/Split", Logger: slog.New(log), Now: clock()})
	w.Set(State{true, "NotEncrypting", "the node does not encrypt"})
	for range 3 {
		if r := next(t, ch); r.cond.Type != "example.com/Split" {
			t.Errorf("type %q", r.cond.Type)
		}
	}
	var got []string
	for len(got) == 0 || !strings.Contains(got[len(got)-1], "again") {
		select {
		case m := <-log:
			if !strings.Contains(m, "written") && !strings.Contains(m, "retrying") {
				got = append(got, m)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("log %q: no line for the write accepted again", got)
		}
	}
	want := []string{
		`node condition example.com/Split: the API server refused to set it on node n1 (see docs/operations.md, "Node condition"): 403 Forbidden: nodes "n1" is forbidden: ValidatingAdmissionPolicy denied`,
		"node condition example.com/Split: set on node n1 again",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log (-want +got):\n%s", diff)
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
