package ciliumnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
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
	cfg       Config
	getURL    string
	watchURL  string // without the resourceVersion value, which is appended
	client    *http.Client
	ownClient bool
	log       *slog.Logger
	running   atomic.Bool

	mode Mode // Run's goroutine only

	mu    sync.Mutex
	stats Stats
}

// New validates cfg, fills in its defaults and, unless cfg.HTTPClient is set, builds an
// HTTPS client that trusts the certificates in cfg.CAFile.
func New(cfg Config) (*Source, error) {
	if err := validNodeName(cfg.NodeName); err != nil {
		return nil, err
	}
	server, err := settle(&cfg)
	if err != nil {
		return nil, err
	}
	client, own, err := httpClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Source{
		cfg:    cfg,
		getURL: server + resource + "/" + cfg.NodeName,
		watchURL: server + resource + "?watch=1&fieldSelector=metadata.name%3D" + cfg.NodeName +
			"&allowWatchBookmarks=true&resourceVersion=",
		client:    client,
		ownClient: own,
		log:       cfg.Logger,
	}, nil
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
	if report == nil {
		return errors.New("ciliumnode: Run: nil report func")
	}
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("ciliumnode: Run: already running")
	}
	defer s.running.Store(false)
	if s.ownClient {
		defer s.client.CloseIdleConnections()
	}
	s.mode = Unknown
	b := s.cfg.Backoff
	b.Reset()

	var (
		rv       string    // where the next watch starts; "" means GET first
		resyncAt time.Time // when the next full read is due
		// failing is set while watches fail without delivering an event, so that the GETs
		// in between do not reset the back-off and a broken watch is not retried hot.
		failing bool
	)
	for ctx.Err() == nil {
		if rv == "" || !time.Now().Before(resyncAt) {
			node, err := s.get(ctx)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				rv = ""
				d := nextBackOff(b)
				if errors.Is(err, errNotFound) {
					s.log.Info(err.Error(), "retry_in_s", d.Seconds())
				} else {
					s.log.Warn(err.Error(), "retry_in_s", d.Seconds())
				}
				if !sleep(ctx, d) {
					break
				}
				continue
			}
			rv, resyncAt = node.Metadata.ResourceVersion, time.Now().Add(s.cfg.Resync)
			if !failing {
				b.Reset()
			}
			s.goodRead(node, report)
		}

		end := s.watch(ctx, rv, resyncAt, b, report)
		rv = end.rv
		if end.progress {
			failing = false
		}
		retry := false
		switch end.kind {
		case endCanceled:
			return nil
		case endResync:
			s.log.Debug("ciliumnode: resync", "node", s.cfg.NodeName)
			resyncAt = time.Time{}
		case endGone:
			s.log.Info(end.err.Error() + "; reading the object again")
			rv = ""
			retry = !end.progress
		case endClosed:
			if end.err != nil {
				s.log.Warn(end.err.Error()+"; restarting it", "resource_version", rv)
			} else {
				s.log.Debug("ciliumnode: watch ended; resuming", "resource_version", rv)
			}
			retry = !end.progress
		case endFailed:
			d := nextBackOff(b)
			s.log.Warn(end.err.Error(), "retry_in_s", d.Seconds())
			failing = !end.progress
			if !sleep(ctx, d) {
				return nil
			}
		}
		if retry {
			failing = true
			if !sleep(ctx, nextBackOff(b)) {
				return nil
			}
		}
	}
	return nil
}

// goodRead records a CiliumNode read from a GET or an ADDED/MODIFIED event, and reports its
// mode if it changed.
func (s *Source) goodRead(n ciliumNode, report func(Mode)) {
	m := n.mode()
	s.log.Debug("ciliumnode: read", "node", s.cfg.NodeName, "resource_version", n.Metadata.ResourceVersion, "encrypting", m.String())
	s.mu.Lock()
	s.stats.LastGoodRead = time.Now()
	s.stats.Mode = m
	s.mu.Unlock()
	if m != s.mode {
		s.mode = m
		report(m)
	}
}

// errNotFound marks a 404 answer to the GET: Cilium has not registered the node yet.
var errNotFound = errors.New("not registered yet")

// get reads the CiliumNode.
func (s *Source) get(ctx context.Context) (ciliumNode, error) {
	n, o, err := s.doGet(ctx)
	if ctx.Err() != nil {
		o = outcomeNone
	}
	s.count(o)
	if err != nil {
		return ciliumNode{}, fmt.Errorf("ciliumnode: get %s: %w", s.cfg.NodeName, err)
	}
	return n, nil
}

func (s *Source) doGet(ctx context.Context) (ciliumNode, outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	req, err := newRequest(ctx, s.cfg.TokenFile, s.getURL)
	if err != nil {
		return ciliumNode{}, outcomeNone, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return ciliumNode{}, outcomeNetworkError, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err == nil {
		err = context.Cause(ctx) // a body cut by the timeout may read as complete
	}
	if err != nil {
		return ciliumNode{}, outcomeNetworkError, fmt.Errorf("read body: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return ciliumNode{}, outcomeNotFound, fmt.Errorf("%w: %w", errNotFound, statusError(resp, body))
	case resp.StatusCode != http.StatusOK:
		return ciliumNode{}, outcomeHTTPError, statusError(resp, body)
	case len(body) > maxBody:
		return ciliumNode{}, outcomeDecodeError, fmt.Errorf("answer larger than %d bytes", maxBody)
	}
	n, err := decodeNode(body, s.cfg.NodeName, false)
	if err != nil {
		return ciliumNode{}, outcomeDecodeError, err
	}
	return n, outcomeOK, nil
}

// How a watch ended.
type endKind int

const (
	endCanceled endKind = iota // Run's context ended
	endResync                  // the resync is due: read the object again
	endGone                    // 410: read the object again
	endClosed                  // the server ended it cleanly, or it went silent: resume from rv
	endFailed                  // an error: back off, then resume from rv
	endCorrupt                 // an object that does not decode (PeerSource): back off, then list again
)

type watchEnd struct {
	kind     endKind
	rv       string // the last resourceVersion seen
	progress bool   // at least one event arrived
	err      error
}

var (
	errResync = errors.New("resync due")
	errSilent = errors.New("watch silent")
)

// watch watches the object from resourceVersion rv until the resync is due, ctx ends or the
// watch ends; it reports good reads as they arrive.
func (s *Source) watch(ctx context.Context, rv string, resyncAt time.Time, b backoff.BackOff, report func(Mode)) watchEnd {
	end := watchEnd{rv: rv}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	resync := time.AfterFunc(time.Until(resyncAt), func() { cancel(errResync) })
	defer resync.Stop()
	silence := time.AfterFunc(s.cfg.WatchTimeout, func() { cancel(errSilent) })
	defer silence.Stop()

	fail := func(o outcome, err error) watchEnd {
		switch {
		case ctx.Err() != nil:
			end.kind = endCanceled
		case context.Cause(wctx) == errResync:
			s.count(outcomeOK)
			end.kind = endResync
		case context.Cause(wctx) == errSilent:
			s.count(outcomeWatchRestart)
			end.kind = endClosed
			end.err = fmt.Errorf("ciliumnode: watch %s: no data for %v", s.cfg.NodeName, s.cfg.WatchTimeout)
		default:
			s.count(o)
			end.kind = endFailed
			if o == outcomeGone {
				end.kind = endGone
			}
			end.err = fmt.Errorf("ciliumnode: watch %s from resourceVersion %s: %w", s.cfg.NodeName, rv, err)
		}
		return end
	}

	req, err := newRequest(wctx, s.cfg.TokenFile, s.watchURL+url.QueryEscape(rv))
	if err != nil {
		return fail(outcomeNone, err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fail(outcomeNetworkError, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrBody))
		o := outcomeHTTPError
		switch resp.StatusCode {
		case http.StatusNotFound:
			o = outcomeNotFound
		case http.StatusGone:
			o = outcomeGone
		}
		return fail(o, statusError(resp, body))
	}

	body := &activityReader{r: resp.Body, timer: silence, timeout: s.cfg.WatchTimeout}
	dec := json.NewDecoder(body)
	for {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			switch {
			case wctx.Err() != nil:
				// Canceled: by Run's context, the resync or the silence timer. Over
				// HTTP/1.1 the cut body may even read as a clean io.EOF.
				return fail(outcomeNone, err)
			case err == io.EOF:
				s.count(outcomeWatchRestart)
				end.kind = endClosed
				return end
			case body.err != nil && body.err != io.EOF, errors.Is(err, io.ErrUnexpectedEOF):
				return fail(outcomeNetworkError, err)
			default:
				return fail(outcomeDecodeError, fmt.Errorf("decode event: %w", err))
			}
		}
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED", "BOOKMARK":
			n, err := decodeNode(ev.Object, s.cfg.NodeName, ev.Type == "BOOKMARK")
			if err != nil {
				return fail(outcomeDecodeError, fmt.Errorf("%s event: %w", ev.Type, err))
			}
			end.rv, end.progress = n.Metadata.ResourceVersion, true
			b.Reset()
			switch ev.Type {
			case "ADDED", "MODIFIED":
				s.goodRead(n, report)
			case "DELETED":
				s.log.Warn("ciliumnode: CiliumNode "+s.cfg.NodeName+" deleted; keeping the last mode", "encrypting", s.mode.String())
			}
		case "ERROR":
			var st status
			if err := json.Unmarshal(ev.Object, &st); err != nil || st.Kind != "Status" {
				return fail(outcomeDecodeError, fmt.Errorf("ERROR event without a Status: %.100s", ev.Object))
			}
			o := outcomeHTTPError
			if st.Code == http.StatusGone {
				o = outcomeGone
			}
			return fail(o, fmt.Errorf("ERROR event: %d %s: %s", st.Code, st.Reason, oneLine(st.Message)))
		default:
			return fail(outcomeDecodeError, fmt.Errorf("unknown event type %q", oneLine(ev.Type)))
		}
	}
}

// ciliumNode holds the fields of a CiliumNode that matter here.
type ciliumNode struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Spec struct {
		Encryption struct {
			Key int64 `json:"key"`
		} `json:"encryption"`
	} `json:"spec"`
}

func (n ciliumNode) mode() Mode {
	if n.Spec.Encryption.Key != 0 {
		return Encrypting
	}
	return NotEncrypting
}

// decodeNode decodes and checks a CiliumNode. A bookmark carries only a resourceVersion.
func decodeNode(data []byte, name string, bookmark bool) (ciliumNode, error) {
	var n ciliumNode
	if err := json.Unmarshal(data, &n); err != nil {
		return n, fmt.Errorf("decode %s: %w", kind, err)
	}
	lax := bookmark && n.APIVersion == "" && n.Kind == ""
	switch {
	case !lax && (n.APIVersion != apiVersion || n.Kind != kind):
		return n, fmt.Errorf("got %q %q, want %s %s", n.APIVersion, n.Kind, apiVersion, kind)
	case !bookmark && n.Metadata.Name != name:
		return n, fmt.Errorf("got %s %q, want %q", kind, n.Metadata.Name, name)
	case n.Metadata.ResourceVersion == "":
		return n, fmt.Errorf("%s without metadata.resourceVersion", kind)
	}
	return n, nil
}
