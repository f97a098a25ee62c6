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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
)

const (
	// listPageSize is the limit of one page of the list, as client-go's pager uses: 5,000
	// CiliumNodes are 10 requests of a few MiB each.
	listPageSize = 500
	// maxListRestarts bounds how often a list starts over because its continue token
	// expired (410) before the list counts as failed.
	maxListRestarts = 3
)

// PeerSource list-watches every CiliumNode and reports snapshots of what it keeps of them
// (Peers). Create it with NewPeers and call Run.
type PeerSource struct {
	cfg       Config
	listURL   string // of the first page; the next ones add &continue=
	watchURL  string // without the resourceVersion value, which is appended
	client    *http.Client
	ownClient bool
	log       *slog.Logger
	running   atomic.Bool

	mu    sync.Mutex
	stats PeerStats // but the request counters
	req   Stats     // the request counters; its other fields are unused
}

// PeerStats counts the requests a PeerSource made, by outcome, and describes what it holds.
// Each page of a list counts once as OK, NotFound, HTTPError, DecodeError, NetworkError or
// Gone. A watch counts once when it ends: WatchRestart when the server ended it cleanly or it
// went silent (it is resumed), Gone on 410 (the nodes are listed again), or as an error.
// Requests cut short because Run's context ended are not counted.
type PeerStats struct {
	OK           uint64 // pages of a list
	NotFound     uint64 // 404: the CiliumNode CRD is not installed
	HTTPError    uint64 // other non-2xx answers, and ERROR events other than 410
	DecodeError  uint64 // garbage JSON, a wrong kind, an object that does not decode
	NetworkError uint64 // connection refused or dropped, TLS verification, timeouts
	WatchRestart uint64
	Gone         uint64 // 410: resourceVersion or continue token too old

	Lists   uint64 // complete lists (every page) that were taken as the new snapshot
	Events  uint64 // ADDED, MODIFIED and DELETED events applied (changing anything or not)
	Reports uint64 // snapshots reported: after the first list, and after each change

	LastGoodRead time.Time // of the last complete list or applied event
	Synced       bool      // a complete list has been read in the current Run
	Peers        int       // nodes in the last snapshot
	Encrypting   int       // of which encrypting
}

// Requests returns the request counters keyed by outcome label, the same labels as
// Stats.Requests: ok, not_found, http_error, decode_error, network_error, watch_restart,
// gone_410.
func (st PeerStats) Requests() map[string]uint64 {
	return Stats{OK: st.OK, NotFound: st.NotFound, HTTPError: st.HTTPError, DecodeError: st.DecodeError,
		NetworkError: st.NetworkError, WatchRestart: st.WatchRestart, Gone: st.Gone}.Requests()
}

// NewPeers validates cfg (all but NodeName and Resync, which it ignores), fills in its
// defaults and, unless cfg.HTTPClient is set, builds an HTTPS client that trusts the
// certificates in cfg.CAFile.
func NewPeers(cfg Config) (*PeerSource, error) {
	server, err := settle(&cfg)
	if err != nil {
		return nil, err
	}
	client, own, err := httpClient(cfg)
	if err != nil {
		return nil, err
	}
	return &PeerSource{
		cfg:       cfg,
		listURL:   server + resource + "?limit=" + strconv.Itoa(listPageSize),
		watchURL:  server + resource + "?watch=1&allowWatchBookmarks=true&resourceVersion=",
		client:    client,
		ownClient: own,
		log:       cfg.Logger,
	}, nil
}

// Stats returns the request counters and a summary of the last snapshot.
func (s *PeerSource) Stats() PeerStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, r := s.stats, s.req
	st.OK, st.NotFound, st.HTTPError, st.DecodeError, st.NetworkError, st.WatchRestart, st.Gone =
		r.OK, r.NotFound, r.HTTPError, r.DecodeError, r.NetworkError, r.WatchRestart, r.Gone
	return st
}

func (s *PeerSource) count(o outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.req.add(o)
}

// peerRun is one Run's protocol state, owned by its goroutine.
type peerRun struct {
	s      *PeerSource
	report func(Peers)
	peers  Peers  // the last snapshot
	synced bool   // a list has been taken in this Run
	rv     string // where the next watch starts; "" means list first
}

// Run lists, then watches, every CiliumNode until ctx ends. It calls report (from Run's
// goroutine only) with the complete snapshot after the first good list of each Run, then
// after every list or event that changes a node's name, addresses or mode; nothing is
// reported before the first good list, and failures never report. A burst of changes is a
// burst of calls: report should return promptly (the watch waits for it) and keep only the
// latest snapshot. Run returns nil when ctx ends, and an error only when misused (nil
// report, or already running).
func (s *PeerSource) Run(ctx context.Context, report func(Peers)) error {
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
	s.mu.Lock()
	s.stats.Synced = false
	s.mu.Unlock()
	b := s.cfg.Backoff
	b.Reset()

	r := &peerRun{s: s, report: report}
	// failing is set while watches fail without delivering an event, so that the lists in
	// between do not reset the back-off and a broken watch is not retried hot.
	failing := false
	for ctx.Err() == nil {
		if r.rv == "" {
			l, err := s.list(ctx)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				d := nextBackOff(b)
				s.log.Warn(err.Error(), "retry_in_s", d.Seconds())
				if !sleep(ctx, d) {
					break
				}
				continue
			}
			if !failing {
				b.Reset()
			}
			r.listed(l)
		}

		end := s.watch(ctx, r, b)
		if end.progress {
			failing = false
		}
		retry := false
		switch end.kind {
		case endCanceled:
			return nil
		case endGone:
			s.log.Info(end.err.Error() + "; listing again")
			r.rv = ""
			retry = !end.progress
		case endClosed:
			if end.err != nil {
				s.log.Warn(end.err.Error()+"; restarting it", "resource_version", r.rv)
			} else {
				s.log.Debug("ciliumnode: watch ended; resuming", "resource_version", r.rv)
			}
			retry = !end.progress
		case endFailed, endCorrupt:
			d := nextBackOff(b)
			if end.kind == endCorrupt {
				s.log.Warn(end.err.Error()+"; keeping the last nodes and listing again", "retry_in_s", d.Seconds())
				r.rv = ""
			} else {
				s.log.Warn(end.err.Error(), "retry_in_s", d.Seconds())
			}
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

// listed takes a complete list as the new snapshot, and reports it if it is the first of
// the Run or differs from the last one.
func (r *peerRun) listed(l list) {
	for _, bad := range l.invalid {
		if old, ok := r.peers.Get(bad.peer.Name); !r.synced || !ok || !old.Equal(bad.peer) {
			r.s.logInvalid(bad.peer.Name, bad.addrs)
		}
	}
	changed := !r.synced || !r.peers.Equal(l.peers)
	r.peers, r.synced, r.rv = l.peers, true, l.rv
	r.s.log.Debug("ciliumnode: listed CiliumNodes", "nodes", l.peers.Len(), "encrypting", l.peers.EncryptingCount(),
		"pages", l.pages, "resource_version", l.rv, "changed", changed)
	r.s.mu.Lock()
	r.s.stats.Lists++
	r.s.stats.Synced = true
	r.s.mu.Unlock()
	r.s.goodRead(r.peers, changed)
	if changed {
		r.report(r.peers)
	}
}

// event applies one ADDED, MODIFIED or DELETED event, and reports the snapshot if it
// changed.
func (r *peerRun) event(typ string, p Peer, invalid []string) {
	old, had := r.peers.Get(p.Name)
	changed := false
	switch {
	case typ == "DELETED":
		if had {
			r.peers, changed = r.peers.without(p.Name), true
		}
	case !had || !old.Equal(p):
		if len(invalid) > 0 {
			r.s.logInvalid(p.Name, invalid)
		}
		r.peers, changed = r.peers.with(p), true
	}
	r.s.mu.Lock()
	r.s.stats.Events++
	r.s.mu.Unlock()
	r.s.goodRead(r.peers, changed)
	if changed {
		r.report(r.peers)
	}
}

// goodRead records a complete list or an applied event.
func (s *PeerSource) goodRead(ps Peers, reported bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.LastGoodRead = time.Now()
	if reported {
		s.stats.Reports++
		s.stats.Peers, s.stats.Encrypting = ps.Len(), ps.EncryptingCount()
	}
}

// logInvalid says once per change of a node which of its InternalIPs were left out.
func (s *PeerSource) logInvalid(name string, addrs []string) {
	for i, a := range addrs {
		addrs[i] = strconv.Quote(oneLine(a))
	}
	s.log.Warn("ciliumnode: CiliumNode " + name + ": InternalIP " + strings.Join(addrs, ", ") +
		" is not a unicast IP address; left out")
}

// list is the outcome of a complete list.
type list struct {
	peers   Peers
	rv      string
	pages   int
	invalid []invalidAddrs
}

type invalidAddrs struct {
	peer  Peer
	addrs []string
}

// errGone marks a 410 answer to a list page: its continue token expired.
var errGone = errors.New("expired")

// list reads every CiliumNode, page by page. When a continue token expires the list starts
// over, at most maxListRestarts times.
func (s *PeerSource) list(ctx context.Context) (list, error) {
	var (
		l     list
		nodes []Peer
		cont  string
	)
	for restarts := 0; ; {
		meta, o, err := s.listPage(ctx, cont, &nodes, &l.invalid)
		if ctx.Err() != nil {
			o = outcomeNone
		}
		s.count(o)
		l.pages++
		if errors.Is(err, errGone) && cont != "" && restarts < maxListRestarts {
			s.log.Info(fmt.Sprintf("ciliumnode: list CiliumNodes: page %d: %v; starting over", l.pages, err))
			restarts++
			nodes, l.invalid, cont = nodes[:0], nil, ""
			continue
		}
		if err != nil {
			return list{}, fmt.Errorf("ciliumnode: list CiliumNodes (page %d): %w", l.pages, err)
		}
		if meta.Continue == "" {
			l.peers, l.rv = peersOf(nodes), meta.ResourceVersion
			return l, nil
		}
		cont = meta.Continue
		if n := meta.RemainingItemCount; n != nil && *n > 0 && *n < 1<<20 && cap(nodes)-len(nodes) < int(*n) {
			nodes = append(make([]Peer, 0, len(nodes)+int(*n)), nodes...)
		}
	}
}

// listMeta is the metadata of a list.
type listMeta struct {
	ResourceVersion    string `json:"resourceVersion"`
	Continue           string `json:"continue"`
	RemainingItemCount *int64 `json:"remainingItemCount"`
}

// listPage reads one page of the list, appending its nodes.
func (s *PeerSource) listPage(ctx context.Context, cont string, nodes *[]Peer, invalid *[]invalidAddrs) (listMeta, outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	u := s.listURL
	if cont != "" {
		u += "&continue=" + url.QueryEscape(cont)
	}
	req, err := newRequest(ctx, s.cfg.TokenFile, u)
	if err != nil {
		return listMeta{}, outcomeNone, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return listMeta{}, outcomeNetworkError, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxErrBody))
		if err != nil {
			return listMeta{}, outcomeNetworkError, fmt.Errorf("%s: read body: %w", resp.Status, err)
		}
		switch resp.StatusCode {
		case http.StatusNotFound:
			return listMeta{}, outcomeNotFound, statusError(resp, body)
		case http.StatusGone:
			return listMeta{}, outcomeGone, fmt.Errorf("%w: %w", errGone, statusError(resp, body))
		}
		return listMeta{}, outcomeHTTPError, statusError(resp, body)
	}
	body := &objectLimit{r: resp.Body}
	meta, err := decodeList(body, func(o *wireObject) error {
		p, bad, err := o.peer()
		if err != nil {
			return err
		}
		*nodes = append(*nodes, p)
		if len(bad) > 0 {
			*invalid = append(*invalid, invalidAddrs{p, bad})
		}
		return nil
	})
	if err == nil {
		err = context.Cause(ctx) // a body cut by the timeout may read as complete
	}
	switch {
	case err == nil:
		return meta, outcomeOK, nil
	case body.err != nil && body.err != io.EOF && !errors.Is(body.err, errObjectTooLarge), errors.Is(err, io.ErrUnexpectedEOF), ctx.Err() != nil:
		return listMeta{}, outcomeNetworkError, fmt.Errorf("read body: %w", err)
	}
	return listMeta{}, outcomeDecodeError, err
}

// decodeList decodes a CiliumNodeList from r as it streams in, handing each item to visit
// without keeping it; only the list's metadata is returned.
func decodeList(r *objectLimit, visit func(*wireObject) error) (listMeta, error) {
	var (
		meta              listMeta
		gotKind, gotAPIV  string
		seenMeta, inItems bool
	)
	dec := json.NewDecoder(r)
	if err := wantDelim(dec, '{'); err != nil {
		return meta, fmt.Errorf("decode %s: %w", listKind, err)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return meta, fmt.Errorf("decode %s: %w", listKind, err)
		}
		key, _ := t.(string)
		switch key {
		case "kind":
			err = dec.Decode(&gotKind)
		case "apiVersion":
			err = dec.Decode(&gotAPIV)
		case "metadata":
			err, seenMeta = dec.Decode(&meta), true
		case "items":
			inItems = true
			err = decodeItems(dec, r, visit)
			inItems = false
		default:
			var skip json.RawMessage
			err = dec.Decode(&skip)
		}
		if err != nil {
			if inItems || errors.Is(err, errObjectTooLarge) {
				return meta, err
			}
			return meta, fmt.Errorf("decode %s: %s: %w", listKind, key, err)
		}
	}
	if err := wantDelim(dec, '}'); err != nil {
		return meta, fmt.Errorf("decode %s: %w", listKind, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return meta, fmt.Errorf("decode %s: data after the list", listKind)
	}
	switch {
	case gotAPIV != apiVersion || gotKind != listKind:
		return meta, fmt.Errorf("got %q %q, want %s %s", gotAPIV, gotKind, apiVersion, listKind)
	case !seenMeta || meta.ResourceVersion == "":
		return meta, fmt.Errorf("%s without metadata.resourceVersion", listKind)
	}
	return meta, nil
}

// decodeItems decodes the items array (or null) of a list, one object at a time.
func decodeItems(dec *json.Decoder, r *objectLimit, visit func(*wireObject) error) error {
	t, err := dec.Token()
	if err != nil {
		return fmt.Errorf("decode %s items: %w", listKind, err)
	}
	if t == nil {
		return nil
	}
	if d, ok := t.(json.Delim); !ok || d != '[' {
		return fmt.Errorf("decode %s items: got %v, want an array", listKind, t)
	}
	for i := 0; dec.More(); i++ {
		var o wireObject
		if err := decodeBounded(dec, r, &o); err != nil {
			return fmt.Errorf("decode %s item %d: %w", kind, i, err)
		}
		if err := visit(&o); err != nil {
			return fmt.Errorf("%s item %d (%q): %w", kind, i, o.Metadata.Name, err)
		}
	}
	return wantDelim(dec, ']')
}

func wantDelim(dec *json.Decoder, want json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != want {
		return fmt.Errorf("got %v, want %v", t, want)
	}
	return nil
}

// errObjectTooLarge marks an object (or event) larger than maxBody.
var errObjectTooLarge = fmt.Errorf("an object larger than %d bytes", maxBody)

// decodeBounded decodes the next value of dec into v and fails with errObjectTooLarge if it
// took more than maxBody bytes of input. It resets r, dec's source, for the next value.
func decodeBounded(dec *json.Decoder, r *objectLimit, v any) error {
	start := dec.InputOffset()
	err := dec.Decode(v)
	r.reset()
	if err == nil && dec.InputOffset()-start > maxBody {
		return errObjectTooLarge
	}
	return err
}

// maxReadAhead bounds what a decoder may read for one value: the value itself (at most
// maxBody, checked exactly by decodeBounded) and its read-ahead, at most its buffer, which
// grows to about twice the largest value. It keeps an endless value from filling memory.
const maxReadAhead = 4 * maxBody

// objectLimit fails a read once more than maxReadAhead bytes have been read since the last
// reset (once per value). It keeps the underlying reader's last error to tell a broken
// connection from garbage.
type objectLimit struct {
	r   io.Reader
	n   int
	err error
}

func (l *objectLimit) Read(p []byte) (int, error) {
	if l.n > maxReadAhead {
		l.err = errObjectTooLarge
		return 0, l.err
	}
	n, err := l.r.Read(p)
	l.n += n
	if err != nil {
		l.err = err
	}
	return n, err
}

func (l *objectLimit) reset() { l.n = 0 }

// watch watches every CiliumNode from r.rv until ctx ends or the watch ends, applying events
// as they arrive.
func (s *PeerSource) watch(ctx context.Context, r *peerRun, b backoff.BackOff) watchEnd {
	rv := r.rv
	end := watchEnd{rv: rv}
	defer func() { r.rv = end.rv }()
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	silence := time.AfterFunc(s.cfg.WatchTimeout, func() { cancel(errSilent) })
	defer silence.Stop()

	fail := func(kind endKind, o outcome, err error) watchEnd {
		switch {
		case ctx.Err() != nil:
			end.kind = endCanceled
		case context.Cause(wctx) == errSilent:
			s.count(outcomeWatchRestart)
			end.kind = endClosed
			end.err = fmt.Errorf("ciliumnode: watch CiliumNodes: no data for %v", s.cfg.WatchTimeout)
		default:
			s.count(o)
			end.kind = kind
			if o == outcomeGone {
				end.kind = endGone
			}
			end.err = fmt.Errorf("ciliumnode: watch CiliumNodes from resourceVersion %s: %w", rv, err)
		}
		return end
	}

	req, err := newRequest(wctx, s.cfg.TokenFile, s.watchURL+url.QueryEscape(rv))
	if err != nil {
		return fail(endFailed, outcomeNone, err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fail(endFailed, outcomeNetworkError, err)
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
		return fail(endFailed, o, statusError(resp, body))
	}

	lim := &objectLimit{r: resp.Body}
	body := &activityReader{r: lim, timer: silence, timeout: s.cfg.WatchTimeout}
	dec := json.NewDecoder(body)
	for {
		var ev struct {
			Type   string     `json:"type"`
			Object wireObject `json:"object"`
		}
		err := decodeBounded(dec, lim, &ev)
		var typeErr *json.UnmarshalTypeError
		switch {
		case err == nil:
		case wctx.Err() != nil:
			// Canceled: by Run's context or the silence timer. Over HTTP/1.1 the cut
			// body may even read as a clean io.EOF.
			return fail(endFailed, outcomeNone, err)
		case err == io.EOF:
			s.count(outcomeWatchRestart)
			end.kind = endClosed
			return end
		case errors.As(err, &typeErr) && ev.Type != "ERROR":
			return fail(endCorrupt, outcomeDecodeError, fmt.Errorf("%s event: decode %s: %w", oneLine(ev.Type), kind, err))
		case errors.Is(err, errObjectTooLarge), errors.Is(body.err, errObjectTooLarge):
			return fail(endFailed, outcomeDecodeError, fmt.Errorf("decode event: %w", errObjectTooLarge))
		case body.err != nil && body.err != io.EOF, errors.Is(err, io.ErrUnexpectedEOF):
			return fail(endFailed, outcomeNetworkError, err)
		default:
			return fail(endFailed, outcomeDecodeError, fmt.Errorf("decode event: %w", err))
		}
		o := &ev.Object
		switch ev.Type {
		case "ADDED", "MODIFIED", "DELETED":
			p, invalid, err := o.peer()
			if err == nil && o.Metadata.ResourceVersion == "" {
				err = fmt.Errorf("%s without metadata.resourceVersion", kind)
			}
			if err != nil {
				return fail(endCorrupt, outcomeDecodeError, fmt.Errorf("%s event: %w", ev.Type, err))
			}
			end.rv, end.progress = o.Metadata.ResourceVersion, true
			b.Reset()
			r.event(ev.Type, p, invalid)
		case "BOOKMARK":
			lax := o.APIVersion == "" && o.Kind == ""
			switch {
			case !lax && (o.APIVersion != apiVersion || o.Kind != kind):
				return fail(endCorrupt, outcomeDecodeError, fmt.Errorf("BOOKMARK event: got %q %q, want %s %s", o.APIVersion, o.Kind, apiVersion, kind))
			case o.Metadata.ResourceVersion == "":
				return fail(endCorrupt, outcomeDecodeError, fmt.Errorf("BOOKMARK event: %s without metadata.resourceVersion", kind))
			}
			end.rv, end.progress = o.Metadata.ResourceVersion, true
			b.Reset()
		case "ERROR":
			if o.Kind != "Status" {
				return fail(endFailed, outcomeDecodeError, errors.New("ERROR event without a Status"))
			}
			oc := outcomeHTTPError
			if o.Code == http.StatusGone {
				oc = outcomeGone
			}
			return fail(endFailed, oc, fmt.Errorf("ERROR event: %d %s: %s", o.Code, o.Reason, oneLine(o.Message)))
		default:
			return fail(endFailed, outcomeDecodeError, fmt.Errorf("unknown event type %q", oneLine(ev.Type)))
		}
	}
}
