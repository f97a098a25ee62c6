package kubeauth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

const agentToken = "agent-token"

// fakeAPI is an apitest server that answers TokenReviews (alice-token is alice,
// bob-token bob) and SubjectAccessReviews (alice may get /metrics) and keeps the
// SubjectAccessReviews' specs. down makes it answer 500, and gate (when not nil) holds
// every answer until it is closed.
type fakeAPI struct {
	srv *apitest.Server

	down     atomic.Bool
	inflight atomic.Int64
	maxIn    atomic.Int64
	gate     chan struct{}

	mu   sync.Mutex
	sars []sarSpec
}

func newFakeAPI(t testing.TB) *fakeAPI {
	t.Helper()
	f := &fakeAPI{}
	f.srv = apitest.New(t, apitest.Options{
		Token:   agentToken,
		Users:   map[string]string{"alice-token": "alice", "bob-token": "bob"},
		Allowed: map[string][]string{"alice": {"/metrics"}},
		Extra:   map[string][]string{"k": {"v"}},
	})
	f.srv.Intercept(apitest.KindTokenReview, f.intercept)
	f.srv.Intercept(apitest.KindAccessReview, f.intercept)
	return f
}

// intercept counts the reviews under way, holds them at the gate, answers 500 while the
// server is down and keeps the spec of each SubjectAccessReview.
func (f *fakeAPI) intercept(w http.ResponseWriter, r *http.Request, next http.Handler) {
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for {
		m := f.maxIn.Load()
		if n <= m || f.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	if f.gate != nil {
		<-f.gate
	}
	if f.down.Load() {
		http.Error(w, `{"kind":"Status","message":"etcdserver: request timed out","code":500}`, 500)
		return
	}
	if r.URL.Path == subjectAccessReviewsPath {
		body, _ := io.ReadAll(r.Body)
		var sar subjectAccessReview
		if err := json.Unmarshal(body, &sar); err == nil {
			f.mu.Lock()
			f.sars = append(f.sars, sar.Spec)
			f.mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	next.ServeHTTP(w, r)
}

// calls is the number of requests the API server received, refused ones included.
func (f *fakeAPI) calls() int64 {
	var n int
	for _, c := range f.srv.Counts() {
		n += c
	}
	return int64(n)
}

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newAuthorizer returns an Authorizer of f on a fake clock; edit changes its config.
func newAuthorizer(t testing.TB, f *fakeAPI, edit func(*Config)) (*Authorizer, *clock) {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(agentToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	cfg := Config{
		API: &kubeapi.Client{Server: f.srv.URL(), TokenFile: tok, HTTP: kubeapi.NoRedirects(f.srv.Client())},
		Now: clk.Now,
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a, clk
}

// scrape sends GET /metrics with the Authorization header auth (none when empty)
// through a's Handler and returns the status code.
func scrape(a *Authorizer, auth string) int {
	h := a.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metrics\n") }))
	r := httptest.NewRequest("GET", "/metrics", nil)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

func TestDecisions(t *testing.T) {
	f := newFakeAPI(t)
	a, _ := newAuthorizer(t, f, nil)
	for _, tc := range []struct {
		name     string
		auth     string
		want     int
		apiCalls int64
	}{
		{"allowed", "Bearer alice-token", 200, 2},
		{"scheme case-insensitive", "bearer  alice-token", 200, 0}, // cached
		{"authenticated, not allowed", "Bearer bob-token", 403, 2},
		{"unknown token", "Bearer garbage", 401, 1},
		{"no header", "", 401, 0},
		{"basic auth", "Basic YWxpY2U6cHc=", 401, 0},
		{"not a b64token", "Bearer alice token", 401, 0},
		{"control characters", "Bearer a\x01b", 401, 0},
		{"only padding", "Bearer ==", 401, 0},
		{"too long", "Bearer " + strings.Repeat("a", MaxTokenBytes+1), 401, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.calls()
			if got := scrape(a, tc.auth); got != tc.want {
				t.Errorf("status %d, want %d", got, tc.want)
			}
			if got := f.calls() - before; got != tc.apiCalls {
				t.Errorf("%d API calls, want %d", got, tc.apiCalls)
			}
		})
	}
	// The SubjectAccessReview carries the TokenReview's user, uid, groups and extra.
	want := []sarSpec{
		{NonResourceAttributes: nonResourceAttributes{"/metrics", "get"}, User: "alice", UID: "alice-uid",
			Groups: []string{"system:authenticated"}, Extra: map[string][]string{"k": {"v"}}},
		{NonResourceAttributes: nonResourceAttributes{"/metrics", "get"}, User: "bob", UID: "bob-uid",
			Groups: []string{"system:authenticated"}, Extra: map[string][]string{"k": {"v"}}},
	}
	if diff := cmp.Diff(want, f.sars); diff != "" {
		t.Errorf("SubjectAccessReviews (-want +got):\n%s", diff)
	}
	st := a.Stats()
	wantStats := Stats{APIRequests: 5, Results: map[Decision]uint64{Allowed: 2, Denied: 1, Unauthenticated: 7, Unavailable: 0, Throttled: 0}}
	if diff := cmp.Diff(wantStats, st); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

// With the API server down and nothing cached, a scrape gets 503 and nothing is
// cached; once it answers, the same token is reviewed again.
func TestAPIDown(t *testing.T) {
	f := newFakeAPI(t)
	a, _ := newAuthorizer(t, f, nil)
	f.down.Store(true)
	if got := scrape(a, "Bearer alice-token"); got != 503 {
		t.Errorf("API down: status %d, want 503", got)
	}
	if _, err := a.Check(context.Background(), "alice-token"); err == nil || !strings.Contains(err.Error(), "kubeauth: TokenReview: 500") {
		t.Errorf("Check with the API down: %v, want the TokenReview's 500", err)
	}
	if n := a.Len(); n != 0 {
		t.Errorf("%d cached decisions after failures, want 0", n)
	}
	f.down.Store(false)
	if got := scrape(a, "Bearer alice-token"); got != 200 {
		t.Errorf("API back: status %d, want 200", got)
	}
}

// A cached decision answers without the API, down or not, until it expires.
func TestCacheHitAndExpiry(t *testing.T) {
	f := newFakeAPI(t)
	a, clk := newAuthorizer(t, f, nil)
	for _, tok := range []string{"alice-token", "bob-token", "garbage"} {
		scrape(a, "Bearer "+tok)
	}
	calls := f.calls()
	f.down.Store(true)
	check := func(when string, want map[string]int) {
		t.Helper()
		for tok, code := range want {
			if got := scrape(a, "Bearer "+tok); got != code {
				t.Errorf("%s: %s: status %d, want %d", when, tok, got, code)
			}
		}
	}
	check("cached, API down", map[string]int{"alice-token": 200, "bob-token": 403, "garbage": 401})
	if got := f.calls(); got != calls {
		t.Errorf("cache hits made %d API calls", got-calls)
	}
	clk.Add(DefaultDenyTTL)
	check("denials expired, API down", map[string]int{"alice-token": 200, "bob-token": 503, "garbage": 503})
	clk.Add(DefaultAllowTTL - DefaultDenyTTL - time.Nanosecond)
	check("allow about to expire, API down", map[string]int{"alice-token": 200})
	clk.Add(time.Nanosecond)
	check("allow expired, API down", map[string]int{"alice-token": 503})
	f.down.Store(false)
	check("API back", map[string]int{"alice-token": 200, "bob-token": 403, "garbage": 401})
}

// The cache holds at most MaxEntries, dropping the least recently used.
func TestCacheBound(t *testing.T) {
	f := newFakeAPI(t)
	a, _ := newAuthorizer(t, f, func(c *Config) { c.MaxEntries = 4; c.ReviewBurst = 100; c.ReviewsPerSecond = 100 })
	scrape(a, "Bearer alice-token")
	for i := range 10 {
		scrape(a, fmt.Sprintf("Bearer garbage-%d", i))
		scrape(a, "Bearer alice-token") // kept recently used
		if n := a.Len(); n > 4 {
			t.Fatalf("%d cached decisions, want at most 4", n)
		}
	}
	before := f.calls()
	if got := scrape(a, "Bearer alice-token"); got != 200 || f.calls() != before {
		t.Errorf("recently used token: status %d, %d API calls; want 200 from the cache", got, f.calls()-before)
	}
	if got := scrape(a, "Bearer garbage-0"); got != 401 || f.calls() != before+1 {
		t.Errorf("evicted token: status %d, %d API calls; want 401 after a new review", got, f.calls()-before)
	}
}

// A flood of distinct tokens costs at most the rate limit's API calls and a bounded
// cache; a token already cached is still answered from it.
func TestGarbageFlood(t *testing.T) {
	f := newFakeAPI(t)
	a, clk := newAuthorizer(t, f, nil)
	scrape(a, "Bearer alice-token")
	base := f.calls()
	codes := map[int]int{}
	for i := range 10_000 {
		codes[scrape(a, fmt.Sprintf("Bearer flood-%d", i))]++
		if i%1000 == 0 {
			clk.Add(time.Second) // ten seconds of flood in all
		}
		if i%997 == 0 && scrape(a, "Bearer alice-token") != 200 {
			t.Fatalf("the cached token was refused during the flood")
		}
	}
	for range 1000 {
		codes[scrape(a, "Bearer \x00\xff garbage")]++ // refused before any review
	}
	// burst + 10 s at DefaultReviewsPerSecond, one TokenReview each.
	wantCalls := int64(DefaultReviewBurst + 10*DefaultReviewsPerSecond)
	if got := f.calls() - base; got > wantCalls {
		t.Errorf("the flood made %d API calls, want at most %d", got, wantCalls)
	}
	if n := a.Len(); n > DefaultMaxEntries {
		t.Errorf("%d cached decisions, want at most %d", n, DefaultMaxEntries)
	}
	if codes[401] == 0 || codes[429] == 0 || codes[401]+codes[429] != 11_000 {
		t.Errorf("status codes %v: want only 401 and 429", codes)
	}
	t.Logf("10,000 distinct tokens: %d API calls, %d cached, statuses %v", f.calls()-base, a.Len(), codes)

	// Once alice's allow expires, her next scrape is reviewed even with the
	// budget spent by the flood; a new token is not.
	clk.Add(DefaultAllowTTL)
	for i := 0; scrape(a, fmt.Sprintf("Bearer drain-%d", i)) != 429; i++ {
	}
	before := f.calls()
	if got := scrape(a, "Bearer alice-token"); got != 200 || f.calls() != before+2 {
		t.Errorf("expired allow during a flood: status %d, %d API calls; want 200 after a review", got, f.calls()-before)
	}
	if got := scrape(a, "Bearer bob-token"); got != 429 {
		t.Errorf("a token never reviewed during a flood: status %d, want 429", got)
	}

	// A renewal that fails is not tried again outside the budget.
	clk.Add(DefaultAllowTTL)
	for i := 0; scrape(a, fmt.Sprintf("Bearer drain-again-%d", i)) != 429; i++ {
	}
	f.down.Store(true)
	before = f.calls()
	first, second := scrape(a, "Bearer alice-token"), scrape(a, "Bearer alice-token")
	if first != 503 || second != 429 || f.calls() != before+1 {
		t.Errorf("expired allow, API down: statuses %d, %d, %d API calls; want 503 (one review), then 429", first, second, f.calls()-before)
	}
}

// Concurrent requests with one token make one review; reviews of distinct tokens
// run at most MaxInflight at a time.
func TestSingleflightAndInflight(t *testing.T) {
	f := newFakeAPI(t)
	f.gate = make(chan struct{})
	a, _ := newAuthorizer(t, f, func(c *Config) { c.ReviewBurst = 100 })
	var wg sync.WaitGroup
	codes := make(chan int, 60)
	for range 50 {
		wg.Go(func() { codes <- scrape(a, "Bearer alice-token") })
	}
	for i := range 10 {
		wg.Go(func() { codes <- scrape(a, fmt.Sprintf("Bearer other-%d", i)) })
	}
	// Wait until MaxInflight reviews are at the gate, then check no more come.
	deadline := time.Now().Add(2 * time.Minute)
	for f.inflight.Load() < DefaultMaxInflight {
		if time.Now().After(deadline) {
			t.Fatalf("%d reviews under way, want %d", f.inflight.Load(), DefaultMaxInflight)
		}
		runtime.Gosched()
	}
	close(f.gate)
	wg.Wait()
	close(codes)
	n := map[int]int{}
	for c := range codes {
		n[c]++
	}
	if diff := cmp.Diff(map[int]int{200: 50, 401: 10}, n); diff != "" {
		t.Errorf("status codes (-want +got):\n%s", diff)
	}
	if got := f.calls(); got != 2+10 {
		t.Errorf("%d API calls, want 12 (one review of alice, one TokenReview per other token)", got)
	}
	if got := f.maxIn.Load(); got > DefaultMaxInflight {
		t.Errorf("%d reviews at once, want at most %d", got, DefaultMaxInflight)
	}
}

func TestNew(t *testing.T) {
	if _, err := New(Config{}); err == nil || !strings.HasPrefix(err.Error(), "kubeauth: ") {
		t.Errorf("New without an API client: %v, want a kubeauth error", err)
	}
}

func TestDecisionString(t *testing.T) {
	got := map[string]int{}
	for _, d := range Decisions() {
		got[d.String()] = d.StatusCode()
	}
	want := map[string]int{"allowed": 200, "unauthenticated": 401, "denied": 403, "unavailable": 503, "throttled": 429}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if s := Decision(9).String(); s != "unknown(9)" {
		t.Errorf("Decision(9) = %q", s)
	}
}

// BenchmarkScrape compares a scrape answered from the cache with one that asks the
// (local, fake) API server.
func BenchmarkScrape(b *testing.B) {
	f := newFakeAPI(b)
	b.Run("cached", func(b *testing.B) {
		a, _ := newAuthorizer(b, f, nil)
		scrape(a, "Bearer alice-token")
		b.ReportAllocs()
		for b.Loop() {
			if scrape(a, "Bearer alice-token") != 200 {
				b.Fatal("not allowed")
			}
		}
	})
	b.Run("uncached", func(b *testing.B) {
		a, clk := newAuthorizer(b, f, func(c *Config) { c.ReviewBurst = 1 << 30 })
		b.ReportAllocs()
		for b.Loop() {
			clk.Add(DefaultAllowTTL)
			if scrape(a, "Bearer alice-token") != 200 {
				b.Fatal("not allowed")
			}
		}
	})
}

// scrapeFrom is scrape from the client address remote.
func scrapeFrom(a *Authorizer, remote, auth string) int {
	h := a.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "metrics\n") }))
	r := httptest.NewRequest("GET", "/metrics", nil)
	r.RemoteAddr = remote
	r.Header.Set("Authorization", auth)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// 10,000 made-up tokens a second from other clients (one address, then 64
// addresses of one IPv6 /64) while a scraper comes with a token never seen
// (after a rotation, or a Prometheus restart) and asks again every 100 ms:
// it is served within 5 s of the first try (issue 31: 429 for 17-30 s), and
// the flood costs no more API calls than two review budgets.
func TestBadTokenFlood(t *testing.T) {
	for _, tc := range []struct {
		name     string
		attacker func(i int) string
	}{
		{"one address", func(int) string { return "192.0.2.66:40000" }},
		{"one IPv6 /64", func(i int) string { return fmt.Sprintf("[2001:db8:66::%x]:40000", i%64+1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t)
			a, clk := newAuthorizer(t, f, nil)
			start := clk.Now()
			const scraper = "198.51.100.10:51000"
			var served time.Duration = -1
			for ms := 0; ms < 10_000; ms++ { // 10 s of flood, 10 tokens a millisecond
				for j := range 10 {
					i := ms*10 + j
					scrapeFrom(a, tc.attacker(i), fmt.Sprintf("Bearer made-up-%d", i))
				}
				if ms >= 2000 && ms%100 == 0 && served < 0 { // the scraper, from 2 s on
					if code := scrapeFrom(a, scraper, "Bearer alice-token"); code == 200 {
						served = time.Duration(ms-2000) * time.Millisecond
					}
				}
				clk.Add(time.Millisecond)
			}
			calls := f.calls()
			t.Logf("10,000 made-up tokens a second from %s: a new valid token served %v after its first try; %d API calls in %v",
				tc.name, served, calls, clk.Now().Sub(start))
			if served < 0 || served > 5*time.Second {
				t.Errorf("the new valid token: served after %v, want within 5 s (-1: never)", served)
			}
			// Two budgets of DefaultReviewsPerSecond for 10 s, their bursts, and
			// the scraper's TokenReview and SubjectAccessReview.
			if max := int64(2*10*DefaultReviewsPerSecond + DefaultReviewBurst + DefaultReviewsPerSecond + 2); calls > max {
				t.Errorf("%d API calls, want at most %d", calls, max)
			}
		})
	}
}
