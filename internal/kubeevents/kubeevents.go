package kubeevents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
)

// The types of an Event.
const (
	Normal  = "Normal"
	Warning = "Warning"
)

// Defaults of a Config, after client-go's events broadcaster and
// EventRecorder: a series ends 6 minutes after its last occurrence; an
// Event is written at most once per 30 s; the bucket allows a burst of 10
// writes and then one per 10 s (client-go: 25, then one per 5 min, per
// object; here every Event is about one object).
const (
	DefaultController     = "marksplit.io/agent"
	DefaultNamespace      = "default"
	DefaultMaxPending     = 64
	DefaultSeriesWindow   = 6 * time.Minute
	DefaultMinInterval    = 30 * time.Second
	DefaultBurst          = 10
	DefaultRefill         = 10 * time.Second
	DefaultRequestTimeout = 10 * time.Second
	// DefaultMaxAge drops an Event the API server has not taken for this
	// long: the API server's own TTL of Events (--event-ttl) is 1 h.
	DefaultMaxAge = time.Hour

	retryMin = time.Second
	retryMax = 2 * time.Minute

	// maxAnswer bounds what is read of an answer: the agent needs none of it.
	maxAnswer = 64 << 10
	// maxNote is the API server's limit of a note, in bytes.
	maxNote = 1024
	// maxInstance is the API server's limit of reportingInstance.
	maxInstance = 128
	// microTime is metav1.MicroTime's text form.
	microTime = "2006-01-02T15:04:05.000000Z07:00"
)

// Clock is the time the Recorder reads and waits on.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Config configures a Recorder. Client and NodeName are required.
type Config struct {
	// Client sends the requests (its HTTP client must not follow redirects;
	// see kubeapi.NewHTTPClient).
	Client *kubeapi.Client
	// NodeName is the Node the Events are about (regarding.name). Its uid in
	// regarding is the name too, as the kubelet's: `kubectl describe node`
	// shows the events whose involvedObject.uid is the node's name or its
	// UID, so the Node need not be read.
	NodeName string
	// Instance is reportingInstance; default NodeName (cut to 128 bytes).
	Instance string
	// Controller is reportingController; default DefaultController.
	Controller string
	// Namespace holds the Events; default "default", as the kubelet's Events
	// about Nodes.
	Namespace string
	// MaxPending bounds the Events held (written or waiting); a new one
	// beyond is dropped. Default DefaultMaxPending.
	MaxPending int
	// SeriesWindow: a repeat within it of the last occurrence joins the
	// series; after it a new Event starts. Default 6 min.
	SeriesWindow time.Duration
	// MinInterval spaces the writes of one Event. Default 30 s.
	MinInterval time.Duration
	// Burst and Refill are the token bucket of all writes. Defaults 10 and
	// 10 s.
	Burst  int
	Refill time.Duration
	// RequestTimeout bounds a request. Default 10 s.
	RequestTimeout time.Duration
	// MaxAge drops an Event not written for this long. Default 1 h.
	MaxAge time.Duration
	// Clock defaults to the real one.
	Clock Clock
	// Logger receives the first failure and the first refusal of a streak;
	// default discard.
	Logger *slog.Logger
}

// Stats counts what a Recorder did.
type Stats struct {
	Recorded uint64 // calls of Record taken (joined to an Event or a new one)
	Created  uint64 // Events created
	Patched  uint64 // series updates written
	Failed   uint64 // requests that failed (no answer, 429, 5xx): retried
	Refused  uint64 // Events the API server refused (4xx): dropped
	Dropped  uint64 // Events dropped: refused, no room, or too old to write
}

// key is what makes two records the same Event: the API server keeps these
// fields of an Event immutable (and its note), so a repeat can change only
// its series. group is the note, or what the caller groups by instead.
type key struct{ typ, reason, action, group string }

// entry is one Event: what the API server has of it and what is pending.
type entry struct {
	name        string
	note        string    // of the first occurrence
	first, last time.Time // occurrences
	count       int32
	written     int32     // the count the API server has; 0: not created
	next        time.Time // not written again before
}

func (e *entry) dirty() bool { return e.count != e.written }

// Recorder records Events about one Node. Create it with New.
type Recorder struct {
	cfg   Config
	clock Clock
	log   *slog.Logger
	wake  chan struct{}

	mu      sync.Mutex // guards the fields below
	entries map[key]*entry
	tokens  float64
	tokenAt time.Time
	lastID  int64 // the last name's nanoseconds, kept increasing

	// Used by Run's goroutine only.
	retry      time.Duration // the back-off after failures; 0 after a success
	blocked    time.Time     // no request before
	failing    bool          // a failure was logged; the next success is
	refusedLog bool          // a refusal was logged

	recorded, created, patched, failed, refused, dropped atomic.Uint64
}

var (
	reasonRE = regexp.MustCompile(`^[A-Z][A-Za-z0-9]{0,127}$`)
	// nameRE is a DNS subdomain, what a Node (and an Event) is named.
	nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// New checks cfg and returns its Recorder.
func New(cfg Config) (*Recorder, error) {
	if cfg.Client == nil {
		return nil, errors.New("kubeevents: no API client")
	}
	if len(cfg.NodeName) > 253 || !nameRE.MatchString(cfg.NodeName) {
		return nil, fmt.Errorf("kubeevents: node name %.300q is not a DNS subdomain", cfg.NodeName)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.SeriesWindow, DefaultSeriesWindow)
	def(&cfg.MinInterval, DefaultMinInterval)
	def(&cfg.Refill, DefaultRefill)
	def(&cfg.RequestTimeout, DefaultRequestTimeout)
	def(&cfg.MaxAge, DefaultMaxAge)
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Controller == "" {
		cfg.Controller = DefaultController
	}
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Instance == "" {
		cfg.Instance = cfg.NodeName
	}
	cfg.Instance = cut(cfg.Instance, maxInstance)
	r := &Recorder{cfg: cfg, clock: cfg.Clock, log: cfg.Logger, wake: make(chan struct{}, 1), entries: make(map[key]*entry)}
	if r.clock == nil {
		r.clock = realClock{}
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.tokens, r.tokenAt = float64(cfg.Burst), r.clock.Now()
	return r, nil
}

// Record records an occurrence of an Event of type typ (Normal or
// Warning): reason is CamelCase, action what the agent did or failed to
// do ("Repair"), note a human-readable line (made one line of at most 300
// bytes; see kubeapi.OneLine). Records with the same type, reason, action
// and note are one Event, with a series. Record never blocks; an invalid
// record is dropped.
func (r *Recorder) Record(typ, reason, action, note string) {
	r.RecordGroup(cleanNote(note), typ, reason, action, note)
}

// RecordGroup is Record for occurrences whose notes differ in details that
// do not make another Event (a PID): records with the same type, reason,
// action and group are one Event, which keeps the note of the first, as
// client-go's events broadcaster does.
func (r *Recorder) RecordGroup(group, typ, reason, action, note string) {
	if r == nil {
		return
	}
	if typ != Normal && typ != Warning || !reasonRE.MatchString(reason) || action == "" || len(action) > 128 {
		r.dropped.Add(1)
		r.log.Error(fmt.Sprintf("kubeevents: invalid Event dropped: type %.20q, reason %.130q, action %.130q", typ, reason, action))
		return
	}
	k := key{typ, reason, action, cut(group, maxNote)}
	now := r.clock.Now()
	r.mu.Lock()
	e := r.entries[k]
	switch {
	case e != nil && (e.dirty() || now.Sub(e.last) <= r.cfg.SeriesWindow):
		e.count++
		e.last = now
	case e == nil && len(r.entries) >= r.cfg.MaxPending:
		r.mu.Unlock()
		r.dropped.Add(1)
		return
	default: // the first, or the first after the series ended
		r.entries[k] = &entry{name: r.newName(now), note: cleanNote(note), first: now, last: now, count: 1, next: now}
	}
	r.mu.Unlock()
	r.recorded.Add(1)
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Stats returns the counters.
func (r *Recorder) Stats() Stats {
	if r == nil {
		return Stats{}
	}
	return Stats{Recorded: r.recorded.Load(), Created: r.created.Load(), Patched: r.patched.Load(),
		Failed: r.failed.Load(), Refused: r.refused.Load(), Dropped: r.dropped.Load()}
}

// Pending returns how many Events the Recorder holds, written or not.
func (r *Recorder) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

// cleanNote makes note valid UTF-8 on one line, short enough for the API
// server.
func cleanNote(note string) string {
	return cut(kubeapi.OneLine(strings.ToValidUTF8(note, "\uFFFD")), maxNote)
}

// cut cuts s to at most n bytes, at a character boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n]
}

// newName names a new Event as client-go does, node.<nanoseconds in hex>,
// with the node's name cut so that the whole is at most 253 bytes; the
// nanoseconds only grow, so two Events never share a name. r.mu is held.
func (r *Recorder) newName(now time.Time) string {
	id := max(now.UnixNano(), r.lastID+1)
	r.lastID = id
	suffix := fmt.Sprintf(".%x", id)
	node := strings.TrimRight(cut(r.cfg.NodeName, 253-len(suffix)), "-.")
	return node + suffix
}

// Run writes the Events until ctx ends. Nothing pending is written after.
func (r *Recorder) Run(ctx context.Context) {
	for {
		wait := r.writeDue(ctx)
		var timer <-chan time.Time
		if wait >= 0 {
			timer = r.clock.After(wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-timer:
		}
	}
}

// writeDue writes the Events that are due, while the bucket and the
// back-off allow, and forgets those that are over. It returns how long
// until the next is due, or -1 for none.
func (r *Recorder) writeDue(ctx context.Context) time.Duration {
	for ctx.Err() == nil {
		now := r.clock.Now()
		if now.Before(r.blocked) {
			return r.blocked.Sub(now)
		}
		w, wait := r.due(now)
		if w == nil {
			return wait
		}
		r.write(ctx, w)
	}
	return -1
}

// write is one request: an Event's creation or its series.
type write struct {
	k     key
	name  string
	note  string
	count int32
	first time.Time
	last  time.Time
	patch bool
}

// due returns the first write due at now (taking its token), or, when none
// is, how long until one is (-1 for none). It forgets the Events whose
// series is over and drops those too old to write.
func (r *Recorder) due(now time.Time) (*write, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tokens = min(float64(r.cfg.Burst), r.tokens+float64(now.Sub(r.tokenAt))/float64(r.cfg.Refill))
	r.tokenAt = now
	wait := time.Duration(-1)
	later := func(d time.Duration) {
		if wait < 0 || d < wait {
			wait = d
		}
	}
	var pick *entry
	var pickKey key
	for k, e := range r.entries {
		switch {
		case !e.dirty() && now.Sub(e.last) > r.cfg.SeriesWindow:
			delete(r.entries, k)
			continue
		case e.dirty() && now.Sub(e.last) > r.cfg.MaxAge:
			delete(r.entries, k)
			r.dropped.Add(1)
			continue
		case !e.dirty():
			later(e.last.Add(r.cfg.SeriesWindow).Sub(now) + time.Millisecond)
			continue
		case now.Before(e.next):
			later(e.next.Sub(now))
			continue
		}
		if pick == nil || e.next.Before(pick.next) {
			pick, pickKey = e, k
		}
	}
	if pick == nil {
		return nil, wait
	}
	if r.tokens < 1 {
		return nil, time.Duration((1 - r.tokens) * float64(r.cfg.Refill))
	}
	r.tokens--
	return &write{k: pickKey, name: pick.name, note: pick.note, count: pick.count, first: pick.first, last: pick.last, patch: pick.written > 0}, 0
}

// write sends w and records the outcome.
func (r *Recorder) write(ctx context.Context, w *write) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	var err error
	if w.patch {
		err = r.send(ctx, "PATCH", r.eventsPath()+"/"+w.name, "application/merge-patch+json", map[string]any{"series": series{w.count, micro(w.last)}})
	} else {
		err = r.send(ctx, "POST", r.eventsPath(), "application/json", r.event(w))
	}
	var se *kubeapi.StatusError
	isStatus := errors.As(err, &se)
	switch {
	case err == nil, !w.patch && isStatus && se.Code == http.StatusConflict:
		// Created (a 409 is an earlier try of ours that succeeded without
		// an answer: names are never reused).
		r.done(w, true)
	case w.patch && isStatus && se.Code == http.StatusNotFound:
		// The Event expired (the API server's TTL) or was deleted: create it
		// again.
		r.done(w, false)
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		// Run is stopping.
	case !isStatus || se.Code == http.StatusTooManyRequests || se.Code >= 500:
		r.failed.Add(1)
		r.backOff()
		if !r.failing {
			r.failing = true
			r.log.Warn(fmt.Sprintf("kubeevents: cannot record Events on node %s: %v; they wait (at most %d) and are retried",
				r.cfg.NodeName, oneLine(err), r.cfg.MaxPending))
		}
	default:
		r.refused.Add(1)
		r.dropped.Add(1)
		r.backOff()
		r.mu.Lock()
		delete(r.entries, w.k)
		r.mu.Unlock()
		if !r.refusedLog {
			r.refusedLog = true
			r.log.Warn(fmt.Sprintf("kubeevents: the API server refuses Events on node %s: %v; they are dropped until it takes one (is the agent allowed to create and patch events.k8s.io events in namespace %s?)",
				r.cfg.NodeName, oneLine(err), r.cfg.Namespace))
		}
	}
}

func oneLine(err error) string { return kubeapi.OneLine(err.Error()) }

// done records a successful write of w; with !ok the Event is gone and is
// created again at once.
func (r *Recorder) done(w *write, ok bool) {
	now := r.clock.Now()
	if ok {
		if w.patch {
			r.patched.Add(1)
		} else {
			r.created.Add(1)
		}
		if r.failing {
			r.log.Info("kubeevents: Events are recorded again")
		}
		r.retry, r.failing, r.refusedLog = 0, false, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.entries[w.k]
	if e == nil || e.name != w.name {
		return
	}
	if ok {
		e.written, e.next = w.count, now.Add(r.cfg.MinInterval)
		return
	}
	e.name, e.written, e.next = r.newName(now), 0, now
}

// backOff stops the requests for a while after a failure or a refusal.
func (r *Recorder) backOff() {
	r.retry = min(max(2*r.retry, retryMin), retryMax)
	r.blocked = r.clock.Now().Add(r.retry)
}

func (r *Recorder) eventsPath() string {
	return "/apis/events.k8s.io/v1/namespaces/" + r.cfg.Namespace + "/events"
}

func micro(t time.Time) string { return t.UTC().Format(microTime) }

// The fields of an events.k8s.io/v1 Event the Recorder writes.
type (
	event struct {
		APIVersion          string    `json:"apiVersion"`
		Kind                string    `json:"kind"`
		Metadata            metadata  `json:"metadata"`
		EventTime           string    `json:"eventTime"`
		Series              *series   `json:"series,omitempty"`
		ReportingController string    `json:"reportingController"`
		ReportingInstance   string    `json:"reportingInstance"`
		Action              string    `json:"action"`
		Reason              string    `json:"reason"`
		Regarding           objectRef `json:"regarding"`
		Note                string    `json:"note,omitempty"`
		Type                string    `json:"type"`
	}
	metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	}
	series struct {
		Count            int32  `json:"count"`
		LastObservedTime string `json:"lastObservedTime"`
	}
	objectRef struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Name       string `json:"name"`
		UID        string `json:"uid"`
	}
)

// event is the Event w creates; a series when it was seen more than once
// before it could be created.
func (r *Recorder) event(w *write) *event {
	ev := &event{
		APIVersion:          "events.k8s.io/v1",
		Kind:                "Event",
		Metadata:            metadata{Name: w.name, Namespace: r.cfg.Namespace},
		EventTime:           micro(w.first),
		ReportingController: r.cfg.Controller,
		ReportingInstance:   r.cfg.Instance,
		Action:              w.k.action,
		Reason:              w.k.reason,
		Regarding:           objectRef{Kind: "Node", APIVersion: "v1", Name: r.cfg.NodeName, UID: r.cfg.NodeName},
		Note:                w.note,
		Type:                w.k.typ,
	}
	if w.count > 1 {
		ev.Series = &series{w.count, micro(w.last)}
	}
	return ev
}

// send sends in as JSON with contentType (kubeapi.Client.Do sends
// application/json only; a PATCH needs its patch type) and reads at most
// maxAnswer bytes of the answer.
func (r *Recorder) send(ctx context.Context, method, path, contentType string, in any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := kubeapi.NewRequest(ctx, r.cfg.Client.TokenFile, method, r.cfg.Client.Server+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := r.cfg.Client.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if resp.StatusCode/100 != 2 {
		return kubeapi.NewStatusError(resp, bytes.TrimSpace(data))
	}
	return err
}
