package ciliumnode

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/marksplit/marksplit/internal/apitest"
	"go.uber.org/goleak"
)

// waitFor bounds every wait in the tests; nothing takes that long unless something is broken.
const waitFor = 2 * time.Minute

const testNode = "worker-1"

// fakeAPI is an apitest server for one CiliumNode whose every answer the test gives. The
// server checks the bearer token (answering 401 with a Status, like the real one) and hands
// every authorized request to the test as an exchange, which the test answers step by step:
// a CiliumNode, a Status, a watch stream of newline-delimited events, a clean end, a dropped
// connection, or nothing at all.
type fakeAPI struct {
	srv    *apitest.Server
	calls  chan *exchange
	denied chan struct{} // one buffered signal per burst of 401 answers
}

func newFakeAPI(t *testing.T, http1 bool) *fakeAPI {
	t.Helper()
	f := &fakeAPI{calls: make(chan *exchange), denied: make(chan struct{}, 1)}
	f.srv = apitest.New(t, apitest.Options{Token: "token-1", HTTP1: http1}) // HTTP/2 unless http1, as the real one
	for _, k := range []apitest.Kind{apitest.KindGet, apitest.KindWatchOne, apitest.KindListOne, apitest.KindList,
		apitest.KindWatch, apitest.KindTokenReview, apitest.KindAccessReview, apitest.KindOther} {
		f.srv.Intercept(k, f.exchange)
	}
	f.srv.Intercept(apitest.KindUnauthorized, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		next.ServeHTTP(w, r)
		select {
		case f.denied <- struct{}{}:
		default:
		}
	})
	return f
}

// setToken makes the server accept only token from now on.
func (f *fakeAPI) setToken(token string) { f.srv.SetToken(token) }

// served is the number of requests the server received, refused ones included.
func (f *fakeAPI) served() int {
	n := 0
	for _, c := range f.srv.Counts() {
		n += c
	}
	return n
}

// exchange hands an authorized request to the test and runs its answer.
func (f *fakeAPI) exchange(w http.ResponseWriter, r *http.Request, _ http.Handler) {
	x := &exchange{req: r, cmds: make(chan func(http.ResponseWriter)), done: make(chan struct{})}
	defer close(x.done)
	select {
	case f.calls <- x:
	case <-r.Context().Done():
		return
	}
	for {
		select {
		case cmd, ok := <-x.cmds:
			if !ok {
				return
			}
			cmd(w)
		case <-r.Context().Done():
			return
		}
	}
}

func writeJSON(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

// next returns the next authorized request.
func (f *fakeAPI) next(t *testing.T) *exchange {
	t.Helper()
	select {
	case x := <-f.calls:
		x.t = t
		return x
	case <-time.After(waitFor):
		t.Fatalf("no request within %v", waitFor)
		return nil
	}
}

// expectGet returns the next request and checks that it GETs the CiliumNode.
func (f *fakeAPI) expectGet(t *testing.T) *exchange {
	t.Helper()
	x := f.next(t)
	if x.req.URL.Path != "/apis/cilium.io/v2/ciliumnodes/"+testNode || x.req.URL.RawQuery != "" {
		t.Fatalf("got %s %s, want GET of the CiliumNode", x.req.Method, x.req.URL)
	}
	x.checkCommon()
	return x
}

// expectWatch returns the next request and checks that it watches the CiliumNode from rv.
func (f *fakeAPI) expectWatch(t *testing.T, rv string) *exchange {
	t.Helper()
	x := f.next(t)
	if x.req.URL.Path != "/apis/cilium.io/v2/ciliumnodes" {
		t.Fatalf("got %s %s, want a watch from resourceVersion %s", x.req.Method, x.req.URL, rv)
	}
	want := url.Values{
		"watch":               {"1"},
		"fieldSelector":       {"metadata.name=" + testNode},
		"resourceVersion":     {rv},
		"allowWatchBookmarks": {"true"},
	}
	if diff := cmp.Diff(want, x.req.URL.Query()); diff != "" {
		t.Fatalf("watch query mismatch (-want +got):\n%s", diff)
	}
	x.checkCommon()
	return x
}

// noCall checks that no authorized request is waiting.
func (f *fakeAPI) noCall(t *testing.T) {
	t.Helper()
	select {
	case x := <-f.calls:
		t.Fatalf("unexpected request %s", x.req.URL)
	default:
	}
}

// exchange is one request in flight; the test drives its answer.
type exchange struct {
	t    *testing.T
	req  *http.Request
	cmds chan func(http.ResponseWriter) // run by the handler's goroutine
	done chan struct{}                  // closed when the handler returns
	once sync.Once
}

func (x *exchange) checkCommon() {
	x.t.Helper()
	if x.req.Method != http.MethodGet {
		x.t.Errorf("method %s, want GET", x.req.Method)
	}
	if got := x.req.Header.Get("Accept"); got != "application/json" {
		x.t.Errorf("Accept %q, want application/json", got)
	}
}

func (x *exchange) token() string { return x.req.Header.Get("Authorization") }

func (x *exchange) do(cmd func(http.ResponseWriter)) {
	x.t.Helper()
	select {
	case x.cmds <- cmd:
	case <-x.done:
		x.t.Fatalf("%s: the client hung up early", x.req.URL)
	case <-time.After(waitFor):
		x.t.Fatalf("%s: handler stuck", x.req.URL)
	}
}

// reply answers with code and body and completes the request.
func (x *exchange) reply(code int, body string) {
	x.t.Helper()
	x.do(func(w http.ResponseWriter) { writeJSON(w, code, body) })
	x.end()
}

// status answers with a Status object.
func (x *exchange) status(code int, reason, message string) {
	x.t.Helper()
	x.reply(code, statusJSON(code, reason, message))
}

// start sends the 200 header of a watch stream.
func (x *exchange) start() {
	x.t.Helper()
	x.do(func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
	})
}

// send writes raw bytes to the stream.
func (x *exchange) send(s string) {
	x.t.Helper()
	x.do(func(w http.ResponseWriter) {
		_, _ = io.WriteString(w, s)
		w.(http.Flusher).Flush()
	})
}

// event writes one watch event.
func (x *exchange) event(typ, object string) {
	x.t.Helper()
	x.send(`{"type":"` + typ + `","object":` + object + "}\n")
}

// end completes the response cleanly (a watch the server ends, as on its timeout).
func (x *exchange) end() {
	x.t.Helper()
	x.once.Do(func() { close(x.cmds) })
	x.waitDone()
}

// drop breaks the connection (HTTP/1.1) or resets the stream (HTTP/2) mid-response.
func (x *exchange) drop() {
	x.t.Helper()
	x.do(func(w http.ResponseWriter) {
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	x.waitDone()
}

// replySlowly is reply for a body the client takes long to read (tens of MiB under the
// race detector on a loaded machine): it waits a minute for the handler to return.
func (x *exchange) replySlowly(code int, body string) {
	x.t.Helper()
	x.do(func(w http.ResponseWriter) { writeJSON(w, code, body) })
	x.once.Do(func() { close(x.cmds) })
	x.waitDoneWithin(time.Minute)
}

// waitDone waits until the handler has returned (the client may have hung up).
func (x *exchange) waitDone() {
	x.t.Helper()
	x.waitDoneWithin(waitFor)
}

func (x *exchange) waitDoneWithin(d time.Duration) {
	x.t.Helper()
	select {
	case <-x.done:
	case <-time.After(d):
		x.t.Fatalf("%s: request still open after %v", x.req.URL, d)
	}
}

// node returns a CiliumNode shaped like those of a Cilium 1.19 cluster: encrypting
// (.spec.encryption.key 255) unless an edit changes it. Both shapes carry the WireGuard
// public-key annotation.
func node(rv string, edits ...func(map[string]any)) string {
	n := map[string]any{
		"apiVersion": "cilium.io/v2",
		"kind":       "CiliumNode",
		"metadata": map[string]any{
			"name":              testNode,
			"uid":               "7f7c2b0e-3f52-4a7e-9a53-1d2f0f4b6c11",
			"resourceVersion":   rv,
			"generation":        3,
			"creationTimestamp": "2025-06-02T09:14:11Z",
			"labels": map[string]any{
				"kubernetes.io/arch":     "amd64",
				"kubernetes.io/hostname": testNode,
				"kubernetes.io/os":       "linux",
			},
			"annotations": map[string]any{
				"network.cilium.io/wg-pub-key": "hV2a7m1yqk7wEe0y2m8bq3M0X1xv8cJ9l1rZ7j0kqGo=",
			},
			"ownerReferences": []any{map[string]any{
				"apiVersion": "v1", "kind": "Node", "name": testNode,
				"uid": "0b6e8c54-6a3f-4f0e-8d51-2d1f3c9a7e20",
			}},
		},
		"spec": map[string]any{
			"addresses": []any{
				map[string]any{"type": "InternalIP", "ip": "10.0.0.5"},
				map[string]any{"type": "CiliumInternalIP", "ip": "10.244.1.94"},
			},
			"alibaba-cloud": map[string]any{},
			"azure":         map[string]any{},
			"bootid":        "2f3c6c0e-1d7a-4b8e-9d0c-5a1b2c3d4e5f",
			"encryption":    map[string]any{"key": 255},
			"eni":           map[string]any{},
			"health":        map[string]any{"ipv4": "10.244.1.23"},
			"ingress":       map[string]any{},
			"ipam":          map[string]any{"podCIDRs": []any{"10.244.1.0/24"}, "pools": map[string]any{}},
		},
		"status": map[string]any{
			"alibaba-cloud": map[string]any{},
			"azure":         map[string]any{},
			"eni":           map[string]any{},
			"ipam":          map[string]any{"operator-status": map[string]any{}},
		},
	}
	for _, edit := range edits {
		edit(n)
	}
	return mustJSON(n)
}

func spec(n map[string]any) map[string]any     { return n["spec"].(map[string]any) }
func metadata(n map[string]any) map[string]any { return n["metadata"].(map[string]any) }

// optedOut is the shape of a node opted out of node encryption: no key at all.
func optedOut(n map[string]any) { spec(n)["encryption"] = map[string]any{} }

func key(v any) func(map[string]any) {
	return func(n map[string]any) { spec(n)["encryption"] = map[string]any{"key": v} }
}

func named(name string) func(map[string]any) {
	return func(n map[string]any) { metadata(n)["name"] = name }
}

func typed(apiVersion, kind string) func(map[string]any) {
	return func(n map[string]any) { n["apiVersion"], n["kind"] = apiVersion, kind }
}

func noResourceVersion(n map[string]any) { delete(metadata(n), "resourceVersion") }

func noSpec(n map[string]any) { delete(n, "spec") }

// newPubKey changes the annotation, as a key rotation would; it says nothing about the mode.
func newPubKey(n map[string]any) {
	a := maps.Clone(metadata(n)["annotations"].(map[string]any))
	a["network.cilium.io/wg-pub-key"] = "Q0l4kq1T9m0b7o2xZ8wE3r5t6y7u8i9o0p1a2s3d4f0="
	metadata(n)["annotations"] = a
}

// bookmark is the object of a BOOKMARK event: only the kind and a resourceVersion.
func bookmark(rv string) string {
	return `{"kind":"CiliumNode","apiVersion":"cilium.io/v2","metadata":{"resourceVersion":"` + rv + `","creationTimestamp":null}}`
}

// statusJSON is a Status object as the API server sends in error answers and ERROR events.
func statusJSON(code int, reason, message string) string {
	return mustJSON(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": message, "reason": reason, "code": code,
	})
}

const forbidden = `ciliumnodes.cilium.io "worker-1" is forbidden: User "system:serviceaccount:kube-system:marksplit" cannot get resource "ciliumnodes" in API group "cilium.io" at the cluster scope`

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// harness runs a Source against a fakeAPI.
type harness struct {
	t         *testing.T
	api       *fakeAPI
	src       *Source
	reports   chan Mode
	logs      *logBuffer
	tokenFile string
}

type setup struct {
	http1 bool          // serve HTTP/1.1 only
	cfg   func(*Config) // edits the Config before New
}

// start serves a fakeAPI and runs a Source against it until the test ends, with fakeConfig
// and token-1 unless s.cfg edits it.
func start(t *testing.T, s setup) *harness {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	h := &harness{
		t:         t,
		api:       newFakeAPI(t, s.http1),
		reports:   make(chan Mode, 64),
		logs:      &logBuffer{},
		tokenFile: filepath.Join(t.TempDir(), "token"),
	}
	h.writeToken("token-1")
	cfg := fakeConfig(t, h.api, h.tokenFile, h.logs)
	if s.cfg != nil {
		s.cfg(&cfg)
	}
	src, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.src = src
	runInBackground(t, func(ctx context.Context) error { return src.Run(ctx, func(m Mode) { h.reports <- m }) })
	return h
}

// fakeConfig is the Config of the tests against api: its CA, the token in tokenFile,
// retries after 1 ms, no resync and no watch timeout during a test, logs at debug level.
func fakeConfig(t *testing.T, api *fakeAPI, tokenFile string, logs *logBuffer) Config {
	t.Helper()
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	writeFile(t, caFile, api.srv.CAPEM())
	return Config{
		Server:         api.srv.URL(),
		NodeName:       testNode,
		TokenFile:      tokenFile,
		CAFile:         caFile,
		Resync:         time.Hour,
		WatchTimeout:   time.Hour,
		RequestTimeout: waitFor,
		Backoff:        backoff.NewConstantBackOff(time.Millisecond),
		Logger:         slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// runInBackground runs run until the test ends, then cancels its context and checks that
// it returns nil within waitFor.
func runInBackground(t *testing.T, run func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v, want nil", err)
			}
		case <-time.After(waitFor):
			t.Errorf("Run still running %v after its context ended", waitFor)
		}
	})
}

// writeToken replaces the token file the way the kubelet does: a new file renamed into place.
func (h *harness) writeToken(token string) {
	h.t.Helper()
	tmp := h.tokenFile + ".new"
	writeFile(h.t, tmp, []byte(token+"\n"))
	if err := os.Rename(tmp, h.tokenFile); err != nil {
		h.t.Fatal(err)
	}
}

func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// goodStart answers the first GET with an encrypting node at resourceVersion 100 and returns
// the watch that follows.
func (h *harness) goodStart() *exchange {
	h.t.Helper()
	h.api.expectGet(h.t).reply(http.StatusOK, node("100"))
	return h.api.expectWatch(h.t, "100")
}

// reported returns the modes reported so far. Run reports before it sends its next request,
// so after receiving a request this is complete.
func (h *harness) reported() []Mode {
	var got []Mode
	for {
		select {
		case m := <-h.reports:
			got = append(got, m)
		default:
			return got
		}
	}
}

func (h *harness) wantReported(want ...Mode) {
	h.t.Helper()
	if diff := cmp.Diff(want, h.reported(), cmpopts.EquateEmpty()); diff != "" {
		h.t.Errorf("reported modes (-want +got):\n%s", diff)
	}
}

func (h *harness) wantStats(want Stats) {
	h.t.Helper()
	h.checkStats(want, h.src.Stats())
}

// wantStatsTimed is wantStats for tests with short timeouts: a timeout may fire again before
// the test takes the next request, so WatchRestart and NetworkError may exceed want.
func (h *harness) wantStatsTimed(want Stats) {
	h.t.Helper()
	got := h.src.Stats()
	if got.WatchRestart >= want.WatchRestart {
		want.WatchRestart = got.WatchRestart
	}
	if got.NetworkError >= want.NetworkError {
		want.NetworkError = got.NetworkError
	}
	h.checkStats(want, got)
}

func (h *harness) checkStats(want, got Stats) {
	h.t.Helper()
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Stats{}, "LastGoodRead")); diff != "" {
		h.t.Errorf("Stats (-want +got):\n%s", diff)
	}
	if want.OK > 0 && got.LastGoodRead.IsZero() {
		h.t.Errorf("Stats.LastGoodRead is zero after a good read")
	}
}

// eventually polls cond until it holds or waitFor passes.
func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	h.eventuallyWithin(what, waitFor, cond)
}

// eventuallyWithin is eventually with a deadline of its own.
func (h *harness) eventuallyWithin(what string, d time.Duration, cond func() bool) {
	h.t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			h.t.Fatalf("still not %s after %v", what, d)
		}
	}
}

// logBuffer collects JSON log records.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

type record struct {
	Level string `json:"level"`
	Msg   string `json:"msg"`
}

// wantLog checks that a record at level has a message containing each of parts.
func (h *harness) wantLog(level string, parts ...string) {
	h.t.Helper()
	h.logs.mu.Lock()
	text := h.logs.buf.String()
	h.logs.mu.Unlock()
	for line := range strings.Lines(text) {
		var r record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			h.t.Fatalf("log line %q: %v", line, err)
		}
		ok := r.Level == level
		for _, p := range parts {
			ok = ok && strings.Contains(r.Msg, p)
		}
		if ok {
			if !strings.HasPrefix(r.Msg, "ciliumnode: ") {
				h.t.Errorf("log message %q lacks the package prefix", r.Msg)
			}
			return
		}
	}
	h.t.Errorf("no %s log record containing %q in:\n%s", level, parts, text)
}

func TestGet(t *testing.T) {
	tests := []struct {
		name   string
		cfg    func(*Config)
		answer func(x *exchange)
		// good: the answer is a good read of mode; else the Source retries the GET.
		good      bool
		mode      Mode
		wantStats Stats // when the next request arrives
		wantLog   []string
		level     string
	}{
		{
			name:      "encrypting",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100")) },
			good:      true,
			mode:      Encrypting,
			wantStats: Stats{OK: 1, Mode: Encrypting},
		},
		{
			name:      "opted out: no key, same annotation",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", optedOut)) },
			good:      true,
			mode:      NotEncrypting,
			wantStats: Stats{OK: 1, Mode: NotEncrypting},
		},
		{
			name:      "key 0",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", key(0))) },
			good:      true,
			mode:      NotEncrypting,
			wantStats: Stats{OK: 1, Mode: NotEncrypting},
		},
		{
			name:      "key null",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", key(nil))) },
			good:      true,
			mode:      NotEncrypting,
			wantStats: Stats{OK: 1, Mode: NotEncrypting},
		},
		{
			name:      "no spec",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", noSpec)) },
			good:      true,
			mode:      NotEncrypting,
			wantStats: Stats{OK: 1, Mode: NotEncrypting},
		},
		{
			name:      "other key index",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", key(3))) },
			good:      true,
			mode:      Encrypting,
			wantStats: Stats{OK: 1, Mode: Encrypting},
		},
		{
			name: "404 not registered yet",
			answer: func(x *exchange) {
				x.status(http.StatusNotFound, "NotFound", `ciliumnodes.cilium.io "worker-1" not found`)
			},
			wantStats: Stats{NotFound: 1},
			level:     "INFO",
			wantLog:   []string{"not registered yet: 404 Not Found: ciliumnodes.cilium.io", "not found"},
		},
		{
			name: "500",
			answer: func(x *exchange) {
				x.status(http.StatusInternalServerError, "InternalError", "Internal error occurred: etcdserver: request timed out")
			},
			wantStats: Stats{HTTPError: 1},
			level:     "WARN",
			wantLog:   []string{"ciliumnode: get worker-1: 500 Internal Server Error: Internal error occurred: etcdserver: request timed out"},
		},
		{
			name:      "403 names the missing permission",
			answer:    func(x *exchange) { x.status(http.StatusForbidden, "Forbidden", forbidden) },
			wantStats: Stats{HTTPError: 1},
			level:     "WARN",
			wantLog:   []string{"403 Forbidden: ciliumnodes.cilium.io", "serviceaccount:kube-system:marksplit", "cannot get resource"},
		},
		{
			name:      "401",
			answer:    func(x *exchange) { x.status(http.StatusUnauthorized, "Unauthorized", "Unauthorized") },
			wantStats: Stats{HTTPError: 1},
			level:     "WARN",
			wantLog:   []string{"401 Unauthorized"},
		},
		{
			name: "502 from a proxy, HTML on several lines",
			answer: func(x *exchange) {
				x.reply(http.StatusBadGateway, "<html>\n<head><title>502 Bad Gateway</title></head>\n<body>nginx</body>\n</html>\n")
			},
			wantStats: Stats{HTTPError: 1},
			level:     "WARN",
			wantLog:   []string{"502 Bad Gateway: <html> <head><title>502 Bad Gateway</title></head> <body>nginx</body> </html>"},
		},
		{
			name:      "garbage",
			answer:    func(x *exchange) { x.reply(http.StatusOK, "this is not JSON") },
			wantStats: Stats{DecodeError: 1},
			level:     "WARN",
			wantLog:   []string{"get worker-1: decode CiliumNode: invalid character"},
		},
		{
			name:      "truncated",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100")[:200]) },
			wantStats: Stats{DecodeError: 1},
			level:     "WARN",
			wantLog:   []string{"decode CiliumNode: unexpected end of JSON input"},
		},
		{
			name:      "wrong kind",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", typed("v1", "Node"))) },
			wantStats: Stats{DecodeError: 1},
			level:     "WARN",
			wantLog:   []string{`got "v1" "Node", want cilium.io/v2 CiliumNode`},
		},
		{
			name:      "wrong name",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", named("worker-2"))) },
			wantStats: Stats{DecodeError: 1},
			level:     "WARN",
			wantLog:   []string{`got CiliumNode "worker-2", want "worker-1"`},
		},
		{
			name:      "no resourceVersion",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("", noResourceVersion)) },
			wantStats: Stats{DecodeError: 1},
			level:     "WARN",
			wantLog:   []string{"CiliumNode without metadata.resourceVersion"},
		},
		{
			name:      "key is a string",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", key("255"))) },
			wantStats: Stats{DecodeError: 1},
			level:     "WARN",
			wantLog:   []string{"cannot unmarshal string", "spec.encryption.key"},
		},
		{
			name:      "key is not an integer",
			answer:    func(x *exchange) { x.reply(http.StatusOK, node("100", key(255.5))) },
			wantStats: Stats{DecodeError: 1},
			level:     "WARN",
			wantLog:   []string{"cannot unmarshal number 255.5"},
		},
		{
			name:      "connection drop",
			answer:    func(x *exchange) { x.drop() },
			wantStats: Stats{NetworkError: 1},
			level:     "WARN",
			wantLog:   []string{"ciliumnode: get worker-1: "},
		},
		{
			name:      "no answer within RequestTimeout",
			cfg:       func(c *Config) { c.RequestTimeout = 50 * time.Millisecond },
			answer:    func(x *exchange) {},
			wantStats: Stats{NetworkError: 1},
			level:     "WARN",
			wantLog:   []string{"context deadline exceeded"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, setup{cfg: tc.cfg})
			tc.answer(h.api.expectGet(t))
			if tc.good {
				h.api.expectWatch(t, "100")
				h.wantReported(tc.mode)
				h.wantStats(tc.wantStats)
				return
			}
			retry := h.api.expectGet(t)
			h.wantReported() // nothing before a good read
			if tc.cfg != nil {
				h.wantStatsTimed(tc.wantStats)
			} else {
				h.wantStats(tc.wantStats)
			}
			h.wantLog(tc.level, tc.wantLog...)
			retry.reply(http.StatusOK, node("100"))
			h.api.expectWatch(t, "100")
			h.wantReported(Encrypting)
		})
	}
}

func TestWatchEvents(t *testing.T) {
	tests := []struct {
		name   string
		events [][2]string // type, object
		want   []Mode      // reported, after the GET's Encrypting
		rv     string      // the resourceVersion the next watch resumes from
		log    []string    // a WARN record
	}{
		{
			name:   "bookmark moves the resourceVersion only",
			events: [][2]string{{"BOOKMARK", bookmark("105")}},
			rv:     "105",
		},
		{
			name:   "opted out",
			events: [][2]string{{"MODIFIED", node("110", optedOut)}},
			want:   []Mode{NotEncrypting},
			rv:     "110",
		},
		{
			name:   "same mode, new WireGuard key annotation",
			events: [][2]string{{"MODIFIED", node("111", newPubKey)}},
			rv:     "111",
		},
		{
			name: "off and on again",
			events: [][2]string{
				{"MODIFIED", node("112", key(0))},
				{"BOOKMARK", bookmark("113")},
				{"MODIFIED", node("114", newPubKey)},
			},
			want: []Mode{NotEncrypting, Encrypting},
			rv:   "114",
		},
		{
			name:   "deleted: the last mode stands",
			events: [][2]string{{"DELETED", node("120")}, {"BOOKMARK", bookmark("121")}},
			rv:     "121",
			log:    []string{"ciliumnode: CiliumNode worker-1 deleted; keeping the last mode"},
		},
		{
			name: "deleted, then added again opted out",
			events: [][2]string{
				{"DELETED", node("120")},
				{"ADDED", node("122", optedOut)},
			},
			want: []Mode{NotEncrypting},
			rv:   "122",
		},
		{
			name:   "bookmark without kind",
			events: [][2]string{{"BOOKMARK", `{"metadata":{"resourceVersion":"130"}}`}},
			rv:     "130",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, setup{})
			x := h.goodStart()
			x.start()
			for _, ev := range tc.events {
				x.event(ev[0], ev[1])
			}
			x.end() // the server ends the watch: resume at once from the last resourceVersion
			h.api.expectWatch(t, tc.rv)
			h.wantReported(append([]Mode{Encrypting}, tc.want...)...)
			wantMode := Encrypting
			if len(tc.want) > 0 {
				wantMode = tc.want[len(tc.want)-1]
			}
			h.wantStats(Stats{OK: 1, WatchRestart: 1, Mode: wantMode})
			if tc.log != nil {
				h.wantLog("WARN", tc.log...)
			}
		})
	}
}

// TestWatchEnd covers every way a watch ends other than the resync, over HTTP/2 and HTTP/1.1.
func TestWatchEnd(t *testing.T) {
	type next struct {
		get bool   // the object is read again
		rv  string // else the watch resumes from rv
	}
	tests := []struct {
		name   string
		cfg    func(*Config)
		script func(x *exchange)
		want   []Mode // reported after the GET's Encrypting
		next   next
		stats  Stats // besides the GET's OK
		level  string
		log    []string
	}{
		{
			name:   "server ends it without events",
			script: func(x *exchange) { x.start(); x.end() },
			next:   next{rv: "100"},
			stats:  Stats{WatchRestart: 1},
		},
		{
			name: "ERROR 410 Gone",
			script: func(x *exchange) {
				x.start()
				x.event("BOOKMARK", bookmark("150"))
				x.event("ERROR", statusJSON(http.StatusGone, "Expired", "too old resource version: 150 (9000)"))
			},
			next:  next{get: true},
			stats: Stats{Gone: 1},
			level: "INFO",
			log:   []string{"watch worker-1 from resourceVersion 100: ERROR event: 410 Expired: too old resource version: 150 (9000); reading the object again"},
		},
		{
			name:   "410 answer",
			script: func(x *exchange) { x.status(http.StatusGone, "Gone", "too old resource version: 100 (9000)") },
			next:   next{get: true},
			stats:  Stats{Gone: 1},
			level:  "INFO",
			log:    []string{"410 Gone: too old resource version"},
		},
		{
			name: "connection drop mid-event",
			script: func(x *exchange) {
				x.start()
				x.send(node("101", optedOut)[:80])
				x.drop()
			},
			next:  next{rv: "100"},
			stats: Stats{NetworkError: 1},
			level: "WARN",
			log:   []string{"watch worker-1 from resourceVersion 100"},
		},
		{
			name: "connection drop after an event",
			script: func(x *exchange) {
				x.start()
				x.event("MODIFIED", node("101", optedOut))
				x.drop()
			},
			want:  []Mode{NotEncrypting},
			next:  next{rv: "101"},
			stats: Stats{NetworkError: 1, Mode: NotEncrypting},
			level: "WARN",
			log:   []string{"watch worker-1 from resourceVersion 100"},
		},
		{
			name:   "garbage",
			script: func(x *exchange) { x.start(); x.send("<html>oops</html>\n") },
			next:   next{rv: "100"},
			stats:  Stats{DecodeError: 1},
			level:  "WARN",
			log:    []string{"decode event: invalid character '<'"},
		},
		{
			name: "wrong kind",
			script: func(x *exchange) {
				x.start()
				x.event("ADDED", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"worker-1","resourceVersion":"101"}}`)
			},
			next:  next{get: true}, // resuming would replay it
			stats: Stats{DecodeError: 1},
			level: "WARN",
			log:   []string{`ADDED event: got "v1" "Pod", want cilium.io/v2 CiliumNode`},
		},
		{
			name:   "wrong name",
			script: func(x *exchange) { x.start(); x.event("MODIFIED", node("101", named("worker-2"), optedOut)) },
			next:   next{get: true},
			stats:  Stats{DecodeError: 1},
			level:  "WARN",
			log:    []string{`got CiliumNode "worker-2"`},
		},
		{
			name:   "key is a string: the last mode stands",
			script: func(x *exchange) { x.start(); x.event("MODIFIED", node("101", key("0"))) },
			next:   next{get: true},
			stats:  Stats{DecodeError: 1},
			level:  "WARN",
			log:    []string{"MODIFIED event: decode CiliumNode: json: cannot unmarshal string"},
		},
		{
			name:   "unknown event type",
			script: func(x *exchange) { x.start(); x.event("SYNC", node("101")) },
			next:   next{rv: "100"},
			stats:  Stats{DecodeError: 1},
			level:  "WARN",
			log:    []string{`unknown event type "SYNC"`},
		},
		{
			name:   "ERROR without a Status",
			script: func(x *exchange) { x.start(); x.event("ERROR", `"boom"`) },
			next:   next{rv: "100"},
			stats:  Stats{DecodeError: 1},
			level:  "WARN",
			log:    []string{"ERROR event without a Status"},
		},
		{
			name: "ERROR 500",
			script: func(x *exchange) {
				x.start()
				x.event("ERROR", statusJSON(http.StatusInternalServerError, "InternalError", "etcdserver: leader changed"))
			},
			next:  next{rv: "100"},
			stats: Stats{HTTPError: 1},
			level: "WARN",
			log:   []string{"ERROR event: 500 InternalError: etcdserver: leader changed"},
		},
		{
			name: "answer 500",
			script: func(x *exchange) {
				x.status(http.StatusInternalServerError, "InternalError", "etcdserver: request timed out")
			},
			next:  next{rv: "100"},
			stats: Stats{HTTPError: 1},
			level: "WARN",
			log:   []string{"500 Internal Server Error: etcdserver: request timed out"},
		},
		{
			name: "answer 403: no watch permission",
			script: func(x *exchange) {
				x.status(http.StatusForbidden, "Forbidden", strings.Replace(forbidden, "cannot get", "cannot watch", 1))
			},
			next:  next{rv: "100"},
			stats: Stats{HTTPError: 1},
			level: "WARN",
			log:   []string{"403 Forbidden", "cannot watch resource"},
		},
		{
			name: "answer 404: CRD missing",
			script: func(x *exchange) {
				x.status(http.StatusNotFound, "NotFound", "the server could not find the requested resource")
			},
			next:  next{rv: "100"},
			stats: Stats{NotFound: 1},
			level: "WARN",
			log:   []string{"404 Not Found: the server could not find the requested resource"},
		},
		{
			name:   "silent after the header",
			cfg:    func(c *Config) { c.WatchTimeout = 50 * time.Millisecond },
			script: func(x *exchange) { x.start(); x.waitDone() },
			next:   next{rv: "100"},
			stats:  Stats{WatchRestart: 1},
			level:  "WARN",
			log:    []string{"watch worker-1: no complete event for 50ms; restarting it"},
		},
		{
			name:   "silent after a bookmark",
			cfg:    func(c *Config) { c.WatchTimeout = 50 * time.Millisecond },
			script: func(x *exchange) { x.start(); x.event("BOOKMARK", bookmark("140")); x.waitDone() },
			next:   next{rv: "140"},
			stats:  Stats{WatchRestart: 1},
			level:  "WARN",
			log:    []string{"no complete event for 50ms"},
		},
		{
			name:   "no header at all",
			cfg:    func(c *Config) { c.WatchTimeout = 50 * time.Millisecond },
			script: func(x *exchange) { x.waitDone() },
			next:   next{rv: "100"},
			stats:  Stats{WatchRestart: 1},
			level:  "WARN",
			log:    []string{"no complete event for 50ms"},
		},
	}
	for _, proto := range []string{"h2", "http1.1"} {
		t.Run(proto, func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					h := start(t, setup{http1: proto == "http1.1", cfg: tc.cfg})
					tc.script(h.goodStart())
					if tc.next.get {
						h.api.expectGet(t)
					} else {
						h.api.expectWatch(t, tc.next.rv)
					}
					h.wantReported(append([]Mode{Encrypting}, tc.want...)...)
					want := tc.stats
					want.OK++
					if want.Mode == Unknown {
						want.Mode = Encrypting
					}
					if tc.cfg != nil {
						h.wantStatsTimed(want)
					} else {
						h.wantStats(want)
					}
					if tc.log != nil {
						h.wantLog(tc.level, tc.log...)
					}
				})
			}
		})
	}
}

// TestLastModeStands: after a good read, no failure changes the mode; only good reads do.
func TestLastModeStands(t *testing.T) {
	h := start(t, setup{})
	x := h.goodStart()
	x.start()
	x.event("ERROR", statusJSON(http.StatusGone, "Expired", "too old resource version"))
	h.api.expectGet(t).status(http.StatusServiceUnavailable, "ServiceUnavailable", "the server is shutting down")
	h.api.expectGet(t).reply(http.StatusOK, "{garbage")
	h.api.expectGet(t).drop()
	h.api.expectGet(t).reply(http.StatusOK, node("150", typed("v1", "Node")))
	h.api.expectGet(t).status(http.StatusNotFound, "NotFound", `ciliumnodes.cilium.io "worker-1" not found`)
	h.api.expectGet(t).status(http.StatusForbidden, "Forbidden", forbidden)
	g := h.api.expectGet(t)
	h.wantReported(Encrypting)
	h.wantStats(Stats{OK: 1, Gone: 1, HTTPError: 2, DecodeError: 2, NetworkError: 1, NotFound: 1, Mode: Encrypting})

	g.reply(http.StatusOK, node("200", optedOut))
	x = h.api.expectWatch(t, "200")
	h.wantReported(NotEncrypting)
	x.start()
	x.event("MODIFIED", node("201", key("x")))
	h.api.expectGet(t).reply(http.StatusOK, node("201", key("x"))) // still corrupt
	h.api.expectGet(t).reply(http.StatusOK, node("201", optedOut))
	x = h.api.expectWatch(t, "201")
	x.start()
	x.event("DELETED", node("202", optedOut))
	x.drop()
	h.api.expectWatch(t, "202").status(http.StatusInternalServerError, "InternalError", "boom")
	h.api.expectWatch(t, "202")
	h.wantReported()
	h.wantStats(Stats{OK: 3, Gone: 1, HTTPError: 3, DecodeError: 4, NetworkError: 2, NotFound: 1, Mode: NotEncrypting})
}

// TestResync: the object is read again every Resync although the watch is healthy, and the
// new watch starts from the new read.
func TestResync(t *testing.T) {
	h := start(t, setup{cfg: func(c *Config) { c.Resync = 250 * time.Millisecond }})
	x := h.goodStart()
	x.start()
	x.event("BOOKMARK", bookmark("101"))
	g := h.api.expectGet(t)
	x.waitDone() // the old watch is gone
	g.reply(http.StatusOK, node("150", newPubKey))
	x = h.api.expectWatch(t, "150")
	h.wantReported(Encrypting) // same mode: no second report
	x.start()
	h.api.expectGet(t).reply(http.StatusOK, node("160", optedOut))
	h.api.expectWatch(t, "160")
	h.wantReported(NotEncrypting)
	h.wantStats(Stats{OK: 5, Mode: NotEncrypting}) // three GETs, two watches replaced
	h.wantLog("DEBUG", "ciliumnode: resync")
}

// TestWatchTimeoutBookmarks: bookmarks keep a quiet watch alive; silence restarts it.
func TestWatchTimeoutBookmarks(t *testing.T) {
	const timeout = 200 * time.Millisecond
	h := start(t, setup{cfg: func(c *Config) { c.WatchTimeout = timeout }})
	x := h.goodStart()
	x.start()
	tick := time.NewTicker(timeout / 5)
	defer tick.Stop()
	began, rv := time.Now(), 100
	for time.Since(began) < 3*timeout {
		<-tick.C
		rv++
		x.event("BOOKMARK", bookmark(strconv.Itoa(rv))) // fails the test if the client hung up
	}
	x.waitDone() // now silent: the client gives up on it
	h.api.expectWatch(t, strconv.Itoa(rv))
	h.wantStatsTimed(Stats{OK: 1, WatchRestart: 1, Mode: Encrypting})
}

// TestTokenRotation: the token file is read before every request; once the server stops
// accepting the old token, the rewritten file is picked up without a restart.
func TestTokenRotation(t *testing.T) {
	h := start(t, setup{})
	h.api.expectGet(t).reply(http.StatusOK, node("100"))
	x := h.api.expectWatch(t, "100")
	if got := x.token(); got != "Bearer token-1" {
		t.Fatalf("Authorization %q, want Bearer token-1", got)
	}
	h.api.setToken("token-2") // the old token stops working
	x.start()
	x.event("BOOKMARK", bookmark("101"))
	x.end()
	select {
	case <-h.api.denied:
	case <-time.After(waitFor):
		t.Fatal("the old token was never refused")
	}
	h.writeToken("token-2")
	x = h.api.expectWatch(t, "101")
	if got := x.token(); got != "Bearer token-2" {
		t.Errorf("Authorization %q, want Bearer token-2", got)
	}
	x.status(http.StatusGone, "Gone", "too old resource version")
	if got := h.api.expectGet(t).token(); got != "Bearer token-2" {
		t.Errorf("GET Authorization %q, want Bearer token-2", got)
	}
	if st := h.src.Stats(); st.HTTPError == 0 {
		t.Errorf("Stats.HTTPError = 0 after 401 answers")
	}
	h.wantLog("WARN", "watch worker-1 from resourceVersion 101: 401 Unauthorized")
	h.wantReported(Encrypting)
}

func TestTokenFileMissing(t *testing.T) {
	h := start(t, setup{cfg: func(c *Config) { c.TokenFile = filepath.Join(t.TempDir(), "absent") }})
	h.eventually("logged", func() bool {
		h.logs.mu.Lock()
		defer h.logs.mu.Unlock()
		return bytes.Contains(h.logs.buf.Bytes(), []byte("read token"))
	})
	h.wantLog("WARN", "ciliumnode: get worker-1: read token: open ", "no such file or directory")
	if n := h.api.served(); n != 0 {
		t.Errorf("%d requests sent without a token", n)
	}
	h.wantReported()
}

// TestCA: the server is verified with the CA file.
func TestCA(t *testing.T) {
	t.Run("cluster CA", func(t *testing.T) {
		h := start(t, setup{})
		h.goodStart()
		h.wantReported(Encrypting)
	})
	t.Run("wrong CA", func(t *testing.T) {
		wrong := filepath.Join(t.TempDir(), "other-ca.crt")
		writeFile(t, wrong, selfSignedCA(t))
		h := start(t, setup{cfg: func(c *Config) { c.CAFile = wrong }})
		h.eventually("retried", func() bool { return h.src.Stats().NetworkError >= 2 })
		h.wantLog("WARN", "ciliumnode: get worker-1: ", "x509: certificate signed by unknown authority")
		h.api.noCall(t)
		h.wantReported()
		if st := h.src.Stats(); st.OK != 0 || !st.LastGoodRead.IsZero() {
			t.Errorf("Stats %+v after failed verification", st)
		}
	})
}

// TestUnreachable: nothing listens; nothing is reported and the Source keeps retrying.
func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	h := start(t, setup{cfg: func(c *Config) { c.Server = "https://" + addr }})
	h.eventually("retried", func() bool { return h.src.Stats().NetworkError >= 3 })
	h.wantLog("WARN", "ciliumnode: get worker-1: ", "connection refused")
	h.wantReported()
}

// recordingBackOff records how Run uses its back-off.
type recordingBackOff struct {
	mu    sync.Mutex
	calls []string
}

func (r *recordingBackOff) NextBackOff() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "next")
	return time.Millisecond
}

func (r *recordingBackOff) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "reset")
}

func (r *recordingBackOff) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// TestBackoff: failures back off; a success resets; a watch that keeps failing right after
// a good GET is not retried hot (the GETs in between do not reset the back-off).
func TestBackoff(t *testing.T) {
	gone := statusJSON(http.StatusGone, "Expired", "too old resource version")
	tests := []struct {
		name   string
		script func(h *harness)
		want   []string
	}{
		{
			name: "GET failures, then success",
			script: func(h *harness) {
				h.api.expectGet(h.t).status(http.StatusInternalServerError, "InternalError", "boom")
				h.api.expectGet(h.t).status(http.StatusNotFound, "NotFound", "not found")
				h.api.expectGet(h.t).reply(http.StatusOK, node("100"))
				h.api.expectWatch(h.t, "100")
			},
			want: []string{"reset", "next", "next", "reset"},
		},
		{
			name: "watch refused again and again",
			script: func(h *harness) {
				h.goodStart().status(http.StatusForbidden, "Forbidden", forbidden)
				h.api.expectWatch(h.t, "100").status(http.StatusForbidden, "Forbidden", forbidden)
				h.api.expectWatch(h.t, "100").status(http.StatusForbidden, "Forbidden", forbidden)
				h.api.expectWatch(h.t, "100")
			},
			want: []string{"reset", "reset", "next", "next", "next"},
		},
		{
			name: "410 right after every GET, until an event arrives",
			script: func(h *harness) {
				x := h.goodStart()
				x.start()
				x.event("ERROR", gone)
				h.api.expectGet(h.t).reply(http.StatusOK, node("200"))
				x = h.api.expectWatch(h.t, "200")
				x.start()
				x.event("ERROR", gone)
				h.api.expectGet(h.t).reply(http.StatusOK, node("300"))
				x = h.api.expectWatch(h.t, "300")
				x.start()
				x.event("BOOKMARK", bookmark("301"))
				x.end()
				h.api.expectWatch(h.t, "301")
			},
			want: []string{"reset", "reset", "next", "next", "reset"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &recordingBackOff{}
			h := start(t, setup{cfg: func(c *Config) { c.Backoff = b }})
			tc.script(h)
			if diff := cmp.Diff(tc.want, b.get()); diff != "" {
				t.Errorf("back-off calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunMisuse(t *testing.T) {
	h := start(t, setup{})
	h.goodStart()
	if err := h.src.Run(context.Background(), func(Mode) {}); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second Run: %v, want already running", err)
	}
	if err := h.src.Run(context.Background(), nil); err == nil {
		t.Errorf("Run with nil report: nil error")
	}
}

func TestNew(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	writeFile(t, ca, selfSignedCA(t))
	notPEM := filepath.Join(dir, "not-pem")
	writeFile(t, notPEM, []byte("hello"))
	good := Config{Server: "https://10.96.0.1:443", NodeName: testNode, CAFile: ca}
	with := func(edit func(*Config)) Config {
		c := good
		edit(&c)
		return c
	}
	name := func(n string) Config { return with(func(c *Config) { c.NodeName = n }) }
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // "" for success
	}{
		{"minimal", good, ""},
		{"FQDN node name", name("ip-10-0-0-5.eu-central-1.compute.internal"), ""},
		{"one character", name("a"), ""},
		{"253 characters", name(strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)), ""},
		{"254 characters", name(strings.Repeat("a", 254)), "longer than 253 characters"},
		{"empty node name", name(""), "empty node name"},
		{"upper case", name("Worker-1"), `invalid node name "Worker-1": not a DNS subdomain`},
		{"underscore", name("worker_1"), "not a DNS subdomain"},
		{"leading dash", name("-worker"), "not a DNS subdomain"},
		{"trailing dash", name("worker-"), "not a DNS subdomain"},
		{"empty label", name("a..b"), "not a DNS subdomain"},
		{"trailing dot", name("worker."), "not a DNS subdomain"},
		{"slash", name("worker/1"), "not a DNS subdomain"},
		{"trailing slash on server", with(func(c *Config) { c.Server = "https://10.96.0.1:443/" }), ""},
		{"no server", with(func(c *Config) { c.Server = "" }), "no API server URL"},
		{"http server", with(func(c *Config) { c.Server = "http://10.96.0.1:80" }), "want https://host:port"},
		{"server without host", with(func(c *Config) { c.Server = "https://" }), "want https://host:port"},
		{"server not a URL", with(func(c *Config) { c.Server = "https://[::1" }), "API server URL"},
		{"negative resync", with(func(c *Config) { c.Resync = -time.Second }), "negative Resync"},
		{"negative watch timeout", with(func(c *Config) { c.WatchTimeout = -time.Second }), "negative WatchTimeout"},
		{"CA file missing", with(func(c *Config) { c.CAFile = filepath.Join(dir, "absent") }), "read CA: open "},
		{"CA file without a certificate", with(func(c *Config) { c.CAFile = notPEM }), "holds no PEM certificate"},
		{"HTTPClient given: no CA needed", with(func(c *Config) {
			c.CAFile = filepath.Join(dir, "absent")
			c.HTTPClient = &http.Client{}
		}), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.cfg)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New succeeded, want error containing %q", tc.wantErr)
			}
			if s != nil {
				t.Errorf("New returned a Source with an error")
			}
			if !strings.HasPrefix(err.Error(), "ciliumnode: ") || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("New: %q, want ciliumnode: …%s…", err, tc.wantErr)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	s, err := New(Config{Server: "https://10.96.0.1:443", NodeName: testNode, HTTPClient: &http.Client{}})
	if err != nil {
		t.Fatal(err)
	}
	got := struct {
		TokenFile, CAFile                    string
		Resync, WatchTimeout, RequestTimeout time.Duration
		GetURL, WatchURL                     string
	}{s.cfg.TokenFile, s.cfg.CAFile, s.cfg.Resync, s.cfg.WatchTimeout, s.cfg.RequestTimeout, s.getURL, s.lw.watchURL + "100"}
	want := got
	want.TokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	want.CAFile = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
	want.Resync, want.WatchTimeout, want.RequestTimeout = 5*time.Minute, 2*time.Minute, 30*time.Second
	want.GetURL = "https://10.96.0.1:443/apis/cilium.io/v2/ciliumnodes/worker-1"
	want.WatchURL = "https://10.96.0.1:443/apis/cilium.io/v2/ciliumnodes?watch=1&fieldSelector=metadata.name%3Dworker-1&allowWatchBookmarks=true&resourceVersion=100"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	eb, ok := s.cfg.Backoff.(*backoff.ExponentialBackOff)
	if !ok || eb.MaxElapsedTime != 0 {
		t.Errorf("default Backoff %#v, want an ExponentialBackOff that never gives up", s.cfg.Backoff)
	}
	if s.log == nil {
		t.Errorf("no default logger")
	}
}

func TestInClusterConfig(t *testing.T) {
	tests := []struct {
		name, host, port string
		want             Config
		wantErr          bool
	}{
		{
			name: "IPv4", host: "10.96.0.1", port: "443",
			want: Config{Server: "https://10.96.0.1:443", NodeName: testNode,
				TokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token",
				CAFile:    "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"},
		},
		{
			name: "IPv6", host: "fd00:10:96::1", port: "443",
			want: Config{Server: "https://[fd00:10:96::1]:443", NodeName: testNode,
				TokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token",
				CAFile:    "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"},
		},
		{name: "no host", port: "443", wantErr: true},
		{name: "no port", host: "10.96.0.1", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBERNETES_SERVICE_HOST", tc.host)
			t.Setenv("KUBERNETES_SERVICE_PORT", tc.port)
			got, err := InClusterConfig(testNode)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "ciliumnode: in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set") {
					t.Errorf("InClusterConfig: %v, want the missing variables named", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("InClusterConfig (-want +got):\n%s", diff)
			}
			if _, err := New(got); err != nil && !strings.Contains(err.Error(), "read CA") {
				t.Errorf("New(in-cluster config): %v, want success or, outside a pod, a CA read error", err)
			}
		})
	}
}

func TestModeString(t *testing.T) {
	for _, tc := range []struct {
		m    Mode
		want string
	}{
		{Unknown, "unknown"},
		{Encrypting, "yes"},
		{NotEncrypting, "no"},
		{Mode(7), "unknown(7)"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.m.String(); got != tc.want {
				t.Errorf("Mode(%d).String() = %q, want %q", int(tc.m), got, tc.want)
			}
		})
	}
}

func TestStatsRequests(t *testing.T) {
	st := Stats{OK: 1, NotFound: 2, HTTPError: 3, DecodeError: 4, NetworkError: 5, WatchRestart: 6, Gone: 7}
	want := map[string]uint64{
		"ok": 1, "not_found": 2, "http_error": 3, "decode_error": 4,
		"network_error": 5, "watch_restart": 6, "gone_410": 7,
	}
	if diff := cmp.Diff(want, st.Requests()); diff != "" {
		t.Errorf("Requests (-want +got):\n%s", diff)
	}
}

// selfSignedCA returns the PEM of a CA certificate that signed nothing the fake API uses.
func selfSignedCA(t *testing.T) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "other-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
