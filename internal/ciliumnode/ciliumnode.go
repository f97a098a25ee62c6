package ciliumnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Mode is whether the node encrypts, as its CiliumNode says.
type Mode int

// Modes. Unknown is the zero value: no good read yet.
const (
	Unknown Mode = iota
	Encrypting
	NotEncrypting
)

// String returns "unknown", "yes" or "no".
func (m Mode) String() string {
	switch m {
	case Unknown:
		return "unknown"
	case Encrypting:
		return "yes"
	case NotEncrypting:
		return "no"
	}
	return "unknown(" + strconv.Itoa(int(m)) + ")"
}

// Stats counts the requests a Source made, by outcome. A GET counts once as OK, NotFound,
// HTTPError, DecodeError or NetworkError. A watch counts once when it ends: OK when the resync
// replaced it, WatchRestart when the server ended it cleanly or it went silent (it is resumed),
// Gone on 410, or as an error. Requests cut short because Run's context ended are not counted.
type Stats struct {
	OK           uint64
	NotFound     uint64 // 404
	HTTPError    uint64 // other non-2xx answers, and ERROR events other than 410
	DecodeError  uint64 // garbage JSON, a wrong kind or name, an unknown event type
	NetworkError uint64 // connection refused or dropped, TLS verification, timeouts
	WatchRestart uint64
	Gone         uint64 // 410: resourceVersion too old, the object is read again

	LastGoodRead time.Time // of the last GET or ADDED/MODIFIED event that yielded a mode
	Mode         Mode      // the last mode reported
}

// Requests returns the counters keyed by outcome label: ok, not_found, http_error,
// decode_error, network_error, watch_restart, gone_410.
func (st Stats) Requests() map[string]uint64 {
	return map[string]uint64{
		"ok":            st.OK,
		"not_found":     st.NotFound,
		"http_error":    st.HTTPError,
		"decode_error":  st.DecodeError,
		"network_error": st.NetworkError,
		"watch_restart": st.WatchRestart,
		"gone_410":      st.Gone,
	}
}

// outcome of one request, for Stats.
type outcome int

const (
	outcomeNone outcome = iota // not counted: Run's context ended, or no request was sent
	outcomeOK
	outcomeNotFound
	outcomeHTTPError
	outcomeDecodeError
	outcomeNetworkError
	outcomeWatchRestart
	outcomeGone
)

// Source reads one node's CiliumNode. Create it with New and call Run.
type Source struct {
	cfg    Config
	getURL string
	client *http.Client
	log    *slog.Logger
	lw     *listWatch

	mode Mode // Run's goroutine only
	// report is Run's report func; Run's goroutine only.
	report func(Mode)

	mu    sync.Mutex
	stats Stats
}

// New validates cfg, fills in its defaults and, unless cfg.HTTPClient is set, builds an
// HTTPS client that trusts the certificates in cfg.CAFile.
func New(cfg Config) (*Source, error) {
	if err := validNodeName(cfg.NodeName); err != nil {
		return nil, err
	}
	lw, server, err := newListWatch(cfg)
	if err != nil {
		return nil, err
	}
	s := &Source{cfg: lw.cfg, getURL: server + resource + "/" + cfg.NodeName, client: lw.client, log: lw.cfg.Logger, lw: lw}
	s.lw.watchURL = server + resource + "?watch=1&fieldSelector=metadata.name%3D" + cfg.NodeName +
		"&allowWatchBookmarks=true&resourceVersion="
	s.lw.what, s.lw.kept, s.lw.again = cfg.NodeName, "the last mode", "reading the object again"
	s.lw.resync, s.lw.count, s.lw.r = s.cfg.Resync, s.count, s
	return s, nil
}

// Stats returns the request counters, the last good read time and the last reported mode.
func (s *Source) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

func (s *Source) count(o outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.add(o)
}

// add counts one request of outcome o.
func (st *Stats) add(o outcome) {
	switch o {
	case outcomeOK:
		st.OK++
	case outcomeNotFound:
		st.NotFound++
	case outcomeHTTPError:
		st.HTTPError++
	case outcomeDecodeError:
		st.DecodeError++
	case outcomeNetworkError:
		st.NetworkError++
	case outcomeWatchRestart:
		st.WatchRestart++
	case outcomeGone:
		st.Gone++
	}
}

// Run reads, then watches, the node's CiliumNode until ctx ends. It calls report (from Run's
// goroutine only) with the mode after every good read that changes it; the first good read
// of each Run always reports. report should return promptly: the watch waits for it. Run
// returns nil when ctx ends, and an error only when misused (nil report, or already running).
func (s *Source) Run(ctx context.Context, report func(Mode)) error {
	return s.lw.start(ctx, report == nil, func() { s.mode, s.report = Unknown, report })
}

// read GETs the CiliumNode and takes its mode (the list-watch loop's reader).
func (s *Source) read(ctx context.Context) (string, error) {
	n, err := s.get(ctx)
	if err != nil {
		return "", err
	}
	s.goodRead(n)
	return n.Metadata.ResourceVersion, nil
}

// event applies a watch event (the list-watch loop's reader): a good read, or a deletion,
// after which the last mode stands.
func (s *Source) event(typ string, o *wireObject, decodeErr error) error {
	if err := s.check(o, decodeErr); err != nil {
		return err
	}
	if typ == "DELETED" {
		s.log.Warn("ciliumnode: CiliumNode "+s.cfg.NodeName+" deleted; keeping the last mode", "encrypting", s.mode.String())
		return nil
	}
	s.goodRead(o)
	return nil
}

// check checks a CiliumNode read from a GET or an event.
func (s *Source) check(o *wireObject, decodeErr error) error {
	if decodeErr != nil {
		return fmt.Errorf("decode %s: %w", kind, decodeErr)
	}
	if err := o.checkKind(false); err != nil {
		return err
	}
	switch {
	case o.Metadata.Name != s.cfg.NodeName:
		return fmt.Errorf("got %s %q, want %q", kind, o.Metadata.Name, s.cfg.NodeName)
	case o.Metadata.ResourceVersion == "":
		return fmt.Errorf("%s without metadata.resourceVersion", kind)
	}
	return nil
}

// goodRead records a CiliumNode read from a GET or an ADDED/MODIFIED event, and reports its
// mode if it changed.
func (s *Source) goodRead(n *wireObject) {
	m := NotEncrypting
	if n.Spec.Encryption.Key != 0 {
		m = Encrypting
	}
	s.log.Debug("ciliumnode: read", "node", s.cfg.NodeName, "resource_version", n.Metadata.ResourceVersion, "encrypting", m.String())
	s.mu.Lock()
	s.stats.LastGoodRead = time.Now()
	s.stats.Mode = m
	s.mu.Unlock()
	if m != s.mode {
		s.mode = m
		s.report(m)
	}
}

// errNotFound marks a 404 answer to the GET: Cilium has not registered the node yet.
var errNotFound = errors.New("not registered yet")

// get reads the CiliumNode.
func (s *Source) get(ctx context.Context) (*wireObject, error) {
	n, o, err := s.doGet(ctx)
	if ctx.Err() != nil {
		o = outcomeNone
	}
	s.count(o)
	if err != nil {
		return nil, fmt.Errorf("ciliumnode: get %s: %w", s.cfg.NodeName, err)
	}
	return n, nil
}

func (s *Source) doGet(ctx context.Context) (*wireObject, outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	resp, o, err := do(ctx, s.client, s.cfg.TokenFile, s.getURL)
	if o == outcomeNotFound {
		return nil, o, fmt.Errorf("%w: %w", errNotFound, err)
	}
	if err != nil {
		return nil, o, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err == nil {
		err = context.Cause(ctx) // a body cut by the timeout may read as complete
	}
	switch {
	case err != nil:
		return nil, outcomeNetworkError, fmt.Errorf("read body: %w", err)
	case len(body) > maxBody:
		return nil, outcomeDecodeError, fmt.Errorf("answer larger than %d bytes", maxBody)
	}
	var n wireObject
	if err := json.Unmarshal(body, &n); err != nil {
		var typeErr *json.UnmarshalTypeError
		if !errors.As(err, &typeErr) {
			return nil, outcomeDecodeError, fmt.Errorf("decode %s: %w", kind, err)
		}
		return nil, outcomeDecodeError, s.check(&n, err)
	}
	if err := s.check(&n, nil); err != nil {
		return nil, outcomeDecodeError, err
	}
	return &n, outcomeOK, nil
}
