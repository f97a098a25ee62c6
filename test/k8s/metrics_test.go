//go:build linux

package k8s

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The secure metrics listener as the DaemonSet runs it (--secure-metrics-addr,
// the agent's ClusterRole from deploy/rbac.yaml as shipped): who may scrape is
// what the real API server's TokenReview and SubjectAccessReview say, and an
// outage of the API server fails scrapes only, once cached decisions expire.

const (
	nodeAddr    = "10.0.0.5" // the node's address on enp7s0 (newNode)
	securePort  = "9185"
	plainAddr   = "127.0.0.1:9184"
	readerRole  = "marksplit-metrics-reader" // in deploy/rbac.yaml
	allowTTL    = time.Minute                // kubeauth.DefaultAllowTTL
	floodTokens = 10_000
)

// startMetricsAgent is startAgent with the DaemonSet's two metrics listeners.
func (c *cluster) startMetricsAgent(t *testing.T, n *node, name string) *agent {
	t.Helper()
	a := c.launch(t, n, name, []string{"run", "--encryption=auto", "--prefix=10.0.0.0/16",
		"--metrics-addr=" + plainAddr, "--secure-metrics-addr=:" + securePort})
	t.Cleanup(func() { a.finish(t) })
	return a
}

// serviceAccount creates the service account name in the deploy namespace
// (deleted when t ends) and returns a path for its tokens.
func (c *cluster) serviceAccount(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	ns := c.sa.Metadata.Namespace
	if _, err := c.admin.must(ctx, http.StatusCreated, "POST", "/api/v1/namespaces/"+ns+"/serviceaccounts", map[string]any{
		"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]string{"name": name},
	}); err != nil {
		t.Fatal(err)
	}
	p := "/api/v1/namespaces/" + ns + "/serviceaccounts/" + name
	t.Cleanup(func() { c.admin.do(context.Background(), "DELETE", p, nil) })
	return p
}

// saToken issues a new token (a TokenRequest) of the service account at path p.
func (c *cluster) saToken(ctx context.Context, p string) (string, error) {
	b, err := c.admin.must(ctx, http.StatusCreated, "POST", p+"/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"expirationSeconds": 3600},
	})
	if err != nil {
		return "", fmt.Errorf("TokenRequest: %w", err)
	}
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	if err := json.Unmarshal(b, &tr); err != nil || tr.Status.Token == "" {
		return "", fmt.Errorf("TokenRequest: no token in %s", b)
	}
	return tr.Status.Token, nil
}

// scraper sends requests to the agent's listeners from inside its node.
type scraper struct {
	hc *http.Client
}

func newScraper(ns string, keepAlive bool) *scraper {
	tr := &http.Transport{
		DialContext:         dialIn(ns),
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, // self-signed, as the PodMonitor
		DisableKeepAlives:   !keepAlive,
		MaxIdleConnsPerHost: 16,
	}
	return &scraper{hc: &http.Client{Timeout: 30 * time.Second, Transport: tr}}
}

// get returns the status and body of GET url with token (none when empty).
func (s *scraper) get(url, token string) (int, string, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b), err
}

const secureURL = "https://" + nodeAddr + ":" + securePort + "/metrics"

// want is nil when GET secureURL with token answers code.
func (s *scraper) want(token string, code int) error {
	got, body, err := s.get(secureURL, token)
	if err != nil {
		return err
	}
	if got != code {
		return fmt.Errorf("GET %s: %d, want %d: %.200s", secureURL, got, code, body)
	}
	return nil
}

// healthz is nil when the loopback listener's /healthz answers 200.
func (s *scraper) healthz() error {
	code, body, err := s.get("http://"+plainAddr+"/healthz", "")
	if err == nil && code != 200 {
		err = fmt.Errorf("/healthz: %d: %s", code, body)
	}
	return err
}

// metricValue returns the value of the series line (name and labels) in body.
func metricValue(body, series string) (float64, error) {
	for l := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("no %s in the metrics", series)
}

func procKiB(pid int, field string) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// reviews counts the agent's TokenReviews and SubjectAccessReviews in the audit log.
func (a *agent) reviews(t testing.TB) (tokenReviews, sars int) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range a.requests(t) {
		if e.ObjectRef == nil || seen[e.AuditID] {
			continue
		}
		seen[e.AuditID] = true
		switch e.ObjectRef.Resource {
		case "tokenreviews":
			tokenReviews++
		case "subjectaccessreviews":
			sars++
		}
	}
	return tokenReviews, sars
}

func TestKernelK8sMetricsAuth(t *testing.T) {
	c := need(t)
	n := c.newNode(t)
	name := c.nodeName()
	ctx := ctxFor(t, 10*time.Minute)
	if err := c.admin.createCiliumNode(ctx, name, 255); err != nil {
		t.Fatal(err)
	}

	// Two scrapers: one bound to the reader ClusterRole, one not.
	reader := c.serviceAccount(t, ctx, "prom-"+name)
	other := c.serviceAccount(t, ctx, "other-"+name)
	binding := "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/metrics-" + name
	if _, err := c.admin.must(ctx, http.StatusCreated, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]string{"name": "metrics-" + name},
		"roleRef":  map[string]string{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": readerRole},
		"subjects": []map[string]string{{"kind": "ServiceAccount", "name": "prom-" + name, "namespace": c.sa.Metadata.Namespace}},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.admin.do(context.Background(), "DELETE", binding, nil) })
	readerToken, err := c.saToken(ctx, reader)
	if err != nil {
		t.Fatal(err)
	}
	otherToken, err := c.saToken(ctx, other)
	if err != nil {
		t.Fatal(err)
	}

	a := c.startMetricsAgent(t, n, name)
	s := newScraper(n.ns, false)
	eventually(t, watchDeadline, "split with key 255, /healthz 200", func() error {
		return firstErr(a.alive(), n.splitOn(), s.healthz())
	})

	// First, while this client is in good standing: a client that sent a token
	// the API server did not authenticate (the 401 cases below) has its new
	// tokens reviewed on the suspects' budget of 5 a second for a minute, and
	// this subtest reviews ten new tokens at once.
	t.Run("latency cached vs uncached", func(t *testing.T) {
		ks := newScraper(n.ns, true) // keep-alive: time the review, not the handshake
		const tokens, hits = 5, 20
		var uncached, cached time.Duration
		for range tokens {
			tok, err := c.saToken(ctx, reader) // a new token: no cached decision
			if err != nil {
				t.Fatal(err)
			}
			if err := ks.want(tok, 200); err != nil { // warm the connection
				t.Fatal(err)
			}
			tok, err = c.saToken(ctx, reader)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := ks.want(tok, 200); err != nil {
				t.Fatal(err)
			}
			uncached += time.Since(start)
			start = time.Now()
			for range hits {
				if err := ks.want(tok, 200); err != nil {
					t.Fatal(err)
				}
			}
			cached += time.Since(start)
		}
		u, h := uncached/tokens, cached/(tokens*hits)
		t.Logf("scrape latency over keep-alive HTTPS: uncached (TokenReview + SubjectAccessReview) %s, cached %s: %.1fx",
			u.Round(time.Microsecond), h.Round(time.Microsecond), float64(u)/float64(h))
	})

	t.Run("who may scrape", func(t *testing.T) {
		for _, tc := range []struct {
			name, token string
			want        int
		}{
			{"bound to " + readerRole, readerToken, 200},
			{"not bound", otherToken, 403},
			{"no token", "", 401},
			{"garbage token", "eyJhbGciOiJSUzI1NiJ9.garbage.garbage", 401},
			{"the agent's own token", a.token, 403},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := s.want(tc.token, tc.want); err != nil {
					t.Error(err)
				}
			})
		}
		code, body, err := s.get(secureURL, readerToken)
		if err != nil || code != 200 || !strings.Contains(body, "marksplit_ready 1") {
			t.Errorf("scrape: %d, %v; want 200 with marksplit_ready 1:\n%.500s", code, err, body)
		}
		if code, _, err := s.get("https://"+nodeAddr+":"+securePort+"/healthz", readerToken); err != nil || code != 404 {
			t.Errorf("/healthz on the secure listener: %d, %v; want 404 (the probes stay on loopback)", code, err)
		}
		if code, _, err := s.get("http://"+nodeAddr+":9184/metrics", ""); err == nil {
			t.Errorf("the plain listener answered %d on the node's address; want it on loopback only", code)
		}
	})

	t.Run("garbage flood", func(t *testing.T) {
		pid := a.cmd.Process.Pid
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "marksplit" {
			t.Fatalf("process %d is %q, not the agent", pid, comm)
		}
		trBefore, sarBefore := a.reviews(t)
		rssBefore, err := procKiB(pid, "VmRSS")
		if err != nil {
			t.Fatal(err)
		}
		fs := newScraper(n.ns, true)
		var next atomic.Int64
		var mu sync.Mutex
		codes := map[int]int{}
		var errs []error
		start := time.Now()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for i := next.Add(1); i <= floodTokens; i = next.Add(1) {
					code, _, err := fs.get(secureURL, fmt.Sprintf("garbage.%d.%x", i, i*7919))
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					}
					codes[code]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%d requests failed: %v", len(errs), errs[0])
		}
		rssAfter, err := procKiB(pid, "VmRSS")
		if err != nil {
			t.Fatal(err)
		}
		hwm, err := procKiB(pid, "VmHWM")
		if err != nil {
			t.Fatal(err)
		}
		var trAfter, sarAfter int
		eventually(t, 10*time.Second, "the audit log has the flood's reviews", func() error {
			trAfter, sarAfter = a.reviews(t)
			if trAfter == trBefore {
				return errors.New("no TokenReview yet")
			}
			return nil
		})
		calls := trAfter - trBefore + sarAfter - sarBefore
		t.Logf("%d requests with distinct garbage tokens in %s: statuses %v; %d API calls (%d TokenReviews, %d SubjectAccessReviews); RSS %d KiB before, %d KiB after, peak %d KiB",
			floodTokens, took.Round(time.Millisecond), codes, calls, trAfter-trBefore, sarAfter-sarBefore, rssBefore, rssAfter, hwm)
		if codes[401]+codes[429] != floodTokens {
			t.Errorf("statuses %v: want only 401 (reviewed) and 429 (over the review budget)", codes)
		}
		// A burst of 20, then 5 a second.
		if max := 20 + int(took.Seconds()*5) + 5; calls > max {
			t.Errorf("%d API calls in %s, want at most %d", calls, took, max)
		}
		if sarAfter != sarBefore {
			t.Errorf("%d SubjectAccessReviews for unauthenticated tokens", sarAfter-sarBefore)
		}
		if rssAfter > rssBefore+16<<10 {
			t.Errorf("RSS grew from %d to %d KiB: want the flood to cost less than 16 MiB", rssBefore, rssAfter)
		}
		// A cached decision still answers, and the agent counted what the
		// audit log shows.
		code, body, err := s.get(secureURL, readerToken)
		if err != nil || code != 200 {
			t.Fatalf("after the flood: %d, %v", code, err)
		}
		n, err := metricValue(body, "marksplit_metrics_auth_api_requests_total")
		if err != nil {
			t.Fatal(err)
		}
		tr, sar := a.reviews(t)
		t.Logf("the agent counts %v reviews in all, the audit log %d", n, tr+sar)
		if int(n) != tr+sar {
			t.Errorf("marksplit_metrics_auth_api_requests_total %v, the audit log %d reviews", n, tr+sar)
		}
	})

	t.Run("API server down", func(t *testing.T) {
		// A fresh decision, made just before the outage (retried while the
		// flood's review budget refills).
		tok, err := c.saToken(ctx, reader)
		if err != nil {
			t.Fatal(err)
		}
		var reviewed time.Time
		eventually(t, 30*time.Second, "a new token reviewed", func() error {
			reviewed = time.Now()
			return s.want(tok, 200)
		})
		c.stopAPIServer()
		t.Cleanup(func() { c.ensureAPIServer(t) })

		if err := s.want(tok, 200); err != nil {
			t.Errorf("the cached allow with the API server down: %v", err)
		}
		eventually(t, 10*time.Second, "a new token answered 503 with the API server down (429 while the review budget refills)", func() error {
			return s.want("never-seen-token", 503)
		})
		// The agent goes on: a deleted rule comes back.
		if _, err := ipOut(n.ns, "rule", "del", "pref", "900"); err != nil {
			t.Fatal(err)
		}
		eventually(t, repairDeadline, "the deleted rule repaired while the API server is down", func() error {
			return firstErr(a.alive(), n.splitOn(), s.healthz())
		})
		// The cached allow expires; then scrapes fail, and only they.
		eventually(t, allowTTL+30*time.Second, "scrapes fail (503) once the cached allow expires", func() error {
			return firstErr(a.alive(), s.want(tok, 503))
		})
		if held := time.Since(reviewed); held < allowTTL {
			t.Errorf("the cached allow held %s, want %s", held, allowTTL)
		}
		if err := firstErr(s.healthz(), n.splitOn(), a.logged("metrics auth: the API server did not answer a review")); err != nil {
			t.Error(err)
		}

		if err := c.startAPIServer(); err != nil {
			t.Fatal(err)
		}
		eventually(t, reconnectDeadline, "scrapes answered again once the API server is back", func() error {
			return firstErr(a.alive(), s.want(tok, 200))
		})
		if err := a.logged("metrics auth: the API server answers reviews again"); err != nil {
			t.Error(err)
		}
	})
}
