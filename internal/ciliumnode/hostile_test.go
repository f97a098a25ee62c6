package ciliumnode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/apitest"
)

// These tests answer as a hostile or broken API server would (issue 22): each one's
// assertion failed on the code before the bounds.

// plainServer is a plain-HTTP server that records the Authorization headers it receives
// and answers every request with a list holding a fake peer.
func plainServer(t *testing.T) (srv *httptest.Server, tokens func() []string) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []string
	)
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"apiVersion":"cilium.io/v2","kind":"CiliumNodeList","metadata":{"resourceVersion":"1"},"items":[`+
			`{"metadata":{"name":"fake"},"spec":{"encryption":{"key":255},"addresses":[{"type":"InternalIP","ip":"192.0.2.66"}]}}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// TestHostileRedirectNotFollowed (bug 5): a redirect to plain HTTP on another port is not
// followed, by the list, the watch or a Source's GET: the token never arrives there and
// nothing it answers is taken.
func TestHostileRedirectNotFollowed(t *testing.T) {
	t.Run("list and watch", func(t *testing.T) {
		h := newLive(t, apitest.Options{}, apiNode("worker-1", 255, "10.0.0.5"))
		plain, tokens := plainServer(t)
		defer noTokens(t, tokens)
		// Before the source starts: its first list and watch must meet them.
		h.api.Inject(apitest.KindList, apitest.Fault{Location: plain.URL + "/apis/cilium.io/v2/ciliumnodes?limit=500"})
		h.api.Inject(apitest.KindWatch, apitest.Fault{Location: plain.URL + "/apis/cilium.io/v2/ciliumnodes?watch=1"})
		h.start(nil)
		h.await("the real node", "worker-1 on 10.0.0.5")
		h.eventually("the redirected watch refused", func() bool { return h.api.Count(apitest.KindWatch) >= 2 })
		if st := h.src.Stats(); st.HTTPError < 2 {
			t.Errorf("HTTPError %d, want 2: the redirected list and watch", st.HTTPError)
		}
		h.logs.want(t, "WARN", "302 Found: a redirect to", "not followed")
		if _, ok := h.lastPeers().Get("fake"); ok {
			t.Errorf("the redirect's answer was taken: %v", summary(h.lastPeers()))
		}
	})
	t.Run("get", func(t *testing.T) {
		api := apitest.New(t, apitest.Options{})
		plain, tokens := plainServer(t)
		defer noTokens(t, tokens)
		dir := t.TempDir()
		if err := api.WriteServiceAccount(dir); err != nil {
			t.Fatal(err)
		}
		api.MustPut(t, apiNode("worker-1", 255, "10.0.0.5"))
		api.Inject(apitest.KindGet, apitest.Fault{Location: plain.URL + "/apis/cilium.io/v2/ciliumnodes/worker-1", Code: http.StatusTemporaryRedirect})
		src, err := New(Config{Server: api.URL(), NodeName: "worker-1", TokenFile: filepath.Join(dir, "token"),
			CAFile: filepath.Join(dir, "ca.crt"), Backoff: backoff.NewConstantBackOff(10 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		modes := make(chan Mode, 4)
		runInBackground(t, func(ctx context.Context) error { return src.Run(ctx, func(m Mode) { modes <- m }) })
		select {
		case m := <-modes:
			if m != Encrypting {
				t.Errorf("mode %v, want yes", m)
			}
		case <-time.After(waitFor):
			t.Fatal("no mode")
		}
		if st := src.Stats(); st.HTTPError != 1 || st.OK != 1 {
			t.Errorf("HTTPError %d, OK %d; want 1, 1", st.HTTPError, st.OK)
		}
	})
}

func noTokens(t *testing.T, tokens func() []string) {
	t.Helper()
	if got := tokens(); len(got) > 0 {
		t.Errorf("the plain-HTTP server got %d requests, tokens %q: want none", len(got), got)
	}
}

// TestHostileTrickledWatch (rough edge): a watch that sends a byte now and then but never
// completes an event is restarted after WatchTimeout.
func TestHostileTrickledWatch(t *testing.T) {
	h := startLive(t, apitest.Options{}, func(c *Config) { c.WatchTimeout = 300 * time.Millisecond },
		apiNode("worker-1", 255, "10.0.0.5"))
	h.await("listed", "worker-1 on 10.0.0.5")
	if err := h.api.AwaitWatches(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		h.api.SendRaw(`{"type":"MODIFIED","object":{"metadata":{"name":`)
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				h.api.SendRaw(" ")
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	// The restart is counted before the loop logs it: wait for the line, then check the count.
	h.eventually("the trickling watch's warning", func() bool { return h.logs.has("WARN", "no complete event for 300ms") })
	if st := h.src.Stats(); st.WatchRestart < 1 {
		t.Errorf("WatchRestart %d after the warning, want >= 1", st.WatchRestart)
	}
}

// TestHostileRemainingItemCount (rough edge): a page that claims 1,048,575 more items
// sizes nothing: the list of two nodes allocates a few KiB, not a slice of a million.
func TestHostileRemainingItemCount(t *testing.T) {
	item := func(name string) string {
		return `{"metadata":{"name":"` + name + `","resourceVersion":"5"},"spec":{"encryption":{"key":255},"addresses":[{"type":"InternalIP","ip":"10.0.0.5"}]}}`
	}
	page := func(cont, it string) string {
		return `{"apiVersion":"cilium.io/v2","kind":"CiliumNodeList","metadata":{"resourceVersion":"5","continue":"` + cont +
			`","remainingItemCount":1048575},"items":[` + it + `]}`
	}
	api := apitest.New(t, apitest.Options{})
	api.Inject(apitest.KindList,
		apitest.Fault{Body: page("next", item("worker-1"))},
		apitest.Fault{Body: strings.Replace(page("", item("worker-2")), `"continue":"",`, "", 1)})
	dir := t.TempDir()
	if err := api.WriteServiceAccount(dir); err != nil {
		t.Fatal(err)
	}
	src, err := NewPeers(Config{Server: api.URL(), TokenFile: filepath.Join(dir, "token"), CAFile: filepath.Join(dir, "ca.crt")})
	if err != nil {
		t.Fatal(err)
	}
	var reports atomic.Int32
	reported := make(chan Peers, 4)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	runInBackground(t, func(ctx context.Context) error {
		return src.Run(ctx, func(ps Peers) { reports.Add(1); reported <- ps })
	})
	select {
	case ps := <-reported:
		runtime.ReadMemStats(&after)
		if got := summary(ps); !slices.Equal(got, []string{"worker-1 on 10.0.0.5", "worker-2 on 10.0.0.5"}) {
			t.Errorf("reported %v", got)
		}
	case <-time.After(waitFor):
		t.Fatal("no report")
	}
	// A slice of 1,048,575 Peers would be 50 MB; TLS, HTTP/2 and the test server take
	// a few hundred KiB.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("the list allocated %d bytes, want less than 8 MiB", alloc)
	}
}

// TestHostileManyAddresses (bug 4): a CiliumNode with 90,000 InternalIPs yields at most
// MaxNodeAddrs of them, and says the node is cut.
func TestHostileManyAddresses(t *testing.T) {
	ips := make([]string, 90000)
	for i := range ips {
		ips[i] = fmt.Sprintf("10.%d.%d.%d", 1+i>>16, i>>8&0xff, i&0xff)
	}
	h := startLive(t, apitest.Options{}, nil, apiNode("worker-1", 255, "10.0.0.5"), apiNode("worker-2", 255, ips...))
	h.eventually("listed", func() bool { return h.lastPeers().Len() == 2 })
	p, _ := h.lastPeers().Get("worker-2")
	if len(p.Addrs) > MaxNodeAddrs {
		t.Fatalf("worker-2 has %d addresses, want at most %d", len(p.Addrs), MaxNodeAddrs)
	}
	if len(p.Addrs) != MaxNodeAddrs || p.Addrs[0].String() != "10.1.0.0" {
		t.Errorf("worker-2's addresses %v, want the first %d", p.Addrs, MaxNodeAddrs)
	}
	if !strings.Contains(p.Problem, "90000 InternalIPs, more than 16") {
		t.Errorf("worker-2's Problem %q, want it cut", p.Problem)
	}
	h.logs.want(t, "WARN", "CiliumNode worker-2: 90000 InternalIPs, more than 16: the rest left out", "the peer set is incomplete")
	if st := h.src.Stats(); st.Problems != 1 {
		t.Errorf("Problems %d, want 1", st.Problems)
	}
}

// TestHostileBadAddresses (rough edge): the broadcast address, link-local and the other
// non-peer addresses are left out, each logged with its reason, quoted as sent.
func TestHostileBadAddresses(t *testing.T) {
	h := startLive(t, apitest.Options{}, nil,
		apiNode("worker-1", 255, "10.0.0.5", "255.255.255.255", " 10.0.0.22", "169.254.0.7", "fe80::7", "224.0.0.1"))
	h.await("listed", "worker-1 on 10.0.0.5")
	h.logs.want(t, "WARN", `InternalIP "255.255.255.255" (broadcast), " 10.0.0.22" (not an IP address), "169.254.0.7" (link-local), "fe80::7" (link-local), "224.0.0.1" (multicast) is not a peer's address; left out`)
}

// TestHostileWronglyTypedObject (rough edge): one CiliumNode whose key is a string does
// not fail the list: the others are used, and the node is reported as a problem; in a
// watch its last good entry stands.
func TestHostileWronglyTypedObject(t *testing.T) {
	badKey := func(o map[string]any) { o["spec"].(map[string]any)["encryption"] = map[string]any{"key": "abc"} }
	h := startLive(t, apitest.Options{}, nil,
		apiNode("worker-1", 255, "10.0.0.5"), apiNode("worker-2", 255, "10.0.0.6"),
		apitest.Node{Name: "worker-9", Key: 255, InternalIPs: []string{"10.0.0.9"}, Patch: badKey})
	h.await("the good nodes listed", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6")
	probs := h.lastPeers().Problems()
	if len(probs) != 1 || probs[0].Name != "worker-9" || !strings.Contains(probs[0].Problem, "spec.encryption.key") {
		t.Fatalf("Problems %+v, want worker-9's key", probs)
	}
	h.logs.want(t, "WARN", "CiliumNode worker-9: skipped: ", "left out (no good read of it yet): the peer set is incomplete")

	// Fixed, then broken again in a watch event: the fixed entry stands, marked.
	h.api.Put(apiNode("worker-9", 255, "10.0.0.9"))
	h.eventually("worker-9 fixed", func() bool { return len(h.lastPeers().Problems()) == 0 && h.lastPeers().Len() == 3 })
	h.api.Put(apitest.Node{Name: "worker-9", Key: 0, InternalIPs: []string{"10.0.0.99"}, Patch: badKey})
	h.eventually("worker-9 broken again", func() bool { return len(h.lastPeers().Problems()) == 1 })
	if p, _ := h.lastPeers().Get("worker-9"); peerLine(p) != "worker-9 on 10.0.0.9" {
		t.Errorf("worker-9 %q, want its last good entry", peerLine(p))
	}
	h.logs.want(t, "WARN", "CiliumNode worker-9: skipped: ", "its last good entry stands")
	if st := h.src.Stats(); st.Lists != 1 || st.DecodeError != 0 {
		t.Errorf("Lists %d, DecodeError %d; want 1, 0: nothing failed", st.Lists, st.DecodeError)
	}
}

// TestHostileEndlessList (bug 3): a list whose every page carries a new continue token
// fails after MaxListPages pages, or after items beyond MaxPeerBytes, and the last set
// stands.
func TestHostileEndlessList(t *testing.T) {
	for _, tc := range []struct {
		name  string
		nodes int
		long  bool // names of 200 bytes: the memory bound is reached in fewer pages
		log   string
	}{
		{"pages", 3, false, "more than 1000 pages"},
		{"items", 600, true, "more CiliumNodes than 16 MiB holds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []apitest.Node
			var want []string
			for i := range tc.nodes {
				ip := fmt.Sprintf("10.0.%d.%d", i>>8, i&0xff)
				name := fmt.Sprintf("worker-%03d", i)
				if tc.long {
					name += "." + strings.Repeat("x", 189)
				}
				nodes = append(nodes, apiNode(name, 255, ip))
				want = append(want, fmt.Sprintf("%s on %s", name, ip))
			}
			h := startLive(t, apitest.Options{}, func(c *Config) { c.RequestTimeout = time.Minute }, nodes...)
			h.await("listed", want...)
			if err := h.api.AwaitWatches(t.Context(), 1); err != nil {
				t.Fatal(err)
			}
			h.api.SetEndlessList(true)
			h.api.ExpireWatches()
			start := time.Now()
			(&harness{t: t}).eventuallyWithin("failed the endless list", 3*time.Minute, func() bool { return h.logs.has("WARN", tc.log) })
			t.Logf("failed after %v, %d pages", time.Since(start).Round(time.Millisecond), h.src.Stats().OK)
			h.api.SetEndlessList(false)
			h.eventually("listed again", func() bool { return h.src.Stats().Lists == 2 })
			if _, n, _ := h.snapshot(); n != 1 {
				t.Errorf("%d reports, want 1: the failed list changes nothing and the next is the same", n)
			}
		})
	}
}

// has reports whether a record at level has a message containing each of parts.
func (l *logBuffer) has(level string, parts ...string) bool {
	l.mu.Lock()
	text := l.buf.String()
	l.mu.Unlock()
	for line := range strings.Lines(text) {
		var r record
		if json.Unmarshal([]byte(line), &r) != nil || r.Level != level {
			continue
		}
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(r.Msg, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// want checks that a record at level has a message containing each of parts.
func (l *logBuffer) want(t *testing.T, level string, parts ...string) {
	t.Helper()
	(&harness{t: t, logs: l}).wantLog(level, parts...)
}

// TestPeersSkipLarge: an item larger than 4 MiB, read whole, is skipped like one that
// does not decode; the rest of the list stands.
func TestPeersSkipLarge(t *testing.T) {
	h := startPeers(t, setup{})
	h.api.expectList(t, "").reply(http.StatusOK, listJSON("100", "", append(slices.Clone(threeNodes), node("1", named("x"), huge))...))
	h.api.expectWatchAll(t, "100")
	h.wantReported(threeSummary)
	h.wantLog("WARN", "CiliumNode x: skipped: an object larger than 4194304 bytes", "left out")
}

// TestWireAddrs: spec.addresses is decoded element by element, keeping the first
// MaxNodeAddrs InternalIPs and counting what does not fit the schema.
func TestWireAddrs(t *testing.T) {
	var many []string
	for i := range MaxNodeAddrs + 3 {
		many = append(many, fmt.Sprintf(`{"type":"InternalIP","ip":"10.0.0.%d"}`, i))
	}
	tests := []struct {
		name        string
		json        string
		ips         []string
		more, wrong int
	}{
		{"null", `null`, nil, 0, 0},
		{"empty", `[]`, nil, 0, 0},
		{"not an array", `"10.0.0.1"`, nil, 0, 1},
		{"an object", `{"type":"InternalIP"}`, nil, 0, 1},
		{
			"mixed", ` [ {"type":"ExternalIP","ip":"203.0.113.1"}, {"ip":"10.0.0.1","type":"InternalIP"}, 5, "s,]}", true,
			{"type":"InternalIP","ip":7}, [1, {"a":2}], {"type":"InternalIP","ip":"a\"},]{[b","x":{"y":["]"]}}, null ] `,
			[]string{"10.0.0.1", `a"},]{[b`}, 0, 6, // 5, "s,]}", true, ip 7, [1, …], null
		},
		{"more than MaxNodeAddrs", "[" + strings.Join(many, ",") + "]", nil, 3, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a wireAddrs
			if err := json.Unmarshal([]byte(tc.json), &a); err != nil {
				t.Fatal(err)
			}
			if tc.more > 0 {
				if len(a.ips) != MaxNodeAddrs || a.ips[0] != "10.0.0.0" {
					t.Errorf("ips %q, want the first %d", a.ips, MaxNodeAddrs)
				}
			} else if !slices.Equal(a.ips, tc.ips) {
				t.Errorf("ips %q, want %q", a.ips, tc.ips)
			}
			if a.more != tc.more || a.wrong != tc.wrong {
				t.Errorf("more %d, wrong %d; want %d, %d", a.more, a.wrong, tc.more, tc.wrong)
			}
		})
	}
}

// FuzzWireAddrs checks the element walk of wireAddrs against a slow reference that
// decodes the whole array first.
func FuzzWireAddrs(f *testing.F) {
	for _, s := range []string{`null`, `[]`, `"x"`, `[{"type":"InternalIP","ip":"10.0.0.1"},5,"s,]}",true,null]`,
		`[{"type":"InternalIP","ip":"a\"},]{[b","x":{"y":["]"]}},[1,{"a":2}]]`, `[{"type":"InternalIP","ip":7}]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !json.Valid([]byte(s)) {
			return
		}
		var got wireAddrs
		if err := json.Unmarshal([]byte(s), &got); err != nil {
			t.Fatal(err)
		}
		var want wireAddrs
		var elems []json.RawMessage
		if err := json.Unmarshal([]byte(s), &elems); err != nil {
			want.wrong = 1
		} else if strings.TrimSpace(s) == "null" {
			want.wrong = 0
		}
		for _, e := range elems {
			var x struct {
				Type string `json:"type"`
				IP   string `json:"ip"`
			}
			switch {
			case json.Unmarshal(e, &x) != nil || strings.TrimSpace(string(e)) == "null":
				want.wrong++
			case x.Type != "InternalIP":
			case len(want.ips) < MaxNodeAddrs:
				want.ips = append(want.ips, x.IP)
			default:
				want.more++
			}
		}
		if !slices.Equal(got.ips, want.ips) || got.more != want.more || got.wrong != want.wrong {
			t.Errorf("%q: got %+v, want %+v", s, got, want)
		}
	})
}

// TestPeersBounds: Encrypting returns at most MaxPeerAddrs addresses, the lowest, and
// counts the others; a snapshot as large as MaxPeerBytes takes no new node (it counts it as
// dropped) but still takes changes of the nodes it holds.
func TestPeersBounds(t *testing.T) {
	var nodes []Peer
	bytes := 0
	for i := 0; ; i++ {
		p := Peer{Name: fmt.Sprintf("n%06d", i), Encrypting: true}
		for j := range 3 {
			p.Addrs = append(p.Addrs, netip.AddrFrom4([4]byte{10 + byte(j), byte(i >> 16), byte(i >> 8), byte(i)}))
		}
		if bytes+p.cost() > MaxPeerBytes {
			break
		}
		bytes += p.cost()
		nodes = append(nodes, p)
	}
	n := len(nodes)
	ps := peersOf(nodes)
	addrs, left := ps.Encrypting("")
	if len(addrs) != MaxPeerAddrs || left != 3*n-MaxPeerAddrs || addrs[0].String() != "10.0.0.0" || !slices.IsSortedFunc(addrs, netip.Addr.Compare) {
		t.Errorf("Encrypting: %d addresses from %v, %d left out; want %d, the lowest, %d left out",
			len(addrs), addrs[0], left, MaxPeerAddrs, 3*n-MaxPeerAddrs)
	}
	full := ps.with(Peer{Name: "zz-new"}).withSkipped("zz-bad", "skipped: x")
	if full.Len() != n || full.Dropped() != 2 || len(full.Problems()) != 0 {
		t.Errorf("beyond MaxPeerBytes: %d nodes, %d dropped, %d problems; want %d, 2, 0", full.Len(), full.Dropped(), len(full.Problems()), n)
	}
	changed := full.with(Peer{Name: "n000000"}).withSkipped("n000001", "skipped: x")
	if p, _ := changed.Get("n000000"); p.Encrypting || len(p.Addrs) != 0 {
		t.Errorf("a held node's change not taken: %+v", p)
	}
	if p, _ := changed.Get("n000001"); p.Problem != "skipped: x" || len(p.Addrs) != 3 {
		t.Errorf("a held node skipped: %+v, want its last entry marked", p)
	}
	if changed.Dropped() != 2 {
		t.Errorf("dropped %d, want 2: nothing new", changed.Dropped())
	}
	if back := changed.without("n000000").without("n000001"); back.bytes != bytes-nodes[0].cost()-nodes[1].cost() {
		t.Errorf("bytes %d after removing two nodes, want %d", back.bytes, bytes-nodes[0].cost()-nodes[1].cost())
	}
	t.Logf("MaxPeerBytes holds %d nodes of 3 addresses and a 7-byte name", n)
}
