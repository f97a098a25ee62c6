package ciliumnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
)

const (
	// listPageSize is the limit of one page of the list, as client-go's pager uses: 5,000
	// CiliumNodes are 10 requests of a few MiB each.
	listPageSize = 500
	// maxListRestarts bounds how often a list starts over because its continue token
	// expired (410) before the list counts as failed.
	maxListRestarts = 3
	// maxProblemsLogged bounds the problem nodes named in the log per list.
	maxProblemsLogged = 20
)

// PeerSource list-watches every CiliumNode and reports snapshots of what it keeps of them
// (Peers). Create it with NewPeers and call Run.
type PeerSource struct {
	cfg     Config
	listURL string // of the first page; the next ones add &continue=
	client  *http.Client
	log     *slog.Logger
	lw      *listWatch // its reader is set by each Run

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
	Problems     int       // CiliumNodes in the last snapshot that are not all they say (Peers.Problems)
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
	lw, server, err := newListWatch(cfg)
	if err != nil {
		return nil, err
	}
	s := &PeerSource{cfg: lw.cfg, listURL: server + resource + "?limit=" + strconv.Itoa(listPageSize), client: lw.client, log: lw.cfg.Logger, lw: lw}
	s.lw.watchURL = server + resource + "?watch=1&allowWatchBookmarks=true&resourceVersion="
	s.lw.what, s.lw.kept, s.lw.again, s.lw.count = "CiliumNodes", "the last nodes", "listing again", s.count
	return s, nil
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

// peerRun is one Run's protocol state, owned by its goroutine: the list-watch loop's
// reader.
type peerRun struct {
	s      *PeerSource
	report func(Peers)
	peers  Peers // the last snapshot
	synced bool  // a list has been taken in this Run
}

// Run lists, then watches, every CiliumNode until ctx ends. It calls report (from Run's
// goroutine only) with the complete snapshot after the first good list of each Run, then
// after every list or event that changes a node's name, addresses, mode or problem;
// nothing is reported before the first good list, and failures never report. A burst of
// changes is a burst of calls: report should return promptly (the watch waits for it) and
// keep only the latest snapshot. Run returns nil when ctx ends, and an error only when
// misused (nil report, or already running).
func (s *PeerSource) Run(ctx context.Context, report func(Peers)) error {
	return s.lw.start(ctx, report == nil, func() {
		s.mu.Lock()
		s.stats.Synced = false
		s.mu.Unlock()
		s.lw.r = &peerRun{s: s, report: report}
	})
}

// read lists every CiliumNode and takes the list as the new snapshot.
func (r *peerRun) read(ctx context.Context) (string, error) {
	l, err := r.s.list(ctx)
	if err != nil {
		return "", err
	}
	r.listed(l)
	return l.rv, nil
}

// listed takes a complete list as the new snapshot, and reports it if it is the first of
// the Run or differs from the last one. A node skipped by the list keeps its entry of the
// last snapshot, marked.
func (r *peerRun) listed(l list) {
	next := peersOf(l.nodes)
	for _, sk := range l.skipped {
		if _, ok := next.find(sk.Name); ok {
			continue // a server bug: the name twice
		}
		next = r.peers.keep(next, sk.Name, sk.Problem)
	}
	logged := 0
	for _, bad := range l.invalid {
		if old, ok := r.peers.Get(bad.peer.Name); !r.synced || !ok || !old.Equal(bad.peer) {
			if logged++; logged <= maxProblemsLogged {
				r.s.logInvalid(bad.peer.Name, bad.addrs)
			}
		}
	}
	for _, p := range next.Problems() {
		if old, ok := r.peers.problem(p.Name); !r.synced || !ok || old != p.Problem {
			if logged++; logged <= maxProblemsLogged {
				r.s.logProblem(next, p)
			}
		}
	}
	changed := !r.synced || !r.peers.Equal(next)
	r.peers, r.synced = next, true
	r.s.log.Debug("ciliumnode: listed CiliumNodes", "nodes", next.Len(), "encrypting", next.EncryptingCount(),
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

// keep adds to next the node called name, skipped for problem: its entry in ps (the last
// snapshot), marked, or a skipped entry.
func (ps Peers) keep(next Peers, name, problem string) Peers {
	if old, ok := ps.Get(name); ok {
		old.Problem = problem
		return next.with(old)
	}
	return next.withSkipped(name, problem)
}

// problem returns the Problem of the node called name, among the entries and the skipped.
func (ps Peers) problem(name string) (string, bool) {
	if p, ok := ps.Get(name); ok {
		return p.Problem, true
	}
	if i, ok := find(ps.skipped, name); ok {
		return ps.skipped[i].Problem, true
	}
	return "", false
}

// event applies one ADDED, MODIFIED or DELETED event, and reports the snapshot if it
// changed. An object that did not decode is skipped: the node's last entry stands, marked.
func (r *peerRun) event(typ string, o *wireObject, decodeErr error) error {
	if err := o.checkKind(true); err != nil {
		return err
	}
	name := o.Metadata.Name
	if name == "" {
		return fmt.Errorf("%s without metadata.name", kind)
	}
	next := r.peers
	switch {
	case typ == "DELETED":
		next = next.without(name)
	case decodeErr != nil:
		next = next.withSkipped(name, skipProblem(decodeErr))
	default:
		p, invalid, err := o.peer()
		if err != nil {
			return err
		}
		if old, ok := r.peers.Get(name); (!ok || !old.Equal(p)) && len(invalid) > 0 {
			r.s.logInvalid(name, invalid)
		}
		next = next.with(p)
	}
	r.logLeftOut(name, next)
	changed := !next.Equal(r.peers)
	r.peers = next
	r.s.mu.Lock()
	r.s.stats.Events++
	r.s.mu.Unlock()
	r.s.goodRead(r.peers, changed)
	if changed {
		r.report(r.peers)
	}
	return nil
}

// logLeftOut says what next, after an event of the node called name, leaves out of it that
// the last snapshot did not.
func (r *peerRun) logLeftOut(name string, next Peers) {
	old, _ := r.peers.problem(name)
	if now, ok := next.problem(name); ok && now != "" && now != old {
		r.s.logProblem(next, Peer{Name: name, Problem: now})
	}
	if next.dropped > r.peers.dropped {
		r.s.log.Warn(fmt.Sprintf("ciliumnode: CiliumNode %s: more CiliumNodes than %d MiB holds; left out: the peer set is incomplete", name, MaxPeerBytes>>20))
	}
}

// skipProblem is the Problem of a node whose object was skipped for err.
func skipProblem(err error) string {
	return "skipped: " + kubeapi.OneLine(err.Error())
}

// goodRead records a complete list or an applied event.
func (s *PeerSource) goodRead(ps Peers, reported bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.LastGoodRead = time.Now()
	if reported {
		s.stats.Reports++
		s.stats.Peers, s.stats.Encrypting = ps.Len(), ps.EncryptingCount()
		s.stats.Problems = len(ps.Problems())
	}
}

// logInvalid says once per change of a node which of its InternalIPs were left out, and
// why, each as sent (quoted, cut at 64 characters).
func (s *PeerSource) logInvalid(name string, addrs []invalidAddr) {
	parts := make([]string, len(addrs))
	for i, a := range addrs {
		parts[i] = fmt.Sprintf("%.64q (%s)", a.ip, a.reason)
	}
	s.log.Warn("ciliumnode: CiliumNode " + name + ": InternalIP " + strings.Join(parts, ", ") +
		" is not a peer's address; left out")
}

// logProblem says what was left out of a node, and what stands instead.
func (s *PeerSource) logProblem(ps Peers, p Peer) {
	stands := "left out (no good read of it yet)"
	if _, ok := ps.Get(p.Name); ok {
		stands = "its last good entry stands"
		if !strings.HasPrefix(p.Problem, "skipped") {
			stands = "the first ones are used"
		}
	}
	s.log.Warn("ciliumnode: CiliumNode " + p.Name + ": " + p.Problem + "; " + stands + ": the peer set is incomplete")
}

// list is the outcome of a complete list.
type list struct {
	nodes   []Peer
	skipped []Peer // Name and Problem: the items that did not decode
	rv      string
	pages   int
	bytes   int // the cost of nodes and skipped
	invalid []invalidAddrs
}

type invalidAddrs struct {
	peer  Peer
	addrs []invalidAddr
}

// errGone marks a 410 answer to a list page: its continue token expired.
var errGone = errors.New("expired")

// list reads every CiliumNode, page by page. When a continue token expires the list starts
// over, at most maxListRestarts times. A list of more than MaxListPages pages, of items
// beyond MaxPeerBytes, or of more than maxEmptyPages empty pages in a row fails; each empty
// page is followed by a wait of the back-off.
func (s *PeerSource) list(ctx context.Context) (list, error) {
	var (
		l     list
		cont  string
		empty int // empty pages in a row
	)
	for restarts := 0; ; {
		if l.pages >= MaxListPages {
			return list{}, fmt.Errorf("ciliumnode: list CiliumNodes: more than %d pages (the server answers every page with a continue token); keeping the last nodes", MaxListPages)
		}
		had := len(l.nodes) + len(l.skipped)
		meta, o, err := s.listPage(ctx, cont, &l)
		if ctx.Err() != nil {
			o = outcomeNone
		}
		s.count(o)
		l.pages++
		if errors.Is(err, errGone) && cont != "" && restarts < maxListRestarts {
			s.log.Info(fmt.Sprintf("ciliumnode: list CiliumNodes: page %d: %v; starting over", l.pages, err))
			restarts++
			l.nodes, l.skipped, l.invalid, l.bytes, cont = l.nodes[:0], nil, nil, 0, ""
			continue
		}
		if err != nil {
			return list{}, fmt.Errorf("ciliumnode: list CiliumNodes (page %d): %w", l.pages, err)
		}
		if meta.Continue == "" {
			l.rv = meta.ResourceVersion
			return l, nil
		}
		cont = meta.Continue
		if len(l.nodes)+len(l.skipped) > had {
			empty = 0
			continue
		}
		if empty++; empty > maxEmptyPages {
			return list{}, fmt.Errorf("ciliumnode: list CiliumNodes: %d empty pages in a row, each with a continue token; keeping the last nodes", empty)
		}
		if !kubeapi.Sleep(ctx, kubeapi.NextBackOff(s.cfg.Backoff)) {
			return list{}, ctx.Err()
		}
	}
}

// errTooMany fails a list of items beyond MaxPeerBytes.
var errTooMany = fmt.Errorf("more CiliumNodes than %d MiB holds; keeping the last nodes", MaxPeerBytes>>20)

// listPage reads one page of the list, appending its nodes to l.
func (s *PeerSource) listPage(ctx context.Context, cont string, l *list) (listMeta, outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	u := s.listURL
	if cont != "" {
		u += "&continue=" + url.QueryEscape(cont)
	}
	resp, o, err := do(ctx, s.client, s.cfg.TokenFile, u)
	if o == outcomeGone {
		err = fmt.Errorf("%w: %w", errGone, err)
	}
	if err != nil {
		return listMeta{}, o, err
	}
	defer resp.Body.Close()
	body := &objectLimit{r: resp.Body}
	meta, err := decodeList(body, func(o *wireObject, decodeErr error) error {
		if l.bytes > MaxPeerBytes {
			return errTooMany
		}
		if err := o.checkKind(true); err != nil {
			return err
		}
		if decodeErr != nil {
			if o.Metadata.Name == "" {
				return decodeErr // nothing to name it by: the list fails
			}
			l.skipped = append(l.skipped, Peer{Name: o.Metadata.Name, Problem: skipProblem(decodeErr)})
			l.bytes += l.skipped[len(l.skipped)-1].cost()
			return nil
		}
		p, bad, err := o.peer()
		if err != nil {
			return err
		}
		l.nodes = append(l.nodes, p)
		l.bytes += p.cost()
		if len(bad) > 0 {
			l.invalid = append(l.invalid, invalidAddrs{p, bad})
		}
		return nil
	})
	if err == nil {
		err = context.Cause(ctx) // a body cut by the timeout may read as complete
	}
	switch {
	case err == nil:
		return meta, outcomeOK, nil
	case errors.Is(err, errTooMany):
		return listMeta{}, outcomeOK, errTooMany // the page was fine; the list is too long
	case body.err != nil && body.err != io.EOF && !errors.Is(body.err, errObjectTooLarge), errors.Is(err, io.ErrUnexpectedEOF), ctx.Err() != nil:
		return listMeta{}, outcomeNetworkError, fmt.Errorf("read body: %w", err)
	}
	return listMeta{}, outcomeDecodeError, err
}
