package kubewatch

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

const (
	testName       = "marksplit-uninstall"
	testCollection = "/api/v1/namespaces/kube-system/configmaps"
)

// fakeAPI serves a list and a watch of one ConfigMap the way kube-apiserver does, on an
// apitest server (which checks the token), with hooks to answer otherwise.
type fakeAPI struct {
	t   *testing.T
	srv *apitest.Server

	mu       sync.Mutex
	rv       int
	exists   bool
	data     string // the object's data, JSON; "" for {"why":"uninstall"}
	watchers map[chan string]bool
	// list, when set, answers a list instead; watch, a watch.
	list  func(w http.ResponseWriter, r *http.Request)
	watch func(w http.ResponseWriter, r *http.Request)
	// requests made: "list" or "watch rv=N"
	requests []string
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{t: t, rv: 100, watchers: map[chan string]bool{}}
	f.srv = apitest.New(t, apitest.Options{Token: "tok", HTTP1: true}) // as the server these tests were written against
	f.srv.Handle(testCollection, http.HandlerFunc(f.serve))
	return f
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != testCollection || r.URL.Query().Get("fieldSelector") != "metadata.name="+testName ||
		r.Header.Get("Authorization") != "Bearer tok" {
		http.Error(w, "bad request "+r.URL.String(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	watch := r.URL.Query().Get("watch") == "1"
	hook := f.list
	if watch {
		hook = f.watch
		f.requests = append(f.requests, "watch rv="+r.URL.Query().Get("resourceVersion"))
	} else {
		f.requests = append(f.requests, "list")
	}
	f.mu.Unlock()
	if hook != nil {
		hook(w, r)
		return
	}
	if watch {
		f.serveWatch(w, r)
		return
	}
	f.mu.Lock()
	items := ""
	if f.exists {
		items = f.object()
	}
	body := fmt.Sprintf(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"%d"},"items":[%s]}`, f.rv, items)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, body)
}

// object is the ConfigMap at the current resourceVersion; f.mu held.
func (f *fakeAPI) object() string {
	data := f.data
	if data == "" {
		data = `{"why":"uninstall"}`
	}
	return fmt.Sprintf(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":"kube-system","resourceVersion":"%d"},"data":%s}`, testName, f.rv, data)
}

// modify changes the existing ConfigMap's data and sends the MODIFIED event.
func (f *fakeAPI) modify(data string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	f.data = data
	f.broadcast(fmt.Sprintf(`{"type":"MODIFIED","object":%s}`, f.object()))
}

func (f *fakeAPI) serveWatch(w http.ResponseWriter, r *http.Request) {
	ch := make(chan string, 16)
	f.mu.Lock()
	f.watchers[ch] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.watchers, ch)
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-ch:
			if !ok {
				return
			}
			fmt.Fprintln(w, ev)
			w.(http.Flusher).Flush()
		}
	}
}

// set creates or deletes the ConfigMap and sends the event to every watch.
func (f *fakeAPI) set(exists bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	typ := "ADDED"
	if !exists {
		typ = "DELETED"
	}
	f.rv++
	f.exists = exists
	f.broadcast(fmt.Sprintf(`{"type":%q,"object":%s}`, typ, f.object()))
}

// broadcast sends a raw event line to every watch; f.mu held.
func (f *fakeAPI) broadcast(ev string) {
	for ch := range f.watchers {
		ch <- ev
	}
}

func (f *fakeAPI) send(ev string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broadcast(ev)
}

// closeWatches ends every watch cleanly.
func (f *fakeAPI) closeWatches() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.watchers {
		close(ch)
		delete(f.watchers, ch)
	}
}

func (f *fakeAPI) watching() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.watchers)
}

func (f *fakeAPI) count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.requests {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

func (f *fakeAPI) setHooks(list, watch func(http.ResponseWriter, *http.Request)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list, f.watch = list, watch
}

// syncLog collects log lines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns the lines with slog's quoting of '"' undone, for matching.
func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.ReplaceAll(l.b.String(), `\"`, `"`)
}

// run is a running Watcher and what it reported.
type run struct {
	states chan State
	log    *syncLog
}

func startWatcher(t *testing.T, f *fakeAPI, tweak func(*Config)) *run {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &run{states: make(chan State, 100), log: &syncLog{}}
	client := f.srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	cfg := Config{
		Client:       kubeapi.Client{Server: f.srv.URL(), TokenFile: tok, HTTP: client},
		APIVersion:   "v1",
		Kind:         "ConfigMap",
		Collection:   testCollection,
		Name:         testName,
		WatchTimeout: 5 * time.Second,
		Backoff:      backoff.NewConstantBackOff(10 * time.Millisecond),
		Logger:       slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx, func(s State) { r.states <- s }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Error("Run did not return within 2 min of its context's end")
		}
		if t.Failed() {
			t.Logf("log:\n%s", r.log)
		}
	})
	return r
}

// next returns the next reported state, failing after 2 min.
func (r *run) next(t *testing.T) State {
	t.Helper()
	select {
	case s := <-r.states:
		return s
	case <-time.After(2 * time.Minute):
		t.Fatal("no state reported within 2 min")
		return Unknown
	}
}

// none checks that nothing more was reported by the time cond holds.
func (r *run) none(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitFor(t, what, cond)
	select {
	case s := <-r.states:
		t.Fatalf("reported %v, want nothing", s)
	default:
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 2 min", what)
		}
		<-tick.C
	}
}

func TestFollowsCreateAndDelete(t *testing.T) {
	f := newFakeAPI(t)
	r := startWatcher(t, f, nil)
	if got := r.next(t); got != Absent {
		t.Fatalf("first state %v, want absent", got)
	}
	waitFor(t, "a watch", func() bool { return f.watching() == 1 })
	f.set(true)
	if got := r.next(t); got != Present {
		t.Fatalf("after create: %v, want present", got)
	}
	f.set(false)
	if got := r.next(t); got != Absent {
		t.Fatalf("after delete: %v, want absent", got)
	}
	// A clean end of the watch resumes it from the last resourceVersion, without a list.
	f.closeWatches()
	waitFor(t, "the watch resumed", func() bool { return f.count("watch rv=102") == 1 })
	if got := f.count("list"); got != 1 {
		t.Errorf("%d lists, want 1", got)
	}
	f.set(true)
	if got := r.next(t); got != Present {
		t.Fatalf("after create on the resumed watch: %v, want present", got)
	}
}

func TestFirstListFailsThenPresent(t *testing.T) {
	f := newFakeAPI(t)
	f.exists = true
	// The fourth list waits in the server until the test has counted: the
	// loop logs each failure before it lists again, so when the fourth
	// list arrives the first three failures are all in the log, and no
	// other is.
	var lists atomic.Int32
	fourth, release := make(chan struct{}), make(chan struct{})
	f.setHooks(func(w http.ResponseWriter, _ *http.Request) {
		if lists.Add(1) == 4 {
			close(fourth)
			<-release
		}
		http.Error(w, `{"kind":"Status","message":"configmaps \"marksplit-uninstall\" is forbidden","reason":"Forbidden","code":403}`, http.StatusForbidden)
	}, nil)
	r := startWatcher(t, f, nil)
	if got := r.next(t); got != Unknown {
		t.Fatalf("first state %v, want unknown", got)
	}
	// Unknown is reported after the warning that says why, for the user's own line to
	// point at it.
	if !strings.Contains(r.log.String(), "is forbidden; not known yet") {
		t.Errorf("Unknown reported before the warning:\n%s", r.log)
	}
	select {
	case <-fourth:
	case <-time.After(2 * time.Minute):
		close(release)
		t.Fatal("no fourth list within 2 min")
	}
	if got := strings.Count(r.log.String(), `kubewatch: list ConfigMap kube-system/marksplit-uninstall: 403 Forbidden: configmaps "marksplit-uninstall" is forbidden`); got != 3 {
		t.Errorf("%d warnings naming the 403 after 3 failed lists, want one per failed list:\n%s", got, r.log)
	}
	select {
	case s := <-r.states:
		t.Fatalf("reported %v again while the list fails, want Unknown once", s)
	default:
	}
	f.setHooks(nil, nil)
	close(release) // the fourth list fails too; the fifth gets the ConfigMap
	if got := r.next(t); got != Present {
		t.Fatalf("after the API answers: %v, want present", got)
	}
}

// After a good list the state stands through failures of every kind.
func TestLastStateStands(t *testing.T) {
	f := newFakeAPI(t)
	f.exists = true
	r := startWatcher(t, f, func(c *Config) { c.Resync = 50 * time.Millisecond })
	if got := r.next(t); got != Present {
		t.Fatalf("first state %v, want present", got)
	}
	fail := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "etcd down", http.StatusInternalServerError)
	}
	f.setHooks(fail, fail)
	before := f.count("list")
	f.closeWatches()
	r.none(t, "lists fail", func() bool { return f.count("list") >= before+3 })
	f.setHooks(nil, nil)
	f.mu.Lock()
	f.exists, f.rv = false, f.rv+1
	f.mu.Unlock()
	if got := r.next(t); got != Absent {
		t.Fatalf("after the API answers again, deleted meanwhile: %v, want absent", got)
	}
	if !strings.Contains(r.log.String(), "keeping it present") {
		t.Errorf("no warning says the last state stands:\n%s", r.log)
	}
}

func TestGoneLists(t *testing.T) {
	f := newFakeAPI(t)
	r := startWatcher(t, f, nil)
	if got := r.next(t); got != Absent {
		t.Fatalf("first state %v, want absent", got)
	}
	waitFor(t, "a watch", func() bool { return f.watching() == 1 })
	f.mu.Lock()
	f.exists, f.rv = true, f.rv+5 // created while the watch could not see it
	f.broadcast(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 100 (105)","reason":"Expired","code":410}}`)
	f.mu.Unlock()
	if got := r.next(t); got != Present {
		t.Fatalf("after 410: %v, want present (from a new list)", got)
	}
	if got := f.count("list"); got != 2 {
		t.Errorf("%d lists, want 2", got)
	}
}

func TestSilentWatchRestarted(t *testing.T) {
	f := newFakeAPI(t)
	r := startWatcher(t, f, func(c *Config) { c.WatchTimeout = 100 * time.Millisecond })
	if got := r.next(t); got != Absent {
		t.Fatalf("first state %v, want absent", got)
	}
	r.none(t, "three watches", func() bool { return f.count("watch") >= 3 })
	if !strings.Contains(r.log.String(), "no complete event for 100ms") {
		t.Errorf("no warning about the silent watch:\n%s", r.log)
	}
}

// Hostile or broken list answers fail the list with a clear error and bounded cost.
func TestHostileLists(t *testing.T) {
	item := func(name string) string {
		return `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"` + name + `","resourceVersion":"7"}}`
	}
	huge := `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"` + testName + `"},"data":{"x":"` + strings.Repeat("a", MaxBody) + `"}}]}`
	for _, tc := range []struct {
		name, body, want string
	}{
		{"not JSON", `<html>proxy error</html>`, "decode ConfigMapList"},
		{"wrong kind", `{"kind":"SecretList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`, `got "v1" "SecretList"`},
		{"no resourceVersion", `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[]}`, "without metadata.resourceVersion"},
		{"two items", `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[` + item(testName) + `,` + item(testName) + `]}`, "2 items for one name"},
		{"another name", `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[` + item("other") + `]}`, `got ConfigMap "other"`},
		{"larger than MaxBody", huge, "answer larger than " + strconv.Itoa(MaxBody) + " bytes"},
		{"items not an array", `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":{}}`, "items: not an array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			f.setHooks(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, tc.body) }, nil)
			r := startWatcher(t, f, nil)
			if got := r.next(t); got != Unknown {
				t.Fatalf("state %v, want unknown", got)
			}
			waitFor(t, "the warning", func() bool { return strings.Contains(r.log.String(), tc.want) })
			if f.count("watch") != 0 {
				t.Error("watched after a bad list")
			}
		})
	}
}

// Hostile or broken watch events end the watch; the state changes only on a trusted one.
func TestHostileEvents(t *testing.T) {
	for _, tc := range []struct {
		name, event, want string
		lists             bool // the event is not to be trusted: list again
	}{
		{"another name", `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"other","resourceVersion":"200"}}}`, `got ConfigMap "other"`, true},
		{"wrong kind", `{"type":"ADDED","object":{"kind":"Secret","apiVersion":"v1","metadata":{"name":"` + testName + `","resourceVersion":"200"}}}`, `got "v1" "Secret"`, true},
		{"no resourceVersion", `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"` + testName + `"}}}`, "ADDED event without metadata.resourceVersion", true},
		{"unknown type", `{"type":"EXPLODED","object":{}}`, `unknown event type "EXPLODED"`, true},
		{"garbage", `}}}`, "decode event", false},
		{"wrong field type", `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":7}}}`, "decode event", true},
		{"ERROR without Status", `{"type":"ERROR","object":{}}`, "ERROR event without a Status", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			r := startWatcher(t, f, nil)
			if got := r.next(t); got != Absent {
				t.Fatalf("first state %v, want absent", got)
			}
			waitFor(t, "a watch", func() bool { return f.watching() == 1 })
			f.send(tc.event)
			r.none(t, "the warning", func() bool { return strings.Contains(r.log.String(), tc.want) })
			waitFor(t, "a new watch", func() bool { return f.count("watch") >= 2 })
			wantLists := 1
			if tc.lists {
				wantLists = 2
			}
			if got := f.count("list"); got != wantLists {
				t.Errorf("%d lists, want %d", got, wantLists)
			}
			waitFor(t, "the new watch", func() bool { return f.watching() == 1 })
			f.set(true)
			if got := r.next(t); got != Present {
				t.Fatalf("after a good event: %v, want present", got)
			}
		})
	}
}

// An event that never ends fails the watch once it has taken a bounded amount of input.
func TestEndlessEvent(t *testing.T) {
	f := newFakeAPI(t)
	f.setHooks(nil, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"type":"ADDED","object":{"data":"`)
		chunk := []byte(strings.Repeat("a", 64<<10))
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	ct := &countingTransport{rt: f.srv.Client().Transport}
	r := startWatcher(t, f, func(c *Config) { c.Client.HTTP = &http.Client{Transport: ct} })
	if got := r.next(t); got != Absent {
		t.Fatalf("first state %v, want absent", got)
	}
	r.none(t, "the warning", func() bool { return strings.Contains(r.log.String(), "an event larger than") })
	f.setHooks(nil, nil)
	// What the watcher read of the endless answer: the limit, plus at most one read.
	read := ct.read.Load()
	t.Logf("the watcher read %d bytes (%.2f MaxBody) of the endless event", read, float64(read)/MaxBody)
	if read > 2*MaxBody+1<<20 {
		t.Errorf("the watcher read %d bytes of one event, want at most %d", read, 2*MaxBody+1<<20)
	}
}

// countingTransport counts the bytes read of every response body.
type countingTransport struct {
	rt   http.RoundTripper
	read atomic.Int64
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err == nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, n: &c.read}
	}
	return resp, err
}

type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func TestNewRefuses(t *testing.T) {
	good := Config{
		Client:     kubeapi.Client{Server: "https://127.0.0.1:6443", TokenFile: "/token", HTTP: http.DefaultClient},
		APIVersion: "v1", Kind: "ConfigMap", Collection: testCollection, Name: testName,
	}
	if _, err := New(good); err != nil {
		t.Fatalf("New(good): %v", err)
	}
	for _, tc := range []struct {
		name  string
		tweak func(*Config)
		want  string
	}{
		{"http server", func(c *Config) { c.Client.Server = "http://127.0.0.1:6443" }, "want https://host:port"},
		{"no client", func(c *Config) { c.Client.HTTP = nil }, "no HTTP client"},
		{"no token file", func(c *Config) { c.Client.TokenFile = "" }, "no token file"},
		{"bad name", func(c *Config) { c.Name = "Marksplit_Uninstall" }, "not a DNS subdomain"},
		{"empty name", func(c *Config) { c.Name = "" }, "want 1 to 253"},
		{"name with a dot at the end", func(c *Config) { c.Name = "a." }, "not a DNS subdomain"},
		{"no collection", func(c *Config) { c.Collection = "" }, "Collection (a path) are required"},
		{"negative resync", func(c *Config) { c.Resync = -1 }, "negative Resync"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.tweak(&c)
			_, err := New(c)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "kubewatch: ") {
				t.Errorf("New: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
