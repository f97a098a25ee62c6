package nodecondition

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
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

// State is what the condition says.
type State struct {
	// Status is true when the split is in place or not needed.
	Status bool
	// Reason is one CamelCase word (SplitInPlace, NotEncrypting, …).
	Reason string
	// Message says it for a person.
	Message string
}

// Config says where and what to write.
type Config struct {
	Client   *kubeapi.Client
	NodeName string
	// Type is the condition's type; DefaultType when empty.
	Type   string
	Logger *slog.Logger
	// Now is the clock of the condition's timestamps; time.Now when nil.
	Now func() time.Time
}

// Writer keeps the condition of one Node.
type Writer struct {
	cfg  Config
	wake chan struct{}

	mu   sync.Mutex
	want State
	have bool // want was set at least once

	// Run's goroutine only.
	written *State // the last state written, nil before the first
	since   time.Time
	refused bool // the last write was refused (logged)
}

// New returns a Writer for cfg.
func New(cfg Config) (*Writer, error) {
	if cfg.Type == "" {
		cfg.Type = DefaultType
	}
	if err := ValidType(cfg.Type); err != nil {
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Writer{cfg: cfg, wake: make(chan struct{}, 1)}, nil
}

// Set makes s the condition's state; Run writes it when it differs from
// what was written.
func (w *Writer) Set(s State) {
	w.mu.Lock()
	w.want, w.have = s, true
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *Writer) current() (State, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.want, w.have
}

// Run writes the condition until ctx ends.
func (w *Writer) Run(ctx context.Context) {
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(time.Second),
		backoff.WithMaxInterval(time.Minute), backoff.WithMaxElapsedTime(0))
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		}
		for {
			s, ok := w.current()
			if !ok || w.written != nil && *w.written == s {
				break
			}
			if err := w.write(ctx, s); err != nil {
				if ctx.Err() != nil {
					return
				}
				w.failed(err)
				if !kubeapi.Sleep(ctx, kubeapi.NextBackOff(b)) {
					return
				}
				continue
			}
			b.Reset()
		}
	}
}

func (w *Writer) failed(err error) {
	var se *kubeapi.StatusError
	if errors.As(err, &se) && se.Code/100 == 4 {
		if !w.refused {
			w.cfg.Logger.Warn(fmt.Sprintf("node condition %s: the API server refused to set it on node %s (see docs/operations.md, \"Node condition\"): %v",
				w.cfg.Type, w.cfg.NodeName, err))
		}
		w.refused = true
		return
	}
	w.cfg.Logger.Debug("node condition: write failed; retrying", "err", err)
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

func (w *Writer) write(ctx context.Context, s State) error {
	now := w.cfg.Now()
	since := w.since
	if w.written == nil || w.written.Status != s.Status {
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
	if w.refused {
		w.cfg.Logger.Info(fmt.Sprintf("node condition %s: set on node %s again", w.cfg.Type, w.cfg.NodeName))
	}
	w.refused = false
	w.written, w.since = &s, since
	w.cfg.Logger.Debug("node condition written", "type", w.cfg.Type, "status", s.Status, "reason", s.Reason)
	return nil
}
