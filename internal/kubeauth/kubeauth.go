package kubeauth

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
)

// Defaults of Config, after kube-rbac-proxy and controller-runtime's authenticating
// metrics filter: an allow is trusted a minute (a revoked binding or token keeps
// scraping that long), a denial 15 s (a binding just made works soon).
const (
	DefaultPath             = "/metrics"
	DefaultVerb             = "get"
	DefaultAllowTTL         = time.Minute
	DefaultDenyTTL          = 15 * time.Second
	DefaultMaxEntries       = 1024
	DefaultMaxInflight      = 4
	DefaultReviewsPerSecond = 5
	DefaultReviewBurst      = 20
	DefaultTimeout          = 5 * time.Second

	// MaxTokenBytes bounds a token: a service account's JWT is about 1 KiB, an OIDC
	// token a few.
	MaxTokenBytes = 8 << 10
	// maxAnswer bounds a review's answer: a user's groups and extra are small.
	maxAnswer = 256 << 10
)

// Config configures an Authorizer. Zero fields take the defaults above.
type Config struct {
	// API sends the reviews, with the agent's own token: its service account needs
	// create on tokenreviews and subjectaccessreviews.
	API *kubeapi.Client
	// Path and Verb are the non-resource URL and verb a token must be allowed.
	Path, Verb string
	// AllowTTL and DenyTTL are how long an allow and a denial (or an
	// unauthenticated token) are cached.
	AllowTTL, DenyTTL time.Duration
	// MaxEntries bounds the cache.
	MaxEntries int
	// MaxInflight bounds the reviews under way at once.
	MaxInflight int
	// ReviewsPerSecond and ReviewBurst rate-limit the reviews of uncached tokens.
	ReviewsPerSecond float64
	ReviewBurst      int
	// Timeout bounds one review (a TokenReview and a SubjectAccessReview).
	Timeout time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Logger gets the API server's failures; nil discards.
	Logger *slog.Logger
}

// Decision is what a token may do.
type Decision int

const (
	// Unavailable: no decision, the API server did not answer (503).
	Unavailable Decision = iota
	// Allowed: authenticated and authorized.
	Allowed
	// Unauthenticated: no token, a malformed one, or one the API server does not
	// know (401).
	Unauthenticated
	// Denied: authenticated, not authorized (403).
	Denied
	// Throttled: not cached and the review budget is spent (429).
	Throttled

	numDecisions
)

var decisionNames = [numDecisions]string{"unavailable", "allowed", "unauthenticated", "denied", "throttled"}

// Decisions lists every Decision, for labels.
func Decisions() []Decision {
	return []Decision{Allowed, Unauthenticated, Denied, Unavailable, Throttled}
}

func (d Decision) String() string {
	if d >= 0 && d < numDecisions {
		return decisionNames[d]
	}
	return fmt.Sprintf("unknown(%d)", int(d))
}

// StatusCode is the HTTP status of d.
func (d Decision) StatusCode() int {
	switch d {
	case Allowed:
		return http.StatusOK
	case Unauthenticated:
		return http.StatusUnauthorized
	case Denied:
		return http.StatusForbidden
	case Throttled:
		return http.StatusTooManyRequests
	}
	return http.StatusServiceUnavailable
}

// Authorizer decides with the API server, caching its answers.
type Authorizer struct {
	cfg Config
	log *slog.Logger
	sem chan struct{} // a slot per review under way

	mu      sync.Mutex // guards the fields below
	entries map[[sha256.Size]byte]*list.Element
	lru     *list.List // of *entry, most recently used first
	flights map[[sha256.Size]byte]*flight
	clean   bucket // the review budget of clients in good standing
	suspect bucket // and of the clients whose tokens it did not authenticate
	// suspects are those clients, each until its mark expires; at most
	// MaxEntries of them.
	suspects map[string]time.Time
	loggedT  time.Time // when throttling was last logged

	failing  atomic.Bool // the last review failed: logged once per outage
	reviews  atomic.Uint64
	counters [numDecisions]atomic.Uint64
}

type entry struct {
	key     [sha256.Size]byte
	d       Decision
	expires time.Time
}

// flight is a review under way; the requests with the same token wait for it.
type flight struct {
	done chan struct{}
	d    Decision
	err  error
}

// New returns an Authorizer; cfg.API is required.
func New(cfg Config) (*Authorizer, error) {
	if cfg.API == nil {
		return nil, errors.New("kubeauth: no API client")
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&cfg.AllowTTL, DefaultAllowTTL)
	def(&cfg.DenyTTL, DefaultDenyTTL)
	def(&cfg.Timeout, DefaultTimeout)
	if cfg.Path == "" {
		cfg.Path = DefaultPath
	}
	if cfg.Verb == "" {
		cfg.Verb = DefaultVerb
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = DefaultMaxInflight
	}
	if cfg.ReviewsPerSecond <= 0 {
		cfg.ReviewsPerSecond = DefaultReviewsPerSecond
	}
	if cfg.ReviewBurst <= 0 {
		cfg.ReviewBurst = DefaultReviewBurst
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Authorizer{
		cfg:      cfg,
		log:      log,
		sem:      make(chan struct{}, cfg.MaxInflight),
		entries:  make(map[[sha256.Size]byte]*list.Element),
		lru:      list.New(),
		flights:  make(map[[sha256.Size]byte]*flight),
		clean:    bucket{tokens: float64(cfg.ReviewBurst), filled: cfg.Now()},
		suspect:  bucket{tokens: cfg.ReviewsPerSecond, filled: cfg.Now()},
		suspects: make(map[string]time.Time),
	}, nil
}

// SuspectTTL is how long a client whose token the API server did not
// authenticate draws on the suspects' review budget.
const SuspectTTL = time.Minute

// bucket is a token bucket of reviews.
type bucket struct {
	tokens float64
	filled time.Time
}

// take takes a review from b, which holds at most burst and gains rate a
// second.
func (b *bucket) take(now time.Time, rate float64, burst float64) bool {
	if el := now.Sub(b.filled); el > 0 {
		b.tokens = min(burst, b.tokens+el.Seconds()*rate)
		b.filled = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// Check decides for token. The error says why a decision is Unavailable.
func (a *Authorizer) Check(ctx context.Context, token string) (Decision, error) {
	return a.CheckFrom(ctx, "", token)
}

// CheckFrom decides for token, sent by client (an address, or "" when not
// known). A client whose token the API server did not authenticate reviews
// its next tokens for SuspectTTL on a budget of its own, so that a flood of
// made-up tokens from some clients does not spend the reviews of the others.
func (a *Authorizer) CheckFrom(ctx context.Context, client, token string) (Decision, error) {
	if !validToken(token) {
		return Unauthenticated, nil
	}
	key := sha256.Sum256([]byte(token))
	a.mu.Lock()
	now := a.cfg.Now()
	d, ok, renew := a.cached(key, now)
	if ok {
		a.mu.Unlock()
		return d, nil
	}
	if f, ok := a.flights[key]; ok {
		a.mu.Unlock()
		select {
		case <-f.done:
			return f.d, f.err
		case <-ctx.Done():
			return Unavailable, fmt.Errorf("kubeauth: waiting for a review: %w", ctx.Err())
		}
	}
	// A token whose allow just expired is reviewed again whatever the budget:
	// a flood of made-up tokens must not lock out the scraper it cannot be.
	if !renew && !a.take(client, now) {
		warn := now.Sub(a.loggedT) >= time.Minute
		if warn {
			a.loggedT = now
		}
		a.mu.Unlock()
		if warn {
			a.log.Warn(fmt.Sprintf("metrics auth: more tokens to review than %g a second: scrapes with a token not reviewed yet get 429 for now", a.cfg.ReviewsPerSecond))
		}
		return Throttled, nil
	}
	f := &flight{done: make(chan struct{})}
	a.flights[key] = f
	a.mu.Unlock()

	// The review goes on when the request that started it gives up: others may
	// wait for it, and Timeout bounds it.
	f.d, f.err = a.review(context.WithoutCancel(ctx), token)

	a.mu.Lock()
	delete(a.flights, key)
	switch {
	case f.err == nil:
		a.store(key, f.d, a.cfg.Now())
		if f.d == Unauthenticated && client != "" {
			a.markSuspect(client, a.cfg.Now())
		}
	case renew:
		a.forget(key) // the next attempt waits for the budget like any other
	}
	a.mu.Unlock()
	close(f.done)
	return f.d, f.err
}

// cached returns the unexpired decision for key, marking it recently used;
// renew reports an expired allow (left in place until the review replaces it).
func (a *Authorizer) cached(key [sha256.Size]byte, now time.Time) (d Decision, ok, renew bool) {
	el, found := a.entries[key]
	if !found {
		return 0, false, false
	}
	e := el.Value.(*entry)
	if !now.Before(e.expires) {
		if e.d == Allowed {
			return 0, false, true
		}
		a.forget(key)
		return 0, false, false
	}
	a.lru.MoveToFront(el)
	return e.d, true, false
}

// forget drops the entry of key, if any.
func (a *Authorizer) forget(key [sha256.Size]byte) {
	if el, ok := a.entries[key]; ok {
		a.lru.Remove(el)
		delete(a.entries, key)
	}
}

// store caches d for key, evicting the least recently used entry when full.
func (a *Authorizer) store(key [sha256.Size]byte, d Decision, now time.Time) {
	ttl := a.cfg.DenyTTL
	if d == Allowed {
		ttl = a.cfg.AllowTTL
	}
	a.forget(key)
	for len(a.entries) >= a.cfg.MaxEntries {
		old := a.lru.Back()
		a.lru.Remove(old)
		delete(a.entries, old.Value.(*entry).key)
	}
	a.entries[key] = a.lru.PushFront(&entry{key: key, d: d, expires: now.Add(ttl)})
}

// take takes a review from client's budget: the suspects' while client is
// marked, else the others'.
func (a *Authorizer) take(client string, now time.Time) bool {
	if until, ok := a.suspects[client]; ok {
		if now.Before(until) {
			return a.suspect.take(now, a.cfg.ReviewsPerSecond, a.cfg.ReviewsPerSecond)
		}
		delete(a.suspects, client)
	}
	return a.clean.take(now, a.cfg.ReviewsPerSecond, float64(a.cfg.ReviewBurst))
}

// markSuspect marks client for SuspectTTL, dropping expired marks (or, when
// none has expired, any one) to keep at most MaxEntries.
func (a *Authorizer) markSuspect(client string, now time.Time) {
	if _, ok := a.suspects[client]; !ok && len(a.suspects) >= a.cfg.MaxEntries {
		for c, until := range a.suspects {
			if !now.Before(until) {
				delete(a.suspects, c)
			}
		}
		for c := range a.suspects {
			if len(a.suspects) < a.cfg.MaxEntries {
				break
			}
			delete(a.suspects, c)
		}
	}
	a.suspects[client] = now.Add(SuspectTTL)
}

// validToken reports whether token is an RFC 6750 b64token of at most MaxTokenBytes:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func validToken(token string) bool {
	if token == "" || len(token) > MaxTokenBytes {
		return false
	}
	body := strings.TrimRight(token, "=")
	if body == "" {
		return false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/':
		default:
			return false
		}
	}
	return true
}

// Len returns the number of cached decisions.
func (a *Authorizer) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.entries)
}

// Stats are an Authorizer's counters since New.
type Stats struct {
	// Results counts the requests Handler answered, by Decision.
	Results map[Decision]uint64
	// APIRequests counts the reviews sent to the API server (TokenReviews and
	// SubjectAccessReviews).
	APIRequests uint64
}

// Stats returns the counters.
func (a *Authorizer) Stats() Stats {
	s := Stats{Results: make(map[Decision]uint64, numDecisions), APIRequests: a.reviews.Load()}
	for _, d := range Decisions() {
		s.Results[d] = a.counters[d].Load()
	}
	return s
}
