package kubeevents

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

// fakeClock is a Clock that moves when the test says.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	c  chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 12, 2, 0, 0, 0, 123456789, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{c.now.Add(d), ch})
	return ch
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.c <- c.now
	}
	c.waiters = kept
}

// waitingUntil reports whether someone waits for exactly at.
func (c *fakeClock) waitingUntil(at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.waiters {
		if w.at.Equal(at) {
			return true
		}
	}
	return false
}

// eventsPath is where a Recorder creates its Events (namespace default).
const eventsPath = "/apis/events.k8s.io/v1/namespaces/default/events"

// fakeAPI is an API server's events endpoint, on an apitest server: it keeps what it
// was sent and answers as answer says (nil: as the API server would).
type fakeAPI struct {
	srv *apitest.Server

	mu       sync.Mutex
	requests []request
	events   map[string]map[string]any // by name
	answer   func(w http.ResponseWriter, r *http.Request) bool
}

type request struct {
	method, path, contentType string
	body                      map[string]any
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{events: map[string]map[string]any{}}
	f.srv = apitest.New(t, apitest.Options{})
	f.srv.Handle(eventsPath, http.HandlerFunc(f.serve))
	f.srv.Handle(eventsPath+"/", http.HandlerFunc(f.serve))
	return f
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var body map[string]any
	json.Unmarshal(b, &body)
	f.mu.Lock()
	f.requests = append(f.requests, request{r.Method, r.URL.Path, r.Header.Get("Content-Type"), body})
	answer := f.answer
	f.mu.Unlock()
	if answer != nil && answer(w, r) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case r.Method == "POST" && r.URL.Path == eventsPath:
		name, _ := body["metadata"].(map[string]any)["name"].(string)
		if f.events[name] != nil {
			w.WriteHeader(http.StatusConflict)
			return
		}
		f.events[name] = body
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	case r.Method == "PATCH" && strings.HasPrefix(r.URL.Path, eventsPath+"/"):
		ev := f.events[strings.TrimPrefix(r.URL.Path, eventsPath+"/")]
		if ev == nil {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"kind":"Status","reason":"NotFound","message":"not found","code":404}`))
			return
		}
		ev["series"] = body["series"]
		w.Write(b)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func (f *fakeAPI) setAnswer(a func(w http.ResponseWriter, r *http.Request) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = a
}

func (f *fakeAPI) writes() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.requests...)
}

// count is the series count of the Event name (1 without a series; 0
// when there is no such Event).
func (f *fakeAPI) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	ev := f.events[name]
	if ev == nil {
		return 0
	}
	s, ok := ev["series"].(map[string]any)
	if !ok {
		return 1
	}
	n, _ := s["count"].(float64)
	return int(n)
}

func (f *fakeAPI) names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ns []string
	for n := range f.events {
		ns = append(ns, n)
	}
	return ns
}

// logBuffer is a log the test reads while the Recorder writes it.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type harness struct {
	r     *Recorder
	api   *fakeAPI
	clock *fakeClock
	log   *logBuffer
}

// start runs a Recorder for node against a fake API until the test ends.
func start(t *testing.T, node string, tweak func(*Config)) *harness {
	t.Helper()
	h := newHarness(t, node, tweak)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

// newHarness is start without Run: the test calls writeDue itself.
func newHarness(t *testing.T, node string, tweak func(*Config)) *harness {
	t.Helper()
	h := &harness{api: newFakeAPI(t), clock: newFakeClock(), log: &logBuffer{}}
	dir := t.TempDir()
	if err := apitest.WriteToken(dir, h.api.srv.Token()); err != nil {
		t.Fatal(err)
	}
	client := h.api.srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	cfg := Config{
		Client:   &kubeapi.Client{Server: h.api.srv.URL(), TokenFile: filepath.Join(dir, "token"), HTTP: kubeapi.NoRedirects(client)},
		NodeName: node,
		Clock:    h.clock,
		Logger:   slog.New(slog.NewTextHandler(h.log, nil)),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	var err error
	if h.r, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	return h
}

// eventually polls cond every millisecond until it is nil, for at most 10 s.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		<-tick.C
	}
}

// idleUntil waits until the Recorder waits for the clock to reach at.
func (h *harness) idleUntil(t *testing.T, at time.Time) {
	t.Helper()
	eventually(t, "the recorder waits until "+at.Format(time.TimeOnly), func() error {
		if !h.clock.waitingUntil(at) {
			return fmt.Errorf("no waiter for %v", at)
		}
		return nil
	})
}

// created waits until the Recorder has seen n creations succeed.
func (h *harness) created(t *testing.T, n uint64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d created", n), func() error {
		if st := h.r.Stats(); st.Created != n {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
}

func (h *harness) writesAre(t *testing.T, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d writes", n), func() error {
		if got := len(h.api.writes()); got != n {
			return fmt.Errorf("%d writes", got)
		}
		return nil
	})
}

var microRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)

// The first occurrence creates the Event with every field an operator's
// kubectl reads; repeats are counted and written as one merge PATCH of its
// series 30 s after the creation; a repeat after the series window starts
// a new Event.
func TestSeries(t *testing.T) {
	h := start(t, "node-1", nil)
	t0 := h.clock.Now()
	h.r.Record(Warning, "SplitFight", "Repair", "rule 900 undone\nagain by ip")
	h.created(t, 1)
	create := h.api.writes()[0]
	name := create.body["metadata"].(map[string]any)["name"].(string)
	if !regexp.MustCompile(`^node-1\.[0-9a-f]+$`).MatchString(name) {
		t.Errorf("name %q, want node-1.<hex>", name)
	}
	if !microRE.MatchString(create.body["eventTime"].(string)) {
		t.Errorf("eventTime %q is not a MicroTime", create.body["eventTime"])
	}
	want := map[string]any{
		"apiVersion":          "events.k8s.io/v1",
		"kind":                "Event",
		"metadata":            map[string]any{"name": name, "namespace": "default"},
		"eventTime":           "2026-12-02T00:00:00.123456Z",
		"reportingController": "marksplit.io/agent",
		"reportingInstance":   "node-1",
		"action":              "Repair",
		"reason":              "SplitFight",
		"regarding":           map[string]any{"kind": "Node", "apiVersion": "v1", "name": "node-1", "uid": "node-1"},
		"note":                "rule 900 undone again by ip",
		"type":                "Warning",
	}
	if diff := cmp.Diff(want, create.body); diff != "" {
		t.Errorf("created Event (-want +got):\n%s", diff)
	}
	if create.method != "POST" || create.path != "/apis/events.k8s.io/v1/namespaces/default/events" || create.contentType != "application/json" {
		t.Errorf("create: %s %s (%s)", create.method, create.path, create.contentType)
	}

	// Four repeats: nothing written before 30 s have passed.
	for range 4 {
		h.clock.Advance(time.Second)
		h.r.Record(Warning, "SplitFight", "Repair", "rule 900 undone again by ip")
	}
	h.idleUntil(t, t0.Add(DefaultMinInterval))
	if n := len(h.api.writes()); n != 1 {
		t.Fatalf("%d writes within 30 s of the creation, want 1", n)
	}
	h.clock.Advance(DefaultMinInterval - 4*time.Second)
	h.writesAre(t, 2)
	patch := h.api.writes()[1]
	wantPatch := map[string]any{"series": map[string]any{"count": float64(5), "lastObservedTime": "2026-12-02T00:00:04.123456Z"}}
	if diff := cmp.Diff(wantPatch, patch.body); diff != "" {
		t.Errorf("patch (-want +got):\n%s", diff)
	}
	if patch.method != "PATCH" || patch.path != create.path+"/"+name || patch.contentType != "application/merge-patch+json" {
		t.Errorf("patch: %s %s (%s)", patch.method, patch.path, patch.contentType)
	}

	// The series is over 6 minutes after its last occurrence: the Event is
	// forgotten, and the next occurrence is a new Event.
	h.clock.Advance(DefaultSeriesWindow)
	eventually(t, "the Event forgotten", func() error {
		if n := h.r.Pending(); n != 0 {
			return fmt.Errorf("%d pending", n)
		}
		return nil
	})
	h.r.Record(Warning, "SplitFight", "Repair", "rule 900 undone again by ip")
	h.writesAre(t, 3)
	h.created(t, 2)
	if names := h.api.names(); len(names) != 2 {
		t.Errorf("Events %q, want 2", names)
	}
	if st := h.r.Stats(); st != (Stats{Recorded: 6, Created: 2, Patched: 1}) {
		t.Errorf("stats %+v", st)
	}
}

// Records of one group are one Event whatever their notes: the first
// note stays (the API server keeps it immutable), the series counts them.
func TestGroup(t *testing.T) {
	h := start(t, "node-1", nil)
	h.r.RecordGroup("rule 900", Warning, "SplitFight", "Repair", "rule 900 undone by ip[1]")
	h.created(t, 1)
	h.r.RecordGroup("rule 900", Warning, "SplitFight", "Repair", "rule 900 undone by ip[2]")
	h.r.RecordGroup("table 900 10.0.0.0/16", Warning, "SplitFight", "Repair", "table 900 10.0.0.0/16 undone by ip[3]")
	h.created(t, 2)
	h.clock.Advance(DefaultMinInterval)
	h.writesAre(t, 3)
	w := h.api.writes()
	first := w[0].body["metadata"].(map[string]any)["name"].(string)
	if w[0].body["note"] != "rule 900 undone by ip[1]" || w[1].body["note"] != "table 900 10.0.0.0/16 undone by ip[3]" ||
		w[2].method != "PATCH" || !strings.HasSuffix(w[2].path, "/"+first) || h.api.count(first) != 2 {
		t.Errorf("writes %+v, want two Events, the first with a series of 2 and its first note", w)
	}
}

// 1,000 records of one Event in a minute are a handful of writes, the last
// with the whole count; 1,000 different Events in a minute are bounded by
// the token bucket and the pending bound.
func TestRateLimit(t *testing.T) {
	t.Run("one Event", func(t *testing.T) {
		h := start(t, "node-1", nil)
		for range 1000 {
			h.r.Record(Warning, "SplitFight", "Repair", "rule 900 undone again by ip")
			h.clock.Advance(60 * time.Millisecond)
		}
		eventually(t, "series count 1000", func() error {
			h.clock.Advance(time.Second)
			names := h.api.names()
			if len(names) != 1 || h.api.count(names[0]) != 1000 {
				return fmt.Errorf("Events %q", names)
			}
			return nil
		})
		n := len(h.api.writes())
		t.Logf("1000 records in a minute: %d writes", n)
		if n > 4 {
			t.Errorf("%d writes for 1000 records of one Event in a minute, want at most 4 (a create, then one per 30 s)", n)
		}
	})
	t.Run("different Events", func(t *testing.T) {
		h := start(t, "node-1", nil)
		for i := range 1000 {
			h.r.Record(Warning, "PassFailing", "Reconcile", fmt.Sprintf("failure %d", i))
			h.clock.Advance(60 * time.Millisecond)
		}
		if p := h.r.Pending(); p > DefaultMaxPending {
			t.Errorf("%d pending, want at most %d", p, DefaultMaxPending)
		}
		// Then the held Events are written at the bucket's pace: a burst of
		// 10, then one per 10 s.
		start := h.clock.Now().Add(-time.Minute)
		eventually(t, "the held Events written", func() error {
			h.clock.Advance(time.Second)
			if st := h.r.Stats(); st.Created+st.Dropped < 1000 {
				return fmt.Errorf("%+v", st)
			}
			return nil
		})
		took := h.clock.Now().Sub(start)
		n, st := len(h.api.writes()), h.r.Stats()
		t.Logf("1000 different Events in a minute: %+v; %d writes in %s", st, n, took)
		if limit := DefaultBurst + int(took/DefaultRefill) + 1; n > limit {
			t.Errorf("%d writes in %s, want at most %d", n, took, limit)
		}
		if st.Created < 10 || st.Dropped < 1000-DefaultMaxPending {
			t.Errorf("stats %+v: want the first 64 held and written, the rest dropped", st)
		}
	})
}

// An API server that hangs, then is down, costs Record nothing: records
// go on while a request hangs, at most MaxPending Events are held, the rest
// dropped and counted, the failure is logged once, and once the API server
// is back every held Event is written.
func TestAPIDown(t *testing.T) {
	h := start(t, "node-1", nil)
	release := make(chan struct{})
	var once sync.Once
	h.api.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
		<-release
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	h.r.Record(Normal, "SplitInstalled", "Install", "first")
	h.writesAre(t, 1) // hanging
	const n = 10000
	for i := range n {
		h.r.Record(Warning, "PassFailing", "Reconcile", fmt.Sprintf("failure %d", i))
	}
	if p := h.r.Pending(); p != DefaultMaxPending {
		t.Errorf("%d pending, want %d", p, DefaultMaxPending)
	}
	if st := h.r.Stats(); st.Dropped != n+1-DefaultMaxPending || st.Recorded != DefaultMaxPending {
		t.Errorf("stats %+v, want %d dropped, %d recorded", st, n+1-DefaultMaxPending, DefaultMaxPending)
	}
	once.Do(func() { close(release) }) // 503 from now on
	eventually(t, "failures counted", func() error {
		h.clock.Advance(10 * time.Second)
		h.r.Record(Warning, "PassFailing", "Reconcile", "failure 1")
		if st := h.r.Stats(); st.Failed < 5 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	if c := strings.Count(h.log.String(), "cannot record Events"); c != 1 {
		t.Errorf("the failure logged %d times, want once:\n%s", c, h.log)
	}
	if writes, st := len(h.api.writes()), h.r.Stats(); uint64(writes) > st.Failed+1 {
		t.Errorf("%d requests for %d failures: retries beyond the back-off", writes, st.Failed)
	}
	h.api.setAnswer(nil)
	eventually(t, "every held Event written", func() error {
		h.clock.Advance(10 * time.Second)
		if st := h.r.Stats(); st.Created != DefaultMaxPending {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	if !strings.Contains(h.log.String(), "Events are recorded again") {
		t.Errorf("no line saying Events are recorded again:\n%s", h.log)
	}
}

// A 403 is logged once, not per Event, and the refused Events are
// dropped; a refusal after an accepted Event is logged again.
func TestRefused(t *testing.T) {
	h := start(t, "node-1", nil)
	var refuse = true
	var mu sync.Mutex
	h.api.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		defer mu.Unlock()
		if !refuse {
			return false
		}
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte(`{"kind":"Status","reason":"Forbidden","code":403,"message":"events.events.k8s.io is forbidden: User \"system:serviceaccount:kube-system:marksplit\" cannot create resource \"events\"\n in API group \"events.k8s.io\" in the namespace \"default\""}`))
		return true
	})
	for i := range 20 {
		h.r.Record(Warning, "PassFailing", "Reconcile", fmt.Sprintf("failure %d", i))
		h.clock.Advance(5 * time.Second)
	}
	eventually(t, "refusals", func() error {
		h.clock.Advance(5 * time.Second)
		if st := h.r.Stats(); st.Refused < 3 || h.r.Pending() != 0 {
			return fmt.Errorf("%+v, %d pending", st, h.r.Pending())
		}
		return nil
	})
	logged := h.log.String()
	if c := strings.Count(logged, "refuses Events"); c != 1 || !strings.Contains(logged, `403 Forbidden: events.events.k8s.io is forbidden`) {
		t.Errorf("the refusal logged %d times, want once with the message:\n%s", c, logged)
	}
	if st := h.r.Stats(); st.Dropped != 20 || st.Created != 0 {
		t.Errorf("stats %+v, want the 20 refused Events dropped", st)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	h.clock.Advance(5 * time.Minute)
	h.r.Record(Normal, "SplitInstalled", "Install", "ok")
	eventually(t, "an Event accepted", func() error {
		if st := h.r.Stats(); st.Created != 1 {
			return fmt.Errorf("%+v", st)
		}
		return nil
	})
	mu.Lock()
	refuse = true
	mu.Unlock()
	h.r.Record(Normal, "SplitRemoved", "Remove", "ok")
	eventually(t, "the refusal logged again", func() error {
		if c := strings.Count(h.log.String(), "refuses Events"); c != 2 {
			return fmt.Errorf("logged %d times", c)
		}
		return nil
	})
}

// Hostile input and answers cost a bounded amount: a long note with control
// characters and invalid UTF-8 becomes one valid line of at most 1 kB; a
// long node name still makes a valid Event name; a huge error answer is one
// short log line; a server that never answers costs RequestTimeout; an
// Event that expired is created again.
func TestHostile(t *testing.T) {
	t.Run("note and name", func(t *testing.T) {
		node := strings.Repeat("a", 62) + "." + strings.Repeat("b", 62) + "." + strings.Repeat("c", 62) + "." + strings.Repeat("d", 61) + "-x"
		h := start(t, node, nil)
		h.r.Record(Warning, "SplitFight", "Repair", strings.Repeat("x\n\x1b[31m\xff", 100000))
		h.writesAre(t, 1)
		b := h.api.writes()[0].body
		note := b["note"].(string)
		name := b["metadata"].(map[string]any)["name"].(string)
		if len(note) > maxNote || !utf8.ValidString(note) || strings.ContainsAny(note, "\n\x1b") {
			t.Errorf("note of %d bytes: %q", len(note), note)
		}
		if len(name) > 253 || !nameRE.MatchString(name) {
			t.Errorf("name %q (%d bytes) is no DNS subdomain of at most 253", name, len(name))
		}
		if inst := b["reportingInstance"].(string); len(inst) > maxInstance {
			t.Errorf("reportingInstance of %d bytes", len(inst))
		}
	})
	t.Run("invalid records", func(t *testing.T) {
		h := start(t, "node-1", nil)
		h.r.Record("Bad", "SplitFight", "Repair", "x")
		h.r.Record(Normal, "not camel", "Repair", "x")
		h.r.Record(Normal, "SplitFight", "", "x")
		if st := h.r.Stats(); st.Dropped != 3 || st.Recorded != 0 || h.r.Pending() != 0 {
			t.Errorf("stats %+v, want 3 dropped", st)
		}
		var nilRecorder *Recorder
		nilRecorder.Record(Normal, "SplitFight", "Repair", "x") // no panic
	})
	t.Run("huge error answer", func(t *testing.T) {
		h := start(t, "node-1", nil)
		h.api.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
			w.WriteHeader(http.StatusInternalServerError)
			for range 1000 { // 10 MB
				w.Write(bytes.Repeat([]byte("boom\n"), 2000))
			}
			return true
		})
		h.r.Record(Warning, "SplitFight", "Repair", "x")
		// The failure is counted before it is logged: wait for both.
		eventually(t, "a failure, logged", func() error {
			if st := h.r.Stats(); st.Failed != 1 || !strings.Contains(h.log.String(), "500 Internal Server Error") {
				return fmt.Errorf("%+v, log %.200q", st, h.log.String())
			}
			return nil
		})
		if l := h.log.String(); len(l) > 1000 || !strings.Contains(l, "500 Internal Server Error: boom boom") {
			t.Errorf("log of %d bytes, want one short line: %.2000s", len(l), l)
		}
	})
	t.Run("no answer", func(t *testing.T) {
		stop := make(chan struct{})
		h := start(t, "node-1", func(c *Config) { c.RequestTimeout = 100 * time.Millisecond })
		t.Cleanup(func() { close(stop) })
		h.api.setAnswer(func(w http.ResponseWriter, r *http.Request) bool {
			select {
			case <-stop:
			case <-r.Context().Done():
			}
			return true
		})
		h.r.Record(Warning, "SplitFight", "Repair", "x")
		eventually(t, "the request timed out", func() error {
			if st := h.r.Stats(); st.Failed != 1 {
				return fmt.Errorf("%+v", st)
			}
			return nil
		})
	})
	t.Run("expired Event", func(t *testing.T) {
		h := start(t, "node-1", nil)
		h.r.Record(Warning, "SplitFight", "Repair", "x")
		h.created(t, 1)
		first := h.api.names()[0]
		h.api.mu.Lock()
		delete(h.api.events, first) // the API server's TTL
		h.api.mu.Unlock()
		h.r.Record(Warning, "SplitFight", "Repair", "x")
		h.clock.Advance(DefaultMinInterval)
		h.writesAre(t, 3) // the PATCH answered 404, then a new create
		names := h.api.names()
		if len(names) != 1 || names[0] == first || h.api.count(names[0]) != 2 {
			t.Errorf("Events %q (count %d), want a new one with count 2", names, h.api.count(names[0]))
		}
	})
}
