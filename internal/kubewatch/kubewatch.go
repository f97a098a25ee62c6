package kubewatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

// State is whether the object exists, as last read.
type State int

// States. Unknown is the zero value: no good list yet.
const (
	Unknown State = iota
	Absent
	Present
)

// String returns "unknown", "absent" or "present".
func (s State) String() string {
	switch s {
	case Unknown:
		return "unknown"
	case Absent:
		return "absent"
	case Present:
		return "present"
	}
	return "unknown(" + strconv.Itoa(int(s)) + ")"
}

// Defaults of Config, and their reasons.
const (
	// A list of one name is cheap; every 5 minutes it catches what a watch could miss.
	defaultResync = 5 * time.Minute
	// API servers send a bookmark about once a minute.
	defaultWatchTimeout = 2 * time.Minute
	// A list of one object answers in milliseconds; a hung server is given up on.
	defaultRequestTimeout = 30 * time.Second
)

// MaxBody bounds a list answer and each watch event: a ConfigMap holds at most 1 MiB of
// data and etcd caps an object at 1.5 MiB.
const MaxBody = 4 << 20

// Config says which object to watch, where and how.
type Config struct {
	// Client reaches the API server (see kubeapi.NewHTTPClient: no redirects).
	Client kubeapi.Client
	// APIVersion and Kind of the object: "v1" and "ConfigMap". The list's kind is
	// Kind+"List".
	APIVersion, Kind string
	// Collection is the path of the object's collection, without a trailing slash:
	// /api/v1/namespaces/kube-system/configmaps.
	Collection string
	// Name is the object's name; it must be a DNS subdomain.
	Name string
	// Resync is how often the list is read again while the watch is healthy. Default 5m.
	Resync time.Duration
	// WatchTimeout restarts a watch that completes no event for this long. Default 2m.
	WatchTimeout time.Duration
	// RequestTimeout bounds a list. Default 30s.
	RequestTimeout time.Duration
	// Backoff spaces the retries after failures; used by Run's goroutine only. Default
	// exponential from about 0.5 s up to 1 min, never giving up.
	Backoff backoff.BackOff
	// Logger receives failures (warn) and the protocol's steps (debug); default discard.
	Logger *slog.Logger
	// Key, when set, is the one key of the object's data (a ConfigMap's) whose value
	// RunKey reports; no other data is kept. It must be a ConfigMap key: letters,
	// digits, '-', '_' and '.', at most 253.
	Key string
}

// Reading is what RunKey reports: whether the object exists and, when it does and its
// data has Config.Key, that key's value.
type Reading struct {
	State  State
	Value  string // data[Config.Key], when HasKey
	HasKey bool
}

// Watcher follows whether one object exists. Create it with New and call Run.
type Watcher struct {
	cfg     Config
	listURL string // path and query of the list
	what    string // "ConfigMap kube-system/marksplit-uninstall", for messages
	running atomic.Bool
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Watcher, error) {
	if cfg.Client.HTTP == nil || cfg.Client.TokenFile == "" {
		return nil, errors.New("kubewatch: no HTTP client or no token file")
	}
	if _, err := kubeapi.ParseServer(cfg.Client.Server); err != nil {
		return nil, fmt.Errorf("kubewatch: %w", err)
	}
	if err := ValidName(cfg.Name); err != nil {
		return nil, fmt.Errorf("kubewatch: %w", err)
	}
	if cfg.Key != "" {
		if err := ValidKey(cfg.Key); err != nil {
			return nil, fmt.Errorf("kubewatch: %w", err)
		}
	}
	if cfg.APIVersion == "" || cfg.Kind == "" || cfg.Collection == "" || cfg.Collection[0] != '/' {
		return nil, errors.New("kubewatch: APIVersion, Kind and Collection (a path) are required")
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Resync", &cfg.Resync, defaultResync},
		{"WatchTimeout", &cfg.WatchTimeout, defaultWatchTimeout},
		{"RequestTimeout", &cfg.RequestTimeout, defaultRequestTimeout},
	} {
		switch {
		case *d.v < 0:
			return nil, fmt.Errorf("kubewatch: negative %s %v", d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if cfg.Backoff == nil {
		cfg.Backoff = backoff.NewExponentialBackOff(backoff.WithMaxElapsedTime(0))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Watcher{
		cfg:     cfg,
		listURL: cfg.Collection + "?fieldSelector=" + url.QueryEscape("metadata.name="+cfg.Name),
		what:    cfg.Kind + " " + objectName(cfg.Collection, cfg.Name),
	}, nil
}

// objectName is namespace/name for a collection in a namespace
// (…/namespaces/NS/RESOURCE), else name.
func objectName(collection, name string) string {
	parts := strings.Split(collection, "/")
	if n := len(parts); n >= 3 && parts[n-3] == "namespaces" {
		return parts[n-2] + "/" + name
	}
	return name
}

// ValidName checks that name is a DNS subdomain (RFC 1123), as the names of ConfigMaps
// and most other objects are.
func ValidName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("invalid name %.40q: want 1 to 253 characters", name)
	}
	start := 0
	for i := 0; i <= len(name); i++ {
		if i < len(name) && name[i] != '.' {
			c := name[i]
			if !(alnum(c) || c == '-') {
				return fmt.Errorf("invalid name %q: not a DNS subdomain (lowercase letters, digits, '-' and '.')", name)
			}
			continue
		}
		label := name[start:i]
		if label == "" || !alnum(label[0]) || !alnum(label[len(label)-1]) {
			return fmt.Errorf("invalid name %q: not a DNS subdomain (each part starts and ends with a letter or digit)", name)
		}
		start = i + 1
	}
	return nil
}

// ValidKey checks that key is a ConfigMap data key: 1 to 253 letters, digits, '-', '_'
// and '.'.
func ValidKey(key string) error {
	if key == "" || len(key) > 253 {
		return fmt.Errorf("invalid key %.40q: want 1 to 253 characters", key)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; !(alnum(c) || 'A' <= c && c <= 'Z' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("invalid key %q: want letters, digits, '-', '_' and '.'", key)
		}
	}
	return nil
}

func alnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }

// Run lists, then watches, the object until ctx ends. It calls report (from Run's
// goroutine only) with Present or Absent after the first good list of each Run and
// after every change, and with Unknown once if the first list fails. report should
// return promptly. Run returns nil when ctx ends, and an error only when misused.
func (w *Watcher) Run(ctx context.Context, report func(State)) error {
	if report == nil {
		return errors.New("kubewatch: Run: nil report func")
	}
	var (
		last     State
		reported bool
	)
	return w.RunKey(ctx, func(r Reading) {
		if !reported || r.State != last {
			last, reported = r.State, true
			report(r.State)
		}
	})
}

// RunKey is Run that also reports the value of Config.Key: it calls report after the
// first good list, whenever the state or the value changes, and with Unknown once if
// the first list fails. A data value that is not a string is a failure, as a garbled
// answer is: the last reading stands.
func (w *Watcher) RunKey(ctx context.Context, report func(Reading)) error {
	if report == nil {
		return errors.New("kubewatch: Run: nil report func")
	}
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("kubewatch: Run: already running")
	}
	defer w.running.Store(false)
	w.run(ctx, report)
	return nil
}

func (w *Watcher) run(ctx context.Context, report func(Reading)) {
	log := w.cfg.Logger
	var (
		state    Reading
		reported bool
	)
	set := func(r Reading) {
		if !reported || r != state {
			if reported {
				log.Debug("kubewatch: changed", "object", w.what, "state", r.State.String())
			}
			state, reported = r, true
			report(r)
		}
	}
	kept := func() string { return "keeping it " + state.State.String() }
	loop := kubeapi.ListWatch{
		Read: func(ctx context.Context) (string, error) {
			rv, r, err := w.list(ctx)
			if err == nil {
				set(r)
			}
			return rv, err
		},
		ReadFailed: func(err error, d time.Duration) {
			if !reported {
				log.Warn(err.Error()+"; not known yet", "retry_in_s", d.Seconds())
				set(Reading{State: Unknown}) // after the warning, which says why
				return
			}
			log.Warn(err.Error()+"; "+kept(), "retry_in_s", d.Seconds())
		},
		Watch: func(ctx context.Context, rv string, resyncAt time.Time) kubeapi.WatchEnd {
			return w.watch(ctx, rv, resyncAt, set)
		},
		Resync:  w.cfg.Resync,
		Backoff: w.cfg.Backoff,
		Logger:  log,
		Prefix:  "kubewatch", Attr: "object", What: w.what,
		Kept:  kept,
		Again: "listing again",
	}
	loop.Run(ctx)
}

// get sends a GET of pathQuery and returns the response of a 200 answer for the caller
// to read and close; any other answer is a *kubeapi.StatusError.
func (w *Watcher) get(ctx context.Context, pathQuery string) (*http.Response, error) {
	req, err := kubeapi.NewRequest(ctx, w.cfg.Client.TokenFile, http.MethodGet, w.cfg.Client.Server+pathQuery, nil)
	if err != nil {
		return nil, err
	}
	resp, err := w.cfg.Client.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	body, err := readLimited(resp.Body, kubeapi.MaxErrBody)
	if err != nil {
		return nil, fmt.Errorf("%s: read body: %w", resp.Status, err)
	}
	return nil, kubeapi.NewStatusError(resp, body)
}
