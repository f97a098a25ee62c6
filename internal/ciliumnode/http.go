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

// do sends a GET of u with client and returns the response of a 200 answer, for the
// caller to read and close. Any other answer is read (its first maxErrBody bytes), closed
// and returned as an error, with its outcome: NotFound, Gone or HTTPError. A redirect is
// such an answer: the client never follows one (see noRedirects).
func do(ctx context.Context, client *http.Client, tokenFile, u string) (*http.Response, outcome, error) {
	req, err := newRequest(ctx, tokenFile, u)
	if err != nil {
		return nil, outcomeNone, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, outcomeNetworkError, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, outcomeOK, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxErrBody))
	if err != nil {
		return nil, outcomeNetworkError, fmt.Errorf("%s: read body: %w", resp.Status, err)
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil, outcomeNotFound, statusError(resp, body)
	case http.StatusGone:
		return nil, outcomeGone, statusError(resp, body)
	}
	return nil, outcomeHTTPError, statusError(resp, body)
}

// noRedirects returns a copy of c that never follows a redirect: the redirect is the
// answer, and fails the request. kube-apiserver never redirects these requests, and
// following one would send the token wherever the answer points, plain HTTP included.
func noRedirects(c *http.Client) *http.Client {
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cc
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
	if loc := resp.Header.Get("Location"); resp.StatusCode/100 == 3 {
		return fmt.Errorf("%s: a redirect to %.200q, not followed (the API server never redirects)", resp.Status, loc)
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
