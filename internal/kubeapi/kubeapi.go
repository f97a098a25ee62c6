package kubeapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"
)

const (
	// DefaultTokenFile and DefaultCAFile are where a pod's service account token and
	// the cluster's CA are mounted.
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

	// MaxErrBody bounds what is read of an error answer.
	MaxErrBody = 64 << 10
	// MaxLogChars bounds a server's message in a log line (see OneLine).
	MaxLogChars = 300

	// HTTP/2 health checks of the connection to the API server, as client-go sets them: a
	// ping after this long without a frame, and the connection is closed when the ping is
	// not answered within pingTimeout. Without them a connection that died silently (a
	// middlebox forgot it) keeps every later request on it hanging until its own timeout,
	// and the next request takes the same dead connection again.
	sendPingTimeout = 30 * time.Second
	pingTimeout     = 15 * time.Second
)

// InClusterServer returns the API server's URL in a pod, from KUBERNETES_SERVICE_HOST
// and KUBERNETES_SERVICE_PORT.
func InClusterServer() (string, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return "", errors.New("in-cluster config: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set (not running in a pod?)")
	}
	return "https://" + net.JoinHostPort(host, port), nil
}

// ParseServer checks that s is an https://host[:port] URL and returns it without a
// trailing slash.
func ParseServer(s string) (string, error) {
	if s == "" {
		return "", errors.New("no API server URL (see InClusterConfig)")
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("API server URL: %w", err)
	}
	if u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("API server URL %q: want https://host:port", s)
	}
	return strings.TrimSuffix(s, "/"), nil
}

// NewHTTPClient returns a client that trusts only the PEM certificates in caFile, goes
// to the server directly (no proxy), checks HTTP/2 connections with pings and never
// follows a redirect. It sets no Timeout: a watch is a long request; bound each request
// with its context.
func NewHTTPClient(caFile string) (*http.Client, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // the API server is reached directly, by its service address
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: sendPingTimeout, PingTimeout: pingTimeout}
	return NoRedirects(&http.Client{Transport: tr}), nil
}

// NoRedirects returns a copy of c that never follows a redirect: the redirect is the
// answer, and fails the request. kube-apiserver never redirects the agent's requests,
// and following one would send the token wherever the answer points, plain HTTP
// included.
func NoRedirects(c *http.Client) *http.Client {
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cc
}

// NewRequest builds a request of method for u with the token read from tokenFile now
// (the kubelet rotates it) and, when body is not nil, a JSON body.
func NewRequest(ctx context.Context, tokenFile, method, u string, body []byte) (*http.Request, error) {
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("read token: %w", err)
	}
	token := strings.TrimSpace(string(tok))
	if token == "" {
		return nil, fmt.Errorf("token file %s is empty", tokenFile)
	}
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "marksplit")
	return req, nil
}

// Client sends JSON requests to one API server.
type Client struct {
	// Server is https://host:port, without a trailing slash (see ParseServer).
	Server string
	// TokenFile holds the bearer token, read again for every request.
	TokenFile string
	// HTTP is the client requests go through (see NewHTTPClient); it must not follow
	// redirects.
	HTTP *http.Client
}

// Do sends method to path (which starts with /) with in encoded as JSON (none when in is
// nil), and decodes a 2xx answer of at most maxBody bytes into out (unless out is nil).
// Any other answer is a *StatusError.
func (c *Client) Do(ctx context.Context, method, path string, in, out any, maxBody int64) error {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return err
		}
	}
	req, err := NewRequest(ctx, c.TokenFile, method, c.Server+path, body)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		data, err := io.ReadAll(io.LimitReader(resp.Body, MaxErrBody))
		if err != nil {
			return fmt.Errorf("%s: read body: %w", resp.Status, err)
		}
		return NewStatusError(resp, data)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("%s: read body: %w", resp.Status, err)
	}
	if int64(len(data)) > maxBody {
		return fmt.Errorf("%s: answer larger than %d bytes", resp.Status, maxBody)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

// Status is a Kubernetes Status object, as in error answers and ERROR watch events.
type Status struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Reason  string `json:"reason"`
	Code    int    `json:"code"`
}

// StatusError is a non-2xx answer.
type StatusError struct {
	Code     int    // the HTTP status code
	Status   string // the status line, "404 Not Found"
	Reason   string // the Status object's reason, when the server sent one
	Message  string // the server's message (or body), on one line (see OneLine)
	Location string // a redirect's target
}

func (e *StatusError) Error() string {
	if e.Code/100 == 3 {
		return fmt.Sprintf("%s: a redirect to %.200q, not followed (the API server never redirects)", e.Status, e.Location)
	}
	if e.Message == "" {
		return e.Status
	}
	return e.Status + ": " + e.Message
}

// NewStatusError describes resp, a non-2xx answer whose body (or its first bytes) is
// body: its status line and the server's message.
func NewStatusError(resp *http.Response, body []byte) *StatusError {
	e := &StatusError{Code: resp.StatusCode, Status: resp.Status}
	var st Status
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &st) == nil && st.Kind == "Status" && st.Message != "" {
		msg, e.Reason = st.Message, st.Reason
	}
	if resp.StatusCode/100 == 3 {
		e.Location = resp.Header.Get("Location")
	}
	e.Message = OneLine(msg)
	return e
}

// OneLine makes a server's text fit in one short log line: runs of spaces and control
// characters become one space, and more than MaxLogChars bytes are cut at a character
// boundary, with an ellipsis.
func OneLine(s string) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return r == ' ' || r < ' ' || r == 0x7f
	}), " ")
	if len(s) > MaxLogChars {
		i := MaxLogChars
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		s = s[:i] + "…"
	}
	return s
}

// NextBackOff returns b's next delay; a policy that gives up is started over
// (and a policy that gives up at once waits a minute).
func NextBackOff(b backoff.BackOff) time.Duration {
	d := b.NextBackOff()
	if d == backoff.Stop {
		b.Reset()
		if d = b.NextBackOff(); d == backoff.Stop {
			d = time.Minute
		}
	}
	return d
}

// Sleep waits for d and reports whether ctx is still live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
