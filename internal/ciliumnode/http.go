package ciliumnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"
)

// newRequest builds a GET of u with the token read from tokenFile now: the kubelet rotates
// it, so it is read again for every request.
func newRequest(ctx context.Context, tokenFile, u string) (*http.Request, error) {
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("read token: %w", err)
	}
	token := strings.TrimSpace(string(tok))
	if token == "" {
		return nil, fmt.Errorf("token file %s is empty", tokenFile)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "marksplit")
	return req, nil
}

// nextBackOff returns b's next delay; a policy that gives up is started over.
func nextBackOff(b backoff.BackOff) time.Duration {
	d := b.NextBackOff()
	if d == backoff.Stop {
		b.Reset()
		if d = b.NextBackOff(); d == backoff.Stop {
			d = time.Minute
		}
	}
	return d
}

// sleep waits for d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// activityReader pushes the watch's silence timer back whenever bytes arrive, and keeps the
// underlying reader's last error to tell a broken connection from garbage.
type activityReader struct {
	r       io.Reader
	timer   *time.Timer
	timeout time.Duration
	err     error
}

func (a *activityReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.timer.Reset(a.timeout)
	}
	if err != nil {
		a.err = err
	}
	return n, err
}

// status is a Kubernetes Status object, as in error answers and ERROR events.
type status struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
}

// statusError describes a non-2xx answer: its status line and the server's message.
func statusError(resp *http.Response, body []byte) error {
	var st status
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" && st.Message != "" {
		msg = st.Message
	}
	if msg = oneLine(msg); msg == "" {
		return errors.New(resp.Status)
	}
	return fmt.Errorf("%s: %s", resp.Status, msg)
}

// oneLine makes a server's text fit in one short log line.
func oneLine(s string) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return r == ' ' || r < ' ' || r == 0x7f
	}), " ")
	if len(s) > maxLogChars {
		i := maxLogChars
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		s = s[:i] + "…"
	}
	return s
}
