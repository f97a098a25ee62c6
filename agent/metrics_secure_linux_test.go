//go:build linux

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/kubeauth"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
)

// fakeReviews is an API server that authenticates "reader" (allowed get on
// /metrics) and "other" (not allowed), and no other token.
func fakeReviews(t *testing.T) *kubeapi.Client {
	t.Helper()
	api := apitest.New(t, apitest.Options{
		Users:   map[string]string{"reader": "reader", "other": "other"},
		Allowed: map[string][]string{"reader": {"/metrics"}},
	})
	dir := t.TempDir()
	must(t, api.WriteServiceAccount(dir))
	hc, err := kubeapi.NewHTTPClient(filepath.Join(dir, "ca.crt"))
	must(t, err)
	return &kubeapi.Client{Server: api.URL(), TokenFile: filepath.Join(dir, "token"), HTTP: hc}
}

// startSecure serves the secure listener on 127.0.0.1 until t ends and
// returns its address.
func startSecure(t *testing.T, o options) string {
	t.Helper()
	authz, err := kubeauth.New(kubeauth.Config{API: fakeReviews(t)})
	must(t, err)
	cfg, err := newTLSConfig(o, "127.0.0.1:0", slog.New(slog.DiscardHandler))
	must(t, err)
	// A free port: serveSecure listens on it (again, should another take it).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := ln.Addr().String()
	ln.Close()
	m := newMetrics(netwatch.New(netwatch.Options{}), mtupolicy.Config{}, nil, snmpPath)
	m.addAuth(authz)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveSecure(ctx, secureListener{listen: addr, authz: authz, tls: cfg}, m, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
	// serveSecure listens in its goroutine: wait for it.
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("the secure listener on %s: %v", addr, err)
		}
		<-time.After(2 * time.Millisecond)
	}
}

// TestSecureMetrics checks the secure listener's answers, its self-signed
// certificate, and that it speaks HTTP/1.1 only and serves nothing but /metrics.
func TestSecureMetrics(t *testing.T) {
	addr := startSecure(t, options{nodeName: "node-1"})
	var state *tls.ConnectionState
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}},
		ForceAttemptHTTP2: true,
	}}
	get := func(path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", "https://"+addr+path, nil)
		must(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		must(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		state = resp.TLS
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		name, path, token string
		want              int
	}{
		{"allowed", "/metrics", "reader", 200},
		{"not allowed", "/metrics", "other", 403},
		{"unknown token", "/metrics", "garbage", 401},
		{"no token", "/metrics", "", 401},
		{"no probes here", "/healthz", "reader", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(tc.path, tc.token)
			if code != tc.want {
				t.Errorf("GET %s: %d, want %d: %s", tc.path, code, tc.want, body)
			}
			if code == 200 && !strings.Contains(body, `marksplit_metrics_auth_total{result="allowed"} 1`) {
				t.Errorf("GET %s: no count of the allowed request in\n%s", tc.path, body)
			}
		})
	}
	if state == nil || state.NegotiatedProtocol == "h2" || state.Version < tls.VersionTLS12 {
		t.Fatalf("TLS state %+v: want TLS 1.2 or later, without HTTP/2", state)
	}
	leaf := state.PeerCertificates[0]
	key, ok := leaf.PublicKey.(*ecdsa.PublicKey)
	if !ok || key.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", leaf.PublicKey)
	}
	host, _ := os.Hostname()
	wantNames := []string{"marksplit", "node-1"}
	if host != "" && host != "node-1" {
		wantNames = append(wantNames, host)
	}
	if diff := cmp.Diff(wantNames, leaf.DNSNames); diff != "" {
		t.Errorf("DNS SANs (-want +got):\n%s", diff)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "marksplit", Roots: pool}); err != nil {
		t.Errorf("the certificate does not verify as serverName marksplit against itself: %v", err)
	}
}

// Outside a pod the secure listener cannot ask the API server: a usage error
// that says so, before anything listens.
func TestListenSecureOutsideAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	s, err := listenSecure(options{secureMetricsAddr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler))
	var ue *usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--secure-metrics-addr asks the API server") || s.listen != "" {
		t.Errorf("listenSecure outside a pod: %v, listener %v; want a usage error and no listener", err, s.listen)
	}
	if s, err := listenSecure(options{}, slog.New(slog.DiscardHandler)); err != nil || s.addr() != "off" {
		t.Errorf("listenSecure without the flag: %v, %s; want off", err, s.addr())
	}
}
