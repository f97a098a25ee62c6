package nodecondition

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
)

// DefaultType is the condition type the deployment manifests use.
const DefaultType = "MarkSplitReady"

// requestTimeout bounds one PATCH.
const requestTimeout = 10 * time.Second

// maxAnswer bounds the answer read: a Node, with its images, can be large.
const maxAnswer = 4 << 20

// typeRE is a condition type: a Kubernetes qualified name, as the API
// validates it (an optional DNS-subdomain prefix and a name of at most 63
// characters).
var typeRE = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// ValidType reports whether t can be a Node condition's type, with an error
// that says why not.
func ValidType(t string) error {
	if len(t) > 316 || !typeRE.MatchString(t) {
		return fmt.Errorf("%q is not a condition type: a name of letters, digits, '-', '_' and '.' (at most 63), with an optional DNS prefix and '/'", t)
	}
	return nil
}

// kubeletOwned are the condition types that the kubelet and the node
// controllers write (NetworkUnavailable: the route controller and CNI
// plugins), and those of older kubelets: the agent writing one would fight
// its owner, or mark every node NotReady.
var kubeletOwned = []string{"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "OutOfDisk", "ConfigOK"}

// KubeletOwned returns an error when t is a condition type that Kubernetes
// itself writes on Nodes: one of the kubelet's or the node controllers'
// (in any case), or any type under kubernetes.io or k8s.io.
func KubeletOwned(t string) error {
	for _, k := range kubeletOwned {
		if strings.EqualFold(t, k) {
			return fmt.Errorf("%q is a condition type the kubelet or a node controller writes (%s): pick another, such as %s", t, strings.Join(kubeletOwned, ", "), DefaultType)
		}
	}
	if prefix, _, ok := strings.Cut(t, "/"); ok {
		for _, d := range []string{"kubernetes.io", "k8s.io"} {
			if prefix == d || strings.HasSuffix(prefix, "."+d) {
				return fmt.Errorf("%q is under %s, which Kubernetes reserves: pick another, such as %s", t, d, DefaultType)
			}
		}
	}
	return nil
}

// State is what the condition says.
type State struct {
	// Status is true when the split is in place or not needed.
	Status bool
	// Reason is one CamelCase word (SplitInPlace, NotEncrypting, …).
	Reason string
	// Message says it for a person.
	Message string
}

// Defaults of a Config. A Node's status is read by every controller that
// watches Nodes, so each write costs the API server a fan-out: the agent
// writes its condition at most once per DefaultMinInterval (retries
// included), the latest state winning, and rewrites an unchanged state
// every DefaultHeartbeat (as node-problem-detector's default heartbeat) so
// that a dead or stuck agent's condition goes stale: its lastHeartbeatTime
// stops. At 5,000 nodes that is at most 500 writes a second while every
// state flaps, and 17 a second at rest.
const (
	DefaultMinInterval = 10 * time.Second
	DefaultHeartbeat   = 5 * time.Minute

	// retryMax is the longest back-off after failed writes.
	retryMax = 5 * time.Minute
	// warnEvery spaces the warnings of a failing streak, and those of
	// changes faster than the writes.
	warnEvery = 10 * time.Minute
)

// Clock is the time the Writer reads and waits on.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Config says where and what to write.
type Config struct {
	Client   *kubeapi.Client
	NodeName string
	// Type is the condition's type; DefaultType when empty.
	Type   string
	Logger *slog.Logger
	// Clock is the clock of the writes and the condition's timestamps; the
	// real one when nil.
	Clock Clock
	// MinInterval spaces the writes, retries included; DefaultMinInterval
	// when zero.
	MinInterval time.Duration
	// Heartbeat is the period of the rewrites of an unchanged state;
	// DefaultHeartbeat when zero.
	Heartbeat time.Duration
}

// Stats counts what a Writer did.
type Stats struct {
	Changes    uint64 // Set calls that changed the state
	Written    uint64 // writes of a changed state, accepted
	Heartbeats uint64 // writes of an unchanged state, accepted
	Failed     uint64 // writes that got no answer, 429 or 5xx: retried
	Refused    uint64 // writes the API server refused (4xx): retried
}

// Writer keeps the condition of one Node.
type Writer struct {
	cfg   Config
	clock Clock
	wake  chan struct{}

	mu   sync.Mutex
	want State
	have bool   // want was set at least once
	gen  uint64 // Set calls; a pass confirmed the state since the last write when gen != wroteGen

	changes, written, heartbeats, failedN, refusedN atomic.Uint64

	// Run's goroutine only.
	wrote    *State    // the last state written, nil before the first
	wroteGen uint64    // gen of the last write
	since    time.Time // lastTransitionTime
	lastTry  time.Time // the last write, accepted or not
	lastOK   time.Time // the last accepted write
	retry    time.Duration
	refused  bool      // the last write was refused (logged)
	failures int       // failed writes in a row
	warned   time.Time // the last warning of a failing streak
	limited  time.Time // the last line about changes faster than the writes
	tried    uint64    // changes at the last write
}

// New returns a Writer for cfg.
func New(cfg Config) (*Writer, error) {
	if cfg.Type == "" {
		cfg.Type = DefaultType
	}
	if err := ValidType(cfg.Type); err != nil {
		return nil, fmt.Errorf("nodecondition: %w", err)
	}
	if err := KubeletOwned(cfg.Type); err != nil {
		return nil, fmt.Errorf("nodecondition: %w", err)
	}
	if cfg.NodeName == "" {
		return nil, errors.New("nodecondition: no node name")
	}
	if cfg.Client == nil {
		return nil, errors.New("nodecondition: no API client")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = DefaultMinInterval
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	w := &Writer{cfg: cfg, clock: cfg.Clock, wake: make(chan struct{}, 1)}
	if w.clock == nil {
		w.clock = realClock{}
	}
	return w, nil
}

// Set makes s the condition's state, confirmed now: Run writes it when it
// differs from what was written, and rewrites it at the heartbeat only when
// Set was called since the last write, so that a stuck caller's condition
// goes stale.
func (w *Writer) Set(s State) {
	w.mu.Lock()
	if !w.have || w.want != s {
		w.changes.Add(1)
	}
	w.want, w.have = s, true
	w.gen++
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Stats returns the counters; safe from any goroutine.
func (w *Writer) Stats() Stats {
	return Stats{Changes: w.changes.Load(), Written: w.written.Load(), Heartbeats: w.heartbeats.Load(),
		Failed: w.failedN.Load(), Refused: w.refusedN.Load()}
}

func (w *Writer) current() (State, uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.want, w.gen, w.have
}

// Run writes the condition until ctx ends.
func (w *Writer) Run(ctx context.Context) {
	for {
		var timer <-chan time.Time
		if wait := w.writeDue(ctx); wait >= 0 {
			timer = w.clock.After(wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-timer:
		}
	}
}

// writeDue writes the state when a write is due, and returns how long
// until the next one may be, or -1 when none is until Set.
func (w *Writer) writeDue(ctx context.Context) time.Duration {
	if ctx.Err() != nil {
		return -1
	}
	s, gen, ok := w.current()
	if !ok {
		return -1
	}
	now := w.clock.Now()
	change := w.wrote == nil || *w.wrote != s
	if !change && (gen == w.wroteGen || w.retry == 0 && now.Before(w.lastOK.Add(w.cfg.Heartbeat))) {
		if gen == w.wroteGen {
			return -1 // nothing confirmed since the last write: wait for a Set
		}
		return w.lastOK.Add(w.cfg.Heartbeat).Sub(now)
	}
	if next := w.lastTry.Add(max(w.cfg.MinInterval, w.retry)); !w.lastTry.IsZero() && now.Before(next) {
		// A few changes in an interval are a pass's way (a start); many
		// are a flapping source: one line per warnEvery.
		if change && w.retry == 0 && w.changes.Load()-w.tried > 2 && now.Sub(w.limited) >= warnEvery {
			w.limited = now
			w.cfg.Logger.Warn(fmt.Sprintf("node condition %s: it changes faster than it may be written; written at most once per %v, the latest state (%s)",
				w.cfg.Type, w.cfg.MinInterval, s.Reason))
		}
		return next.Sub(now)
	}
	w.lastTry, w.tried = now, w.changes.Load()
	err := w.write(ctx, s, now)
	switch {
	case err == nil:
		if change {
			w.written.Add(1)
		} else {
			w.heartbeats.Add(1)
		}
		w.wroteGen, w.lastOK, w.retry = gen, now, 0
	case ctx.Err() != nil:
		return -1
	default:
		w.failed(err, now)
		w.retry = min(max(2*w.retry, w.cfg.MinInterval), retryMax)
	}
	return max(w.cfg.MinInterval, w.retry)
}

// failed counts a failed write and warns at the first of a streak and then
// at most once per warnEvery.
func (w *Writer) failed(err error, now time.Time) {
	w.failures++
	var se *kubeapi.StatusError
	if errors.As(err, &se) && se.Code/100 == 4 && se.Code != http.StatusTooManyRequests {
		w.refusedN.Add(1)
		if !w.refused {
			w.cfg.Logger.Warn(fmt.Sprintf("node condition %s: the API server refused to set it on node %s (see docs/operations.md, \"Node condition\"): %v",
				w.cfg.Type, w.cfg.NodeName, err))
			w.warned = now
		}
		w.refused = true
		return
	}
	w.failedN.Add(1)
	if w.failures == 1 || now.Sub(w.warned) >= warnEvery {
		w.warned = now
		w.cfg.Logger.Warn(fmt.Sprintf("node condition %s: cannot set it on node %s (%d failed writes in a row; retried with back-off up to %v): %v",
			w.cfg.Type, w.cfg.NodeName, w.failures, retryMax, kubeapi.OneLine(err.Error())))
	}
}

// condition is a NodeCondition as the API takes it.
type condition struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	Reason             string `json:"reason"`
	Message            string `json:"message"`
	LastHeartbeatTime  string `json:"lastHeartbeatTime"`
	LastTransitionTime string `json:"lastTransitionTime"`
}

// Patch is the strategic-merge patch that sets s at now, with since the
// time of the last change of status.
func Patch(typ string, s State, now, since time.Time) ([]byte, error) {
	status := "False"
	if s.Status {
		status = "True"
	}
	c := condition{
		Type: typ, Status: status, Reason: s.Reason, Message: s.Message,
		LastHeartbeatTime:  now.UTC().Format(time.RFC3339),
		LastTransitionTime: since.UTC().Format(time.RFC3339),
	}
	return json.Marshal(map[string]any{"status": map[string]any{"conditions": []condition{c}}})
}

func (w *Writer) write(ctx context.Context, s State, now time.Time) error {
	since := w.since
	if w.wrote == nil || w.wrote.Status != s.Status {
		since = now
	}
	body, err := Patch(w.cfg.Type, s, now, since)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	c := w.cfg.Client
	req, err := kubeapi.NewRequest(ctx, c.TokenFile, "PATCH", c.Server+"/api/v1/nodes/"+url.PathEscape(w.cfg.NodeName)+"/status", body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/strategic-merge-patch+json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return kubeapi.NewStatusError(resp, bytes.TrimSpace(data))
	}
	if w.refused || w.failures > 0 {
		w.cfg.Logger.Info(fmt.Sprintf("node condition %s: set on node %s again", w.cfg.Type, w.cfg.NodeName))
	}
	w.refused, w.failures = false, 0
	w.wrote, w.since = &s, since
	w.cfg.Logger.Debug("node condition written", "type", w.cfg.Type, "status", s.Status, "reason", s.Reason)
	return nil
}
