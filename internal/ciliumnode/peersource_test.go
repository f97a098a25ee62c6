package ciliumnode

import (
	"context"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/goleak"
)

// These tests drive a PeerSource request by request with the scripted fakeAPI of
// ciliumnode_test.go; peerserver_test.go runs it against the stand-in API server.

// peerScript runs a PeerSource against a fakeAPI.
type peerScript struct {
	t       *testing.T
	api     *fakeAPI
	src     *PeerSource
	reports chan Peers
	logs    *logBuffer
	token   *harness // writes the token file
}

// startPeers serves a fakeAPI and runs a PeerSource against it until the test ends, with
// fakeConfig (ciliumnode_test.go) and token-1 unless s.cfg edits it.
func startPeers(t *testing.T, s setup) *peerScript {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	h := &peerScript{t: t, api: newFakeAPI(t, s.http1), reports: make(chan Peers, 64), logs: &logBuffer{}}
	h.token = &harness{t: t, tokenFile: filepath.Join(t.TempDir(), "token")}
	h.token.writeToken("token-1")
	cfg := fakeConfig(t, h.api, h.token.tokenFile, h.logs)
	if s.cfg != nil {
		s.cfg(&cfg)
	}
	src, err := NewPeers(cfg)
	if err != nil {
		t.Fatalf("NewPeers: %v", err)
	}
	h.src = src
	runInBackground(t, func(ctx context.Context) error { return src.Run(ctx, func(p Peers) { h.reports <- p }) })
	return h
}

// expectList returns the next request and checks that it lists CiliumNodes from cont.
func (f *fakeAPI) expectList(t *testing.T, cont string) *exchange {
	t.Helper()
	x := f.next(t)
	want := url.Values{"limit": {"500"}}
	if cont != "" {
		want["continue"] = []string{cont}
	}
	if x.req.URL.Path != "/apis/cilium.io/v2/ciliumnodes" {
		t.Fatalf("got %s %s, want a list", x.req.Method, x.req.URL)
	}
	if diff := cmp.Diff(want, x.req.URL.Query()); diff != "" {
		t.Fatalf("list query mismatch (-want +got):\n%s", diff)
	}
	x.checkCommon()
	return x
}

// expectWatchAll returns the next request and checks that it watches every CiliumNode from rv.
func (f *fakeAPI) expectWatchAll(t *testing.T, rv string) *exchange {
	t.Helper()
	x := f.next(t)
	if x.req.URL.Path != "/apis/cilium.io/v2/ciliumnodes" {
		t.Fatalf("got %s %s, want a watch from resourceVersion %s", x.req.Method, x.req.URL, rv)
	}
	want := url.Values{"watch": {"1"}, "resourceVersion": {rv}, "allowWatchBookmarks": {"true"}}
	if diff := cmp.Diff(want, x.req.URL.Query()); diff != "" {
		t.Fatalf("watch query mismatch (-want +got):\n%s", diff)
	}
	x.checkCommon()
	return x
}

// listJSON is a CiliumNodeList page.
func listJSON(rv, cont string, items ...string) string {
	meta := `{"resourceVersion":"` + rv + `"`
	if cont != "" {
		meta += `,"continue":"` + cont + `","remainingItemCount":1`
	}
	return `{"apiVersion":"cilium.io/v2","kind":"CiliumNodeList","metadata":` + meta + `},"items":[` + strings.Join(items, ",") + "]}"
}

// peerNode is a CiliumNode named name at rv with InternalIPs ips.
func peerNode(name, rv string, encrypting bool, ips ...string) string {
	var pairs []string
	for _, ip := range ips {
		pairs = append(pairs, "InternalIP", ip)
	}
	pairs = append(pairs, "CiliumInternalIP", "10.244.9.9")
	edits := []func(map[string]any){named(name), addrs(pairs...)}
	if !encrypting {
		edits = append(edits, optedOut)
	}
	return node(rv, edits...)
}

// huge pads a CiliumNode past maxBody, as no real one is (etcd stores at most 1.5 MiB).
func huge(n map[string]any) {
	metadata(n)["annotations"] = map[string]any{"pad": strings.Repeat("x", maxBody+1)}
}

// threeNodes is the list of the tests: this node, an encrypting peer, an opted-out one.
var threeNodes = []string{
	peerNode("worker-1", "90", true, "10.0.0.5"),
	peerNode("worker-2", "95", true, "10.0.0.6", "fd00::6"),
	peerNode("cp-1", "80", false, "10.0.0.2"),
}

var threeSummary = []string{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6,fd00::6"}

// goodStart answers the list with threeNodes at resourceVersion 100 and returns the watch.
func (h *peerScript) goodStart() *exchange {
	h.t.Helper()
	h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("100", "", threeNodes...))
	return h.api.expectWatchAll(h.t, "100")
}

// reported returns the summaries of the snapshots reported so far. Run reports before it
// sends its next request, so after receiving a request this is complete.
func (h *peerScript) reported() [][]string {
	var got [][]string
	for {
		select {
		case p := <-h.reports:
			got = append(got, summary(p))
		default:
			return got
		}
	}
}

func (h *peerScript) wantReported(want ...[]string) {
	h.t.Helper()
	if diff := cmp.Diff(want, h.reported(), cmpopts.EquateEmpty()); diff != "" {
		h.t.Errorf("reported snapshots (-want +got):\n%s", diff)
	}
}

func (h *peerScript) wantStats(want PeerStats) {
	h.t.Helper()
	got := h.src.Stats()
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(PeerStats{}, "LastGoodRead")); diff != "" {
		h.t.Errorf("Stats (-want +got):\n%s", diff)
	}
	if want.Lists > 0 && got.LastGoodRead.IsZero() {
		h.t.Errorf("Stats.LastGoodRead is zero after a good list")
	}
}

// wantStatsTimed is wantStats for tests with short timeouts: a timeout may fire again before
// the test takes the next request, so WatchRestart and NetworkError may exceed want.
func (h *peerScript) wantStatsTimed(want PeerStats) {
	h.t.Helper()
	got := h.src.Stats()
	want.WatchRestart = max(want.WatchRestart, got.WatchRestart)
	want.NetworkError = max(want.NetworkError, got.NetworkError)
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(PeerStats{}, "LastGoodRead")); diff != "" {
		h.t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

func (h *peerScript) wantLog(level string, parts ...string) {
	h.t.Helper()
	(&harness{t: h.t, logs: h.logs}).wantLog(level, parts...)
}

// synced is the PeerStats after the good start: one list page, threeNodes.
func synced(edit func(*PeerStats)) PeerStats {
	st := PeerStats{OK: 1, Lists: 1, Reports: 1, Synced: true, Peers: 3, Encrypting: 2}
	if edit != nil {
		edit(&st)
	}
	return st
}

func TestPeersList(t *testing.T) {
	tests := []struct {
		name   string
		answer func(h *peerScript) // answers the list (every page), leaving the watch next
		rv     string              // the watch starts here
		want   []string            // the first report
		stats  PeerStats
		log    []string // a WARN record
	}{
		{
			name: "one page",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("100", "", threeNodes...))
			},
			rv:    "100",
			want:  threeSummary,
			stats: synced(nil),
		},
		{
			name: "two pages, one report",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("100", "c1/x y", threeNodes[:2]...))
				h.api.expectList(h.t, "c1/x y").reply(http.StatusOK, listJSON("100", "", threeNodes[2]))
			},
			rv:    "100",
			want:  threeSummary,
			stats: synced(func(st *PeerStats) { st.OK = 2 }),
		},
		{
			name: "the continue token expired: the list starts over",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("100", "c1", threeNodes[:2]...))
				h.api.expectList(h.t, "c1").status(http.StatusGone, "Expired", "The provided continue parameter is too old")
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("120", "c2", threeNodes[0]))
				h.api.expectList(h.t, "c2").reply(http.StatusOK, listJSON("120", "", threeNodes[2]))
			},
			rv:    "120",
			want:  []string{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5"},
			stats: synced(func(st *PeerStats) { st.OK, st.Gone, st.Peers, st.Encrypting = 3, 1, 2, 1 }),
		},
		{
			name:   "empty",
			answer: func(h *peerScript) { h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("7", "")) },
			rv:     "7",
			want:   []string{},
			stats:  synced(func(st *PeerStats) { st.Peers, st.Encrypting = 0, 0 }),
		},
		{
			name: "items null",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, `{"kind":"CiliumNodeList","apiVersion":"cilium.io/v2","metadata":{"resourceVersion":"7"},"items":null}`)
			},
			rv:    "7",
			want:  []string{},
			stats: synced(func(st *PeerStats) { st.Peers, st.Encrypting = 0, 0 }),
		},
		{
			name: "metadata after the items, unknown fields",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, `{"extra":[1,{"a":2}],"items":[`+threeNodes[0]+`],"kind":"CiliumNodeList","apiVersion":"cilium.io/v2","metadata":{"resourceVersion":"8"}}`)
			},
			rv:    "8",
			want:  []string{"worker-1 on 10.0.0.5"},
			stats: synced(func(st *PeerStats) { st.Peers, st.Encrypting = 1, 1 }),
		},
		{
			name: "an invalid address is left out and logged",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("100", "", peerNode("worker-9", "1", true, "10.0.0.9", "10.0.0.300")))
			},
			rv:    "100",
			want:  []string{"worker-9 on 10.0.0.9"},
			stats: synced(func(st *PeerStats) { st.Peers, st.Encrypting = 1, 1 }),
			log:   []string{`ciliumnode: CiliumNode worker-9: InternalIP "10.0.0.300" (not an IP address) is not a peer's address; left out`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startPeers(t, setup{})
			tc.answer(h)
			h.api.expectWatchAll(t, tc.rv)
			h.wantReported(tc.want)
			h.wantStats(tc.stats)
			if tc.log != nil {
				h.wantLog("WARN", tc.log...)
			}
		})
	}
}

// TestPeersListFails: no answer but a complete, well-formed list is a good list; before
// it nothing is reported, and the list is retried from its first page.
func TestPeersListFails(t *testing.T) {
	good := threeNodes[0]
	tests := []struct {
		name   string
		cfg    func(*Config)
		answer func(h *peerScript)
		stats  PeerStats
		level  string
		log    []string
	}{
		{
			name: "500",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").status(http.StatusInternalServerError, "InternalError", "etcdserver: request timed out")
			},
			stats: PeerStats{HTTPError: 1},
			level: "WARN",
			log:   []string{"ciliumnode: list CiliumNodes (page 1): 500 Internal Server Error: etcdserver: request timed out"},
		},
		{
			name: "403 names the missing permission",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").status(http.StatusForbidden, "Forbidden", strings.Replace(forbidden, "cannot get", "cannot list", 1))
			},
			stats: PeerStats{HTTPError: 1},
			level: "WARN",
			log:   []string{"403 Forbidden", "cannot list resource"},
		},
		{
			name: "404: the CRD is missing",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").status(http.StatusNotFound, "NotFound", "the server could not find the requested resource")
			},
			stats: PeerStats{NotFound: 1},
			level: "WARN",
			log:   []string{"404 Not Found: the server could not find the requested resource"},
		},
		{
			name: "the second page fails: the first is not kept",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("100", "c1", good))
				h.api.expectList(h.t, "c1").status(http.StatusServiceUnavailable, "ServiceUnavailable", "the server is shutting down")
			},
			stats: PeerStats{OK: 1, HTTPError: 1},
			level: "WARN",
			log:   []string{"list CiliumNodes (page 2): 503 Service Unavailable"},
		},
		{
			name: "continue token expires again and again",
			answer: func(h *peerScript) {
				for range maxListRestarts + 1 {
					h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("100", "c1", good))
					h.api.expectList(h.t, "c1").status(http.StatusGone, "Expired", "too old")
				}
			},
			stats: PeerStats{OK: maxListRestarts + 1, Gone: maxListRestarts + 1},
			level: "WARN",
			log:   []string{"list CiliumNodes (page 8): expired: 410 Gone: too old"},
		},
		{
			name:   "garbage",
			answer: func(h *peerScript) { h.api.expectList(h.t, "").reply(http.StatusOK, "this is not JSON") },
			stats:  PeerStats{DecodeError: 1},
			level:  "WARN",
			log:    []string{"list CiliumNodes (page 1): decode CiliumNodeList: invalid character"},
		},
		{
			name:   "truncated",
			answer: func(h *peerScript) { h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("1", "", good)[:300]) },
			stats:  PeerStats{NetworkError: 1},
			level:  "WARN",
			log:    []string{"list CiliumNodes (page 1): read body: ", "unexpected EOF"},
		},
		{
			name:   "data after the list",
			answer: func(h *peerScript) { h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("1", "", good)+"{}") },
			stats:  PeerStats{DecodeError: 1},
			level:  "WARN",
			log:    []string{"data after the list"},
		},
		{
			name: "wrong list kind",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, strings.Replace(listJSON("1", "", good), "CiliumNodeList", "NodeList", 1))
			},
			stats: PeerStats{DecodeError: 1},
			level: "WARN",
			log:   []string{`got "cilium.io/v2" "NodeList", want cilium.io/v2 CiliumNodeList`},
		},
		{
			name:   "no resourceVersion",
			answer: func(h *peerScript) { h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("", "", good)) },
			stats:  PeerStats{DecodeError: 1},
			level:  "WARN",
			log:    []string{"CiliumNodeList without metadata.resourceVersion"},
		},
		{
			name: "an item of the wrong kind",
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("1", "", good, node("1", named("x"), typed("v1", "Node"))))
			},
			stats: PeerStats{DecodeError: 1},
			level: "WARN",
			log:   []string{`CiliumNode item 1 ("x"): got "v1" "Node", want cilium.io/v2 CiliumNode`},
		},
		{
			name: "an endless item: reading stops",
			// 20 MiB to read under the race detector on a loaded machine: more time.
			cfg: func(c *Config) { c.RequestTimeout = time.Minute },
			answer: func(h *peerScript) {
				h.api.expectList(h.t, "").replySlowly(http.StatusOK, `{"items":[{"metadata":{"name":"`+strings.Repeat("x", maxReadAhead+maxBody))
			},
			stats: PeerStats{DecodeError: 1},
			level: "WARN",
			log:   []string{"decode CiliumNode item 0: an object larger than 4194304 bytes"},
		},
		{
			name:   "connection drop",
			answer: func(h *peerScript) { h.api.expectList(h.t, "").drop() },
			stats:  PeerStats{NetworkError: 1},
			level:  "WARN",
			log:    []string{"ciliumnode: list CiliumNodes (page 1): "},
		},
		{
			name:   "no answer within RequestTimeout",
			cfg:    func(c *Config) { c.RequestTimeout = 50 * time.Millisecond },
			answer: func(h *peerScript) { h.api.expectList(h.t, "") },
			stats:  PeerStats{NetworkError: 1},
			level:  "WARN",
			log:    []string{"context deadline exceeded"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startPeers(t, setup{cfg: tc.cfg})
			tc.answer(h)
			retry := h.api.expectList(t, "")
			h.wantReported() // nothing before a good list
			if tc.cfg != nil {
				h.wantStatsTimed(tc.stats)
			} else {
				h.wantStats(tc.stats)
			}
			h.wantLog(tc.level, tc.log...)
			retry.reply(http.StatusOK, listJSON("100", "", threeNodes...))
			h.api.expectWatchAll(t, "100")
			h.wantReported(threeSummary)
		})
	}
}

func TestPeersWatchEvents(t *testing.T) {
	tests := []struct {
		name   string
		events [][2]string // type, object
		want   [][]string  // reported, after the list's threeSummary
		rv     string      // the resourceVersion the next watch resumes from
		log    []string    // a WARN record
	}{
		{
			name:   "bookmark moves the resourceVersion only",
			events: [][2]string{{"BOOKMARK", bookmark("105")}},
			rv:     "105",
		},
		{
			name:   "a peer joins",
			events: [][2]string{{"ADDED", peerNode("worker-3", "110", true, "10.0.0.7")}},
			want:   [][]string{{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6,fd00::6", "worker-3 on 10.0.0.7"}},
			rv:     "110",
		},
		{
			name:   "a peer opts out",
			events: [][2]string{{"MODIFIED", peerNode("worker-2", "111", false, "10.0.0.6", "fd00::6")}},
			want:   [][]string{{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 off 10.0.0.6,fd00::6"}},
			rv:     "111",
		},
		{
			name:   "a peer changes address",
			events: [][2]string{{"MODIFIED", peerNode("worker-2", "112", true, "10.0.0.16")}},
			want:   [][]string{{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.16"}},
			rv:     "112",
		},
		{
			name:   "a peer leaves",
			events: [][2]string{{"DELETED", peerNode("worker-2", "113", true, "10.0.0.6", "fd00::6")}},
			want:   [][]string{{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5"}},
			rv:     "113",
		},
		{
			name: "status updates change nothing kept: no report",
			events: [][2]string{
				{"MODIFIED", peerNode("worker-2", "114", true, "fd00::6", "10.0.0.6")},
				{"MODIFIED", peerNode("cp-1", "115", false, "10.0.0.2")},
			},
			rv: "115",
		},
		{
			name:   "an unknown node is deleted: no report",
			events: [][2]string{{"DELETED", peerNode("ghost", "116", true, "10.0.0.99")}},
			rv:     "116",
		},
		{
			name: "ADDED for a known node is an update",
			events: [][2]string{
				{"ADDED", peerNode("cp-1", "117", true, "10.0.0.2")},
			},
			want: [][]string{{"cp-1 on 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6,fd00::6"}},
			rv:   "117",
		},
		{
			name: "one report a change",
			events: [][2]string{
				{"ADDED", peerNode("worker-3", "120", false, "10.0.0.7")},
				{"BOOKMARK", bookmark("121")},
				{"MODIFIED", peerNode("worker-3", "122", true, "10.0.0.7")},
				{"DELETED", peerNode("worker-1", "123", true, "10.0.0.5")},
			},
			want: [][]string{
				{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6,fd00::6", "worker-3 off 10.0.0.7"},
				{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6,fd00::6", "worker-3 on 10.0.0.7"},
				{"cp-1 off 10.0.0.2", "worker-2 on 10.0.0.6,fd00::6", "worker-3 on 10.0.0.7"},
			},
			rv: "123",
		},
		{
			name:   "an invalid address is left out and logged",
			events: [][2]string{{"MODIFIED", peerNode("worker-2", "124", true, "10.0.0.6", "bogus")}},
			want:   [][]string{{"cp-1 off 10.0.0.2", "worker-1 on 10.0.0.5", "worker-2 on 10.0.0.6"}},
			rv:     "124",
			log:    []string{`CiliumNode worker-2: InternalIP "bogus" (not an IP address) is not a peer's address; left out`},
		},
		{
			name:   "bookmark without kind",
			events: [][2]string{{"BOOKMARK", `{"metadata":{"resourceVersion":"130"}}`}},
			rv:     "130",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := startPeers(t, setup{})
			x := h.goodStart()
			x.start()
			applied := uint64(0)
			for _, ev := range tc.events {
				x.event(ev[0], ev[1])
				if ev[0] != "BOOKMARK" {
					applied++
				}
			}
			x.end() // the server ends the watch: resume at once from the last resourceVersion
			h.api.expectWatchAll(t, tc.rv)
			h.wantReported(append([][]string{threeSummary}, tc.want...)...)
			last := threeSummary
			if len(tc.want) > 0 {
				last = tc.want[len(tc.want)-1]
			}
			enc := 0
			for _, l := range last {
				if strings.Contains(l, " on") {
					enc++
				}
			}
			h.wantStats(synced(func(st *PeerStats) {
				st.WatchRestart, st.Events, st.Reports = 1, applied, 1+uint64(len(tc.want))
				st.Peers, st.Encrypting = len(last), enc
			}))
			if tc.log != nil {
				h.wantLog("WARN", tc.log...)
			}
		})
	}
}

// TestPeersWatchEnd covers every way a watch ends, over HTTP/2 and HTTP/1.1.
func TestPeersWatchEnd(t *testing.T) {
	type next struct {
		list bool   // every node is listed again
		rv   string // else the watch resumes from rv
	}
	tests := []struct {
		name   string
		cfg    func(*Config)
		script func(x *exchange)
		next   next
		stats  func(*PeerStats) // on top of synced
		level  string
		log    []string
	}{
		{
			name:   "server ends it without events",
			script: func(x *exchange) { x.start(); x.end() },
			next:   next{rv: "100"},
			stats:  func(st *PeerStats) { st.WatchRestart = 1 },
		},
		{
			name: "ERROR 410 Gone",
			script: func(x *exchange) {
				x.start()
				x.event("BOOKMARK", bookmark("150"))
				x.event("ERROR", statusJSON(http.StatusGone, "Expired", "too old resource version: 150 (9000)"))
			},
			next:  next{list: true},
			stats: func(st *PeerStats) { st.Gone = 1 },
			level: "INFO",
			log:   []string{"watch CiliumNodes from resourceVersion 100: ERROR event: 410 Expired: too old resource version: 150 (9000); listing again"},
		},
		{
			name:   "410 answer",
			script: func(x *exchange) { x.status(http.StatusGone, "Gone", "too old resource version: 100 (9000)") },
			next:   next{list: true},
			stats:  func(st *PeerStats) { st.Gone = 1 },
			level:  "INFO",
			log:    []string{"410 Gone: too old resource version"},
		},
		{
			name: "connection drop mid-event",
			script: func(x *exchange) {
				x.start()
				x.send(peerNode("worker-3", "101", true)[:80])
				x.drop()
			},
			next:  next{rv: "100"},
			stats: func(st *PeerStats) { st.NetworkError = 1 },
			level: "WARN",
			log:   []string{"watch CiliumNodes from resourceVersion 100"},
		},
		{
			name:   "garbage: resumed, not listed",
			script: func(x *exchange) { x.start(); x.send("<html>oops</html>\n") },
			next:   next{rv: "100"},
			stats:  func(st *PeerStats) { st.DecodeError = 1 },
			level:  "WARN",
			log:    []string{"decode event: invalid character '<'"},
		},
		{
			name: "an object of the wrong kind: listed again",
			script: func(x *exchange) {
				x.start()
				x.event("ADDED", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"worker-1","resourceVersion":"101"}}`)
			},
			next:  next{list: true},
			stats: func(st *PeerStats) { st.DecodeError = 1 },
			level: "WARN",
			log:   []string{`ADDED event: got "v1" "Pod", want cilium.io/v2 CiliumNode`},
		},
		{
			name:   "an object without a resourceVersion: listed again",
			script: func(x *exchange) { x.start(); x.event("MODIFIED", node("", named("worker-2"), noResourceVersion)) },
			next:   next{list: true},
			stats:  func(st *PeerStats) { st.DecodeError = 1 },
			level:  "WARN",
			log:    []string{"MODIFIED event: CiliumNode without metadata.resourceVersion"},
		},
		{
			name:   "unknown event type",
			script: func(x *exchange) { x.start(); x.event("SYNC", node("101")) },
			next:   next{rv: "100"},
			stats:  func(st *PeerStats) { st.DecodeError = 1 },
			level:  "WARN",
			log:    []string{`unknown event type "SYNC"`},
		},
		{
			name:   "ERROR without a Status",
			script: func(x *exchange) { x.start(); x.event("ERROR", `"boom"`) },
			next:   next{rv: "100"},
			stats:  func(st *PeerStats) { st.DecodeError = 1 },
			level:  "WARN",
			log:    []string{"watch CiliumNodes from resourceVersion 100: ERROR event without a Status"},
		},
		{
			name: "ERROR 500",
			script: func(x *exchange) {
				x.start()
				x.event("ERROR", statusJSON(http.StatusInternalServerError, "InternalError", "etcdserver: leader changed"))
			},
			next:  next{rv: "100"},
			stats: func(st *PeerStats) { st.HTTPError = 1 },
			level: "WARN",
			log:   []string{"ERROR event: 500 InternalError: etcdserver: leader changed"},
		},
		{
			name: "answer 500",
			script: func(x *exchange) {
				x.status(http.StatusInternalServerError, "InternalError", "etcdserver: request timed out")
			},
			next:  next{rv: "100"},
			stats: func(st *PeerStats) { st.HTTPError = 1 },
			level: "WARN",
			log:   []string{"500 Internal Server Error: etcdserver: request timed out"},
		},
		{
			name: "answer 403: no watch permission",
			script: func(x *exchange) {
				x.status(http.StatusForbidden, "Forbidden", strings.Replace(forbidden, "cannot get", "cannot watch", 1))
			},
			next:  next{rv: "100"},
			stats: func(st *PeerStats) { st.HTTPError = 1 },
			level: "WARN",
			log:   []string{"403 Forbidden", "cannot watch resource"},
		},
		{
			name:   "silent after the header",
			cfg:    func(c *Config) { c.WatchTimeout = 50 * time.Millisecond },
			script: func(x *exchange) { x.start(); x.waitDone() },
			next:   next{rv: "100"},
			stats:  func(st *PeerStats) { st.WatchRestart = 1 },
			level:  "WARN",
			log:    []string{"ciliumnode: watch CiliumNodes: no complete event for 50ms; restarting it"},
		},
		{
			name:   "silent after a bookmark",
			cfg:    func(c *Config) { c.WatchTimeout = 50 * time.Millisecond },
			script: func(x *exchange) { x.start(); x.event("BOOKMARK", bookmark("140")); x.waitDone() },
			next:   next{rv: "140"},
			stats:  func(st *PeerStats) { st.WatchRestart = 1 },
			level:  "WARN",
			log:    []string{"no complete event for 50ms"},
		},
		{
			name:   "no header at all",
			cfg:    func(c *Config) { c.WatchTimeout = 50 * time.Millisecond },
			script: func(x *exchange) { x.waitDone() },
			next:   next{rv: "100"},
			stats:  func(st *PeerStats) { st.WatchRestart = 1 },
			level:  "WARN",
			log:    []string{"no complete event for 50ms"},
		},
	}
	for _, proto := range []string{"h2", "http1.1"} {
		t.Run(proto, func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					h := startPeers(t, setup{http1: proto == "http1.1", cfg: tc.cfg})
					tc.script(h.goodStart())
					if tc.next.list {
						h.api.expectList(t, "")
					} else {
						h.api.expectWatchAll(t, tc.next.rv)
					}
					h.wantReported(threeSummary)
					if tc.cfg != nil {
						h.wantStatsTimed(synced(tc.stats))
					} else {
						h.wantStats(synced(tc.stats))
					}
					if tc.log != nil {
						h.wantLog(tc.level, tc.log...)
					}
				})
			}
		})
	}
}

// TestPeersLastSetStands: after a good list no failure changes the snapshot, and a relist
// that finds the same nodes reports nothing; one that finds others reports them.
func TestPeersLastSetStands(t *testing.T) {
	h := startPeers(t, setup{})
	x := h.goodStart()
	x.start()
	x.event("ERROR", statusJSON(http.StatusGone, "Expired", "too old resource version"))
	h.api.expectList(t, "").status(http.StatusServiceUnavailable, "ServiceUnavailable", "the server is shutting down")
	h.api.expectList(t, "").reply(http.StatusOK, "{garbage")
	h.api.expectList(t, "").drop()
	h.api.expectList(t, "").status(http.StatusForbidden, "Forbidden", forbidden)
	h.api.expectList(t, "").reply(http.StatusOK, listJSON("200", "", threeNodes...)) // the same nodes
	x = h.api.expectWatchAll(t, "200")
	h.wantReported(threeSummary)
	x.start()
	x.event("MODIFIED", node("201", named("worker-2"), typed("v1", "Pod")))
	h.api.expectList(t, "").reply(http.StatusOK, listJSON("300", "", threeNodes[1:]...)) // worker-1 went
	x = h.api.expectWatchAll(t, "300")
	h.wantReported([]string{"cp-1 off 10.0.0.2", "worker-2 on 10.0.0.6,fd00::6"})
	x.start()
	x.drop()
	h.api.expectWatchAll(t, "300").status(http.StatusInternalServerError, "InternalError", "boom")
	h.api.expectWatchAll(t, "300")
	h.wantReported()
	h.wantStats(PeerStats{OK: 3, Gone: 1, HTTPError: 3, DecodeError: 2, NetworkError: 2, Lists: 3, Reports: 2, Synced: true, Peers: 2, Encrypting: 1})
}

// TestPeersBackoff: failures back off; a success resets; a watch that keeps failing right
// after a good list is not retried hot (the lists in between do not reset the back-off).
func TestPeersBackoff(t *testing.T) {
	gone := statusJSON(http.StatusGone, "Expired", "too old resource version")
	tests := []struct {
		name   string
		script func(h *peerScript)
		want   []string
	}{
		{
			name: "list failures, then success",
			script: func(h *peerScript) {
				h.api.expectList(h.t, "").status(http.StatusInternalServerError, "InternalError", "boom")
				h.api.expectList(h.t, "").status(http.StatusNotFound, "NotFound", "not found")
				h.goodStart()
			},
			want: []string{"reset", "next", "next", "reset"},
		},
		{
			name: "watch refused again and again",
			script: func(h *peerScript) {
				h.goodStart().status(http.StatusForbidden, "Forbidden", forbidden)
				h.api.expectWatchAll(h.t, "100").status(http.StatusForbidden, "Forbidden", forbidden)
				h.api.expectWatchAll(h.t, "100")
			},
			want: []string{"reset", "reset", "next", "next"},
		},
		{
			name: "410 right after every list, until an event arrives",
			script: func(h *peerScript) {
				x := h.goodStart()
				x.start()
				x.event("ERROR", gone)
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("200", "", threeNodes...))
				x = h.api.expectWatchAll(h.t, "200")
				x.start()
				x.event("ERROR", gone)
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("300", "", threeNodes...))
				x = h.api.expectWatchAll(h.t, "300")
				x.start()
				x.event("BOOKMARK", bookmark("301"))
				x.end()
				h.api.expectWatchAll(h.t, "301")
			},
			want: []string{"reset", "reset", "next", "next", "reset"},
		},
		{
			name: "a corrupt object after every list backs off",
			script: func(h *peerScript) {
				x := h.goodStart()
				x.start()
				x.event("MODIFIED", node("101", named("worker-2"), typed("v1", "Pod")))
				h.api.expectList(h.t, "").reply(http.StatusOK, listJSON("200", "", threeNodes...))
				x = h.api.expectWatchAll(h.t, "200")
				x.start()
				x.event("MODIFIED", node("201", named("worker-2"), typed("v1", "Pod")))
				h.api.expectList(h.t, "")
			},
			want: []string{"reset", "reset", "next", "next"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &recordingBackOff{}
			h := startPeers(t, setup{cfg: func(c *Config) { c.Backoff = b }})
			tc.script(h)
			if diff := cmp.Diff(tc.want, b.get()); diff != "" {
				t.Errorf("back-off calls (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPeersTokenRotation: the token file is read before every request.
func TestPeersTokenRotation(t *testing.T) {
	h := startPeers(t, setup{})
	x := h.goodStart()
	if got := x.token(); got != "Bearer token-1" {
		t.Fatalf("Authorization %q, want Bearer token-1", got)
	}
	h.api.setToken("token-2")
	x.start()
	x.end()
	select {
	case <-h.api.denied:
	case <-time.After(waitFor):
		t.Fatal("the old token was never refused")
	}
	h.token.writeToken("token-2")
	x = h.api.expectWatchAll(t, "100")
	if got := x.token(); got != "Bearer token-2" {
		t.Errorf("Authorization %q, want Bearer token-2", got)
	}
	if st := h.src.Stats(); st.HTTPError == 0 {
		t.Errorf("Stats.HTTPError = 0 after 401 answers")
	}
	h.wantLog("WARN", "watch CiliumNodes from resourceVersion 100: 401 Unauthorized")
}

func TestPeersRunMisuse(t *testing.T) {
	h := startPeers(t, setup{})
	h.goodStart()
	if err := h.src.Run(context.Background(), func(Peers) {}); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second Run: %v, want already running", err)
	}
	if err := h.src.Run(context.Background(), nil); err == nil {
		t.Errorf("Run with nil report: nil error")
	}
}

func TestNewPeers(t *testing.T) {
	s, err := NewPeers(Config{Server: "https://10.96.0.1:443/", HTTPClient: &http.Client{}})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{s.listURL, s.lw.watchURL + "100", s.cfg.TokenFile, s.cfg.WatchTimeout.String(), s.cfg.RequestTimeout.String()}
	want := []string{
		"https://10.96.0.1:443/apis/cilium.io/v2/ciliumnodes?limit=500",
		"https://10.96.0.1:443/apis/cilium.io/v2/ciliumnodes?watch=1&allowWatchBookmarks=true&resourceVersion=100",
		"/var/run/secrets/kubernetes.io/serviceaccount/token", "2m0s", "30s",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("NewPeers defaults (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"no server", Config{}, "no API server URL"},
		{"http server", Config{Server: "http://10.96.0.1"}, "want https://host:port"},
		{"negative watch timeout", Config{Server: "https://10.96.0.1", WatchTimeout: -1}, "negative WatchTimeout"},
		{"CA file missing", Config{Server: "https://10.96.0.1", CAFile: filepath.Join(t.TempDir(), "absent")}, "read CA"},
		{"node name is not needed", Config{Server: "https://10.96.0.1", NodeName: "Not_A-Name", HTTPClient: &http.Client{}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPeers(tc.cfg)
			if tc.wantErr == "" {
				if err != nil {
					t.Errorf("NewPeers: %v", err)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), "ciliumnode: ") || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("NewPeers: %v, want ciliumnode: …%s…", err, tc.wantErr)
			}
		})
	}
}

func TestPeerStatsRequests(t *testing.T) {
	st := PeerStats{OK: 1, NotFound: 2, HTTPError: 3, DecodeError: 4, NetworkError: 5, WatchRestart: 6, Gone: 7, Lists: 8}
	// The same labels as the single-node Source's, for one metric.
	if diff := cmp.Diff(Stats{OK: 1, NotFound: 2, HTTPError: 3, DecodeError: 4, NetworkError: 5, WatchRestart: 6, Gone: 7}.Requests(), st.Requests()); diff != "" {
		t.Errorf("Requests (-want +got):\n%s", diff)
	}
}
