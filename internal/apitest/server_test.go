package apitest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

// waitFor bounds every wait; nothing takes that long unless something is broken.
const waitFor = 2 * time.Minute

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// client sends authorized requests to a Server.
type client struct {
	t   *testing.T
	s   *Server
	c   *http.Client
	tok string
}

func newClient(t *testing.T, opts Options) *client {
	t.Helper()
	s := New(t, opts)
	c := s.Client()
	t.Cleanup(c.CloseIdleConnections)
	return &client{t: t, s: s, c: c, tok: s.Token()}
}

func (c *client) do(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.s.URL()+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.tok)
	return c.c.Do(req)
}

// get returns the status code and body of path.
func (c *client) get(path string) (int, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	resp, err := c.do(ctx, path)
	if err != nil {
		c.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("GET %s: read: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

type listPage struct {
	Kind     string `json:"kind"`
	Metadata struct {
		ResourceVersion    string `json:"resourceVersion"`
		Continue           string `json:"continue"`
		RemainingItemCount *int   `json:"remainingItemCount"`
	} `json:"metadata"`
	Items []struct {
		Metadata struct {
			Name            string `json:"name"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec struct {
			Addresses []struct {
				Type string `json:"type"`
				IP   string `json:"ip"`
			} `json:"addresses"`
			Encryption map[string]any `json:"encryption"`
		} `json:"spec"`
	} `json:"items"`
}

func (c *client) list(query string) listPage {
	c.t.Helper()
	code, body := c.get(resource + "?" + query)
	if code != http.StatusOK {
		c.t.Fatalf("list ?%s: %d %s", query, code, body)
	}
	var p listPage
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		c.t.Fatalf("list ?%s: %v\n%s", query, err, body)
	}
	return p
}

func names(p listPage) []string {
	var out []string
	for _, it := range p.Items {
		out = append(out, it.Metadata.Name)
	}
	return out
}

// stream is an open watch.
type stream struct {
	t    *testing.T
	resp *http.Response
	// lines are the stream's lines, in order; it is closed once the stream
	// ends, after err is set: one channel, so that the end never overtakes
	// a line (two channels in one select may be read in either order).
	lines  chan string
	err    error // the read error that ended the stream (io.EOF when clean)
	cancel context.CancelFunc
}

func (c *client) watch(query string) *stream {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := c.do(ctx, resource+"?"+query)
	if err != nil {
		cancel()
		c.t.Fatalf("watch ?%s: %v", query, err)
	}
	st := &stream{t: c.t, resp: resp, lines: make(chan string, 100), cancel: cancel}
	go func() {
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				st.lines <- line
			}
			if err != nil {
				st.err = err
				close(st.lines)
				return
			}
		}
	}()
	c.t.Cleanup(st.close)
	return st
}

func (st *stream) close() {
	st.cancel()
	st.resp.Body.Close()
}

type ev struct {
	Type   string
	Name   string
	RV     string
	Key    any
	Code   int
	Reason string
}

// next returns the next event.
func (st *stream) next() ev {
	st.t.Helper()
	select {
	case line, ok := <-st.lines:
		if !ok {
			st.t.Fatalf("watch ended (%v), want an event", st.err)
		}
		var e struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					Name            string `json:"name"`
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
				Spec struct {
					Encryption map[string]any `json:"encryption"`
				} `json:"spec"`
				Code   int    `json:"code"`
				Reason string `json:"reason"`
			} `json:"object"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			st.t.Fatalf("event %q: %v", line, err)
		}
		o := e.Object
		return ev{e.Type, o.Metadata.Name, o.Metadata.ResourceVersion, o.Spec.Encryption["key"], o.Code, o.Reason}
	case <-time.After(waitFor):
		st.t.Fatalf("no event within %v", waitFor)
	}
	return ev{}
}

// raw returns the next line as it is.
func (st *stream) raw() string {
	st.t.Helper()
	select {
	case line, ok := <-st.lines:
		if !ok {
			st.t.Fatalf("watch ended (%v), want a line", st.err)
		}
		return line
	case <-time.After(waitFor):
		st.t.Fatalf("no line within %v", waitFor)
	}
	return ""
}

// ended waits for the stream to end and returns the error it ended with.
func (st *stream) ended() error {
	st.t.Helper()
	select {
	case line, ok := <-st.lines:
		if ok {
			st.t.Fatalf("got %q, want the end of the watch", line)
		}
		return st.err
	case <-time.After(waitFor):
		st.t.Fatalf("watch still open after %v", waitFor)
	}
	return nil
}

// quiet checks that nothing arrives for d.
func (st *stream) quiet(d time.Duration) {
	st.t.Helper()
	select {
	case line, ok := <-st.lines:
		if !ok {
			st.t.Fatalf("watch ended (%v), want it open and silent", st.err)
		}
		st.t.Fatalf("got %q, want nothing", line)
	case <-time.After(d):
	}
}

func node(name string, key int64, ips ...string) Node {
	return Node{Name: name, Key: key, InternalIPs: ips}
}

func TestList(t *testing.T) {
	c := newClient(t, Options{})
	for _, n := range []Node{
		node("n3", 255, "10.0.0.3"), node("n1", 255, "10.0.0.1", "fd00::1"),
		node("n2", 0, "10.0.0.2"), node("n5", 255), node("n4", 255, "10.0.0.4"),
	} {
		c.s.MustPut(t, n)
	}
	rv := c.s.ResourceVersion()

	p1 := c.list("limit=2")
	if diff := cmp.Diff([]string{"n1", "n2"}, names(p1)); diff != "" {
		t.Errorf("page 1 (-want +got):\n%s", diff)
	}
	if p1.Kind != "CiliumNodeList" || p1.Metadata.ResourceVersion != rv || p1.Metadata.Continue == "" ||
		p1.Metadata.RemainingItemCount == nil || *p1.Metadata.RemainingItemCount != 3 {
		t.Errorf("page 1 metadata %+v, want rv %s, a continue token, 3 remaining", p1.Metadata, rv)
	}
	// A change between pages is not in this list: the pages are one snapshot.
	c.s.MustPut(t, node("n0", 255, "10.0.0.10"))
	c.s.Delete("n4")
	p2 := c.list("limit=2&continue=" + p1.Metadata.Continue)
	p3 := c.list("limit=2&continue=" + p2.Metadata.Continue)
	if diff := cmp.Diff([]string{"n3", "n4", "n5"}, append(names(p2), names(p3)...)); diff != "" {
		t.Errorf("pages 2 and 3 (-want +got):\n%s", diff)
	}
	if p2.Metadata.ResourceVersion != rv || p3.Metadata.ResourceVersion != rv || p3.Metadata.Continue != "" {
		t.Errorf("pages 2, 3 metadata %+v %+v, want rv %s and no continue on the last", p2.Metadata, p3.Metadata, rv)
	}
	// The spent token and a compacted one are gone.
	if code, _ := c.get(resource + "?limit=2&continue=" + p2.Metadata.Continue); code != http.StatusGone {
		t.Errorf("spent continue token: %d, want 410", code)
	}
	q := c.list("limit=2")
	c.s.Compact()
	if code, body := c.get(resource + "?limit=2&continue=" + q.Metadata.Continue); code != http.StatusGone || !strings.Contains(body, `"reason":"Expired"`) {
		t.Errorf("continue after Compact: %d %s, want 410 Expired", code, body)
	}
	if got := names(c.list("")); !cmp.Equal(got, []string{"n0", "n1", "n2", "n3", "n5"}) {
		t.Errorf("unpaginated list %v", got)
	}
	if got := names(c.list("fieldSelector=metadata.name%3Dn2")); !cmp.Equal(got, []string{"n2"}) {
		t.Errorf("list with a field selector: %v", got)
	}

	// Objects: InternalIPs and a CiliumInternalIP; no key when opted out.
	all := c.list("")
	n1, n2 := all.Items[1], all.Items[2]
	var types []string
	for _, a := range n1.Spec.Addresses {
		types = append(types, a.Type+" "+a.IP)
	}
	if len(types) != 3 || types[0] != "InternalIP 10.0.0.1" || types[1] != "InternalIP fd00::1" || !strings.HasPrefix(types[2], "CiliumInternalIP ") {
		t.Errorf("n1 addresses %q", types)
	}
	if n1.Spec.Encryption["key"] != 255.0 || len(n2.Spec.Encryption) != 0 {
		t.Errorf("encryption n1 %v, n2 %v; want key 255 and no key", n1.Spec.Encryption, n2.Spec.Encryption)
	}
}

func TestMaxPageSize(t *testing.T) {
	c := newClient(t, Options{MaxPageSize: 2})
	c.s.MustPut(t, node("a", 1), node("b", 1), node("c", 1))
	if got := names(c.list("limit=500")); len(got) != 2 {
		t.Errorf("limit 500 with MaxPageSize 2: %v", got)
	}
	if got := names(c.list("")); len(got) != 2 {
		t.Errorf("no limit with MaxPageSize 2: %v", got)
	}
}

func TestGet(t *testing.T) {
	c := newClient(t, Options{})
	c.s.MustPut(t, node("worker-1", 255, "10.0.0.5"))
	code, body := c.get(resource + "/worker-1")
	if code != http.StatusOK || !strings.Contains(body, `"name":"worker-1"`) || !strings.Contains(body, `"kind":"CiliumNode"`) {
		t.Errorf("GET worker-1: %d %s", code, body)
	}
	code, body = c.get(resource + "/worker-2")
	if code != http.StatusNotFound || !strings.Contains(body, `ciliumnodes.cilium.io \"worker-2\" not found`) {
		t.Errorf("GET worker-2: %d %s", code, body)
	}
	if code, _ := c.get("/api/v1/nodes"); code != http.StatusNotFound {
		t.Errorf("GET nodes: %d, want 404", code)
	}
	if code, _ := c.get(resource + "?fieldSelector=spec.foo%3Dbar"); code != http.StatusBadRequest {
		t.Errorf("unsupported field selector: %d, want 400", code)
	}
	want := map[Kind]int{KindGet: 2, KindOther: 2}
	if diff := cmp.Diff(want, c.s.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
}

func TestWatch(t *testing.T) {
	c := newClient(t, Options{})
	rv0 := c.s.MustPut(t, node("a", 255, "10.0.0.1"))
	w := c.watch("watch=1&allowWatchBookmarks=true&resourceVersion=" + rv0)
	rvB := c.s.MustPut(t, node("b", 0, "10.0.0.2"))
	rvA, _ := c.s.SetKey("a", 0)
	rvD, _ := c.s.Delete("b")
	want := []ev{
		{Type: "ADDED", Name: "b", RV: rvB},
		{Type: "MODIFIED", Name: "a", RV: rvA},
		{Type: "DELETED", Name: "b", RV: rvD},
	}
	var got []ev
	for range want {
		got = append(got, w.next())
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if n := c.s.Bookmark(); n != 1 {
		t.Errorf("Bookmark reached %d watches, want 1", n)
	}
	if diff := cmp.Diff(ev{Type: "BOOKMARK", RV: rvD}, w.next()); diff != "" {
		t.Errorf("bookmark (-want +got):\n%s", diff)
	}

	// A watch that resumes gets what it missed; one with a field selector only its node.
	w2 := c.watch("watch=1&resourceVersion=" + rv0)
	if got := w2.next(); got.Name != "b" || got.Type != "ADDED" {
		t.Errorf("resumed watch: first event %+v", got)
	}
	one := c.watch("watch=1&fieldSelector=metadata.name%3Da&resourceVersion=" + rv0)
	if got := one.next(); got.Name != "a" || got.Type != "MODIFIED" {
		t.Errorf("field-selector watch: first event %+v", got)
	}
	c.s.MustPut(t, node("c", 1))
	c.s.Touch("a")
	if got := one.next(); got.Name != "a" || got.Type != "MODIFIED" {
		t.Errorf("field-selector watch: second event %+v, want a's touch only", got)
	}
	// From "": the current state first.
	fresh := c.watch("watch=1")
	var initial []string
	for range 2 {
		e := fresh.next()
		initial = append(initial, e.Type+" "+e.Name)
	}
	if diff := cmp.Diff([]string{"ADDED a", "ADDED c"}, initial); diff != "" {
		t.Errorf("watch from \"\" (-want +got):\n%s", diff)
	}
	if got := c.s.Counts(); got[KindWatch] != 3 || got[KindWatchOne] != 1 {
		t.Errorf("Counts %v, want 3 watches and 1 field-selector watch", got)
	}
}

func TestWatchErrors(t *testing.T) {
	c := newClient(t, Options{History: 1})
	rv0 := c.s.MustPut(t, node("a", 255))
	c.s.MustPut(t, node("b", 255), node("c", 255)) // only c's event is kept: b's is lost to a watch from rv0
	old := c.watch("watch=1&resourceVersion=" + rv0)
	if got := old.next(); got.Type != "ERROR" || got.Code != http.StatusGone || got.Reason != "Expired" {
		t.Errorf("watch from before the history: %+v, want ERROR 410 Expired", got)
	}
	if err := old.ended(); err != io.EOF {
		t.Errorf("after the ERROR: %v, want a clean end", err)
	}
	if code, body := c.get(resource + "?watch=1&resourceVersion=99999"); code != http.StatusGatewayTimeout || !strings.Contains(body, "Too large resource version") {
		t.Errorf("watch from the future: %d %s", code, body)
	}
	if code, _ := c.get(resource + "?watch=1&resourceVersion=abc"); code != http.StatusBadRequest {
		t.Errorf("watch from a bad resourceVersion: %d, want 400", code)
	}
}

func TestWatchControls(t *testing.T) {
	tests := []struct {
		name   string
		act    func(s *Server) int
		check  func(t *testing.T, s *Server, st *stream)
		opts   Options
		query  string
		noWait bool
	}{
		{
			name: "expire",
			act:  (*Server).ExpireWatches,
			check: func(t *testing.T, _ *Server, st *stream) {
				if got := st.next(); got.Type != "ERROR" || got.Code != http.StatusGone {
					t.Errorf("got %+v, want ERROR 410", got)
				}
				st.ended()
			},
		},
		{
			name: "end",
			act:  (*Server).EndWatches,
			check: func(t *testing.T, _ *Server, st *stream) {
				if err := st.ended(); err != io.EOF {
					t.Errorf("ended with %v, want a clean end", err)
				}
			},
		},
		{
			name: "drop",
			act:  (*Server).DropWatches,
			check: func(t *testing.T, _ *Server, st *stream) {
				if err := st.ended(); err == io.EOF || err == nil {
					t.Errorf("ended with %v, want a broken stream", err)
				}
			},
		},
		{
			name: "drop over HTTP/1.1",
			opts: Options{HTTP1: true},
			act:  (*Server).DropWatches,
			check: func(t *testing.T, _ *Server, st *stream) {
				if err := st.ended(); err == io.EOF || err == nil {
					t.Errorf("ended with %v, want a broken stream", err)
				}
			},
		},
		{
			name: "raw",
			act:  func(s *Server) int { return s.SendRaw("<html>oops</html>\n") },
			check: func(t *testing.T, _ *Server, st *stream) {
				if got := st.raw(); got != "<html>oops</html>\n" {
					t.Errorf("got %q", got)
				}
			},
		},
		{
			name: "hang, then release",
			act: func(s *Server) int {
				s.HangWatches(true)
				s.Put(node("late", 1))
				s.Bookmark()
				return s.OpenWatches()
			},
			check: func(t *testing.T, s *Server, st *stream) {
				st.quiet(100 * time.Millisecond)
				s.HangWatches(false)
				if got := st.next(); got.Name != "late" {
					t.Errorf("after the hang: %+v, want the held event", got)
				}
			},
		},
		{
			name:   "deadline: a bookmark, then the end",
			opts:   Options{MinRequestTimeout: 50 * time.Millisecond},
			noWait: true,
			act:    func(s *Server) int { return 1 },
			check: func(t *testing.T, _ *Server, st *stream) {
				if got := st.next(); got.Type != "BOOKMARK" {
					t.Errorf("got %+v, want a BOOKMARK", got)
				}
				if err := st.ended(); err != io.EOF {
					t.Errorf("ended with %v, want a clean end", err)
				}
			},
		},
		{
			name:   "timeoutSeconds",
			query:  "&timeoutSeconds=1",
			noWait: true,
			act:    func(s *Server) int { return 1 },
			check: func(t *testing.T, _ *Server, st *stream) {
				if got := st.next(); got.Type != "BOOKMARK" {
					t.Errorf("got %+v, want a BOOKMARK", got)
				}
				st.ended()
			},
		},
		{
			name:   "periodic bookmarks",
			opts:   Options{BookmarkInterval: 20 * time.Millisecond},
			noWait: true,
			act:    func(s *Server) int { return 1 },
			check: func(t *testing.T, _ *Server, st *stream) {
				for range 3 {
					if got := st.next(); got.Type != "BOOKMARK" {
						t.Errorf("got %+v, want a BOOKMARK", got)
					}
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, tc.opts)
			rv := c.s.MustPut(t, node("a", 255))
			st := c.watch("watch=1&allowWatchBookmarks=true&resourceVersion=" + rv + tc.query)
			if !tc.noWait {
				ctx, cancel := context.WithTimeout(context.Background(), waitFor)
				defer cancel()
				if err := c.s.AwaitWatches(ctx, 1); err != nil {
					t.Fatal(err)
				}
			}
			if n := tc.act(c.s); n != 1 {
				t.Errorf("reached %d watches, want 1", n)
			}
			tc.check(t, c.s, st)
		})
	}
}

func TestFaults(t *testing.T) {
	tests := []struct {
		name  string
		fault Fault
		check func(t *testing.T, resp *http.Response, err error)
	}{
		{"status", Fault{Code: 503}, func(t *testing.T, resp *http.Response, err error) {
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 503 || !strings.Contains(string(b), `"kind":"Status"`) {
				t.Errorf("got %d %s", resp.StatusCode, b)
			}
		}},
		{"garbage", Fault{Body: "this is not JSON"}, func(t *testing.T, resp *http.Response, err error) {
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(b) != "this is not JSON" {
				t.Errorf("got %d %q", resp.StatusCode, b)
			}
		}},
		{"drop", Fault{Drop: true}, func(t *testing.T, resp *http.Response, err error) {
			if err == nil {
				_, err = io.ReadAll(resp.Body)
			}
			if err == nil {
				t.Errorf("no error from a dropped request")
			}
		}},
		{"hang", Fault{Hang: true}, func(t *testing.T, resp *http.Response, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("got %v, want the client's deadline", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, Options{})
			c.s.MustPut(t, node("a", 255))
			c.s.Inject(KindList, tc.fault)
			// Only the hanging answer waits for the client's deadline; the others are
			// given waitFor, so that a busy machine does not turn them into timeouts.
			timeout := waitFor
			if tc.fault.Hang {
				timeout = 200 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			resp, err := c.do(ctx, resource)
			if err == nil {
				defer resp.Body.Close()
			}
			tc.check(t, resp, err)
			// One fault, one request: the next is answered.
			if got := names(c.list("")); !cmp.Equal(got, []string{"a"}) {
				t.Errorf("after the fault: %v", got)
			}
		})
	}
}

func TestDownAndRestart(t *testing.T) {
	c := newClient(t, Options{})
	rv := c.s.MustPut(t, node("a", 255))
	st := c.watch("watch=1&resourceVersion=" + rv)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if err := c.s.AwaitWatches(ctx, 1); err != nil {
		t.Fatal(err)
	}
	c.s.Restart()
	if err := st.ended(); err == io.EOF || err == nil {
		t.Errorf("watch across a restart ended with %v, want a broken stream", err)
	}
	w := c.watch("watch=1&resourceVersion=" + rv)
	if got := w.next(); got.Type != "ERROR" || got.Code != http.StatusGone {
		t.Errorf("watch from before the restart: %+v, want ERROR 410", got)
	}
	c.s.SetDown(true)
	if _, err := c.do(ctx, resource); err == nil {
		t.Errorf("request while down succeeded")
	}
	c.s.SetDown(false)
	if got := names(c.list("")); !cmp.Equal(got, []string{"a"}) {
		t.Errorf("after down: %v", got)
	}
}

func TestToken(t *testing.T) {
	c := newClient(t, Options{Token: "one"})
	dir := t.TempDir()
	if err := c.s.WriteServiceAccount(dir); err != nil {
		t.Fatal(err)
	}
	tok, _ := os.ReadFile(filepath.Join(dir, "token"))
	ca, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if string(tok) != "one\n" || !strings.Contains(string(ca), "BEGIN CERTIFICATE") {
		t.Errorf("service account dir: token %q, ca.crt %q", tok, ca)
	}
	if code, _ := c.get(resource); code != http.StatusOK {
		t.Errorf("right token: %d", code)
	}
	if err := c.s.RotateToken(dir, "two"); err != nil {
		t.Fatal(err)
	}
	code, body := c.get(resource)
	if code != http.StatusUnauthorized || !strings.Contains(body, `"kind":"Status"`) {
		t.Errorf("old token: %d %s, want 401 with a Status", code, body)
	}
	tok, _ = os.ReadFile(filepath.Join(dir, "token"))
	c.tok = strings.TrimSpace(string(tok))
	if code, _ := c.get(resource); code != http.StatusOK {
		t.Errorf("rotated token: %d", code)
	}
	if diff := cmp.Diff(map[Kind]int{KindList: 2, KindUnauthorized: 1}, c.s.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
	host, port := c.s.HostPort()
	if diff := cmp.Diff([]string{"KUBERNETES_SERVICE_HOST=" + host, "KUBERNETES_SERVICE_PORT=" + port}, c.s.Env()); diff != "" || host != "127.0.0.1" {
		t.Errorf("Env (-want +got):\n%s (host %s)", diff, host)
	}
}

func TestPatchAndReplace(t *testing.T) {
	c := newClient(t, Options{})
	c.s.MustPut(t, Node{Name: "odd", Patch: func(o map[string]any) {
		o["spec"].(map[string]any)["encryption"] = map[string]any{"key": "255"}
	}})
	c.s.MustPut(t, node("gone", 1))
	if _, body := c.get(resource + "/odd"); !strings.Contains(body, `"key":"255"`) {
		t.Errorf("patched object: %s", body)
	}
	if _, err := c.s.Replace(node("x", 1), node("odd", 0)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"odd", "x"}, c.s.Names()); diff != "" {
		t.Errorf("after Replace (-want +got):\n%s", diff)
	}
	if _, err := c.s.Put(Node{}); err == nil {
		t.Errorf("Put of a node without a name succeeded")
	}
	if _, ok, _ := c.s.Update("nobody", nil); ok {
		t.Errorf("Update of a missing node reported ok")
	}
}

func TestHandle(t *testing.T) {
	c := newClient(t, Options{})
	c.s.Handle("/api/v1/events", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "events "+r.URL.Path)
	}))
	c.s.Handle("/api/v1/nodes/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "nodes "+r.URL.Path)
	}))
	for path, want := range map[string]string{
		"/api/v1/events":         "events /api/v1/events",
		"/api/v1/nodes/n1":       "nodes /api/v1/nodes/n1",
		"/api/v1/nodes/n1?x=a=b": "nodes /api/v1/nodes/n1",
	} {
		if code, body := c.get(path); code != http.StatusOK || body != want {
			t.Errorf("GET %s: %d %q, want 200 %q", path, code, body, want)
		}
	}
	// Not under a handler's path, or the handler removed: 404.
	c.s.Handle("/api/v1/events", nil)
	for _, path := range []string{"/api/v1/events", "/api/v1/events/x", "/api/v1/nodes"} {
		if code, _ := c.get(path); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, code)
		}
	}
	// The server's own paths are not handed over.
	c.s.Handle(resource+"/", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "taken") }))
	if code, body := c.get(resource + "/worker-1"); code != http.StatusNotFound || strings.Contains(body, "taken") {
		t.Errorf("GET of a CiliumNode with a handler under it: %d %s", code, body)
	}
	// Faults of KindHandled come first; a wrong token never reaches the handler.
	c.s.Inject(KindHandled, Fault{Code: 503})
	if code, _ := c.get("/api/v1/nodes/n1"); code != 503 {
		t.Errorf("injected 503: got %d", code)
	}
	c.tok = "wrong"
	if code, body := c.get("/api/v1/nodes/n1"); code != http.StatusUnauthorized || strings.Contains(body, "nodes") {
		t.Errorf("wrong token: %d %s", code, body)
	}
	want := map[Kind]int{KindHandled: 4, KindOther: 3, KindGet: 1, KindUnauthorized: 1}
	if diff := cmp.Diff(want, c.s.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
}

// post sends body to path with the client's token and returns the status and the body.
func (c *client) post(path, body string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.s.URL()+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.tok)
	resp, err := c.c.Do(req)
	if err != nil {
		c.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("POST %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

func TestReviews(t *testing.T) {
	c := newClient(t, Options{
		Users:   map[string]string{"alice-token": "alice", "bob-token": "bob"},
		Allowed: map[string][]string{"alice": {"/metrics"}},
		Extra:   map[string][]string{"k": {"v"}},
	})
	tr := func(token string) string {
		return `{"apiVersion":"authentication.k8s.io/v1","kind":"TokenReview","spec":{"token":"` + token + `"}}`
	}
	sar := func(user, path, verb string) string {
		return `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"` + user +
			`","nonResourceAttributes":{"path":"` + path + `","verb":"` + verb + `"}}}`
	}
	for _, tc := range []struct {
		name, path, body string
		code             int
		want             string
	}{
		{"known token", tokenReviewsPath, tr("alice-token"), 201,
			`"status":{"authenticated":true,"user":{"extra":{"k":["v"]},"groups":["system:authenticated"],"uid":"alice-uid","username":"alice"}}`},
		{"unknown token", tokenReviewsPath, tr("garbage"), 201, `"status":{"authenticated":false,"error":"invalid bearer token"}`},
		{"allowed", subjectAccessReviewsPath, sar("alice", "/metrics", "get"), 201, `"status":{"allowed":true}`},
		{"other path", subjectAccessReviewsPath, sar("alice", "/debug", "get"), 201, `"status":{"allowed":false}`},
		{"other verb", subjectAccessReviewsPath, sar("alice", "/metrics", "post"), 201, `"status":{"allowed":false}`},
		{"other user", subjectAccessReviewsPath, sar("bob", "/metrics", "get"), 201, `"status":{"allowed":false}`},
		{"wrong kind", subjectAccessReviewsPath, tr("alice-token"), 400, `not a SubjectAccessReview`},
	} {
		if code, body := c.post(tc.path, tc.body); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d with %s", tc.name, code, body, tc.code, tc.want)
		}
	}
}

func TestIntercept(t *testing.T) {
	c := newClient(t, Options{Users: map[string]string{"alice-token": "alice"}})
	review := `{"kind":"TokenReview","spec":{"token":"alice-token"}}`
	var seen []string
	c.s.Intercept(KindTokenReview, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		b, _ := io.ReadAll(r.Body)
		seen = append(seen, string(b))
		if strings.Contains(string(b), "fail") {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		next.ServeHTTP(w, r)
	})
	if code, body := c.post(tokenReviewsPath, review); code != 201 || !strings.Contains(body, `"username":"alice"`) {
		t.Errorf("passed on: %d %s", code, body)
	}
	if code, _ := c.post(tokenReviewsPath, `{"kind":"TokenReview","spec":{"token":"fail"}}`); code != 500 {
		t.Errorf("answered by the interceptor: %d, want 500", code)
	}
	// A fault comes first; other kinds and a wrong token are not intercepted.
	c.s.Inject(KindTokenReview, Fault{Code: 503})
	if code, _ := c.post(tokenReviewsPath, review); code != 503 {
		t.Errorf("fault: %d, want 503", code)
	}
	c.post(subjectAccessReviewsPath, `{"kind":"SubjectAccessReview"}`)
	c.tok = "wrong"
	c.post(tokenReviewsPath, review)
	if len(seen) != 2 {
		t.Errorf("the interceptor saw %d requests, want 2: %q", len(seen), seen)
	}
	// Refused requests reach an interceptor of KindUnauthorized; next answers 401.
	refused := 0
	c.s.Intercept(KindUnauthorized, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		refused++
		next.ServeHTTP(w, r)
	})
	if code, body := c.post(tokenReviewsPath, review); code != 401 || refused != 1 || !strings.Contains(body, `"reason":"Unauthorized"`) {
		t.Errorf("wrong token, intercepted: %d %s, %d seen, want 401 seen once", code, body, refused)
	}
	c.tok = c.s.Token()
	c.s.Intercept(KindTokenReview, nil)
	if code, _ := c.post(tokenReviewsPath, `{"kind":"TokenReview","spec":{"token":"fail"}}`); code != 201 {
		t.Errorf("interceptor removed: %d, want 201", code)
	}
	want := map[Kind]int{KindTokenReview: 4, KindAccessReview: 1, KindUnauthorized: 2}
	if diff := cmp.Diff(want, c.s.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
}
