//go:build unix

package metricsserver

import (
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A FIFO at the certificate's path (or any file that is not a regular file)
// is refused at once with an error that says so, at start and in use, and
// the listener serves the new certificate once the file is right again
// (issue 31: a FIFO hung the secure listener for good).
func TestCertFilesFIFO(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	fifo := func() {
		t.Helper()
		os.Remove(certFile)
		must(t, syscall.Mkfifo(certFile, 0o600))
	}
	// within runs f, failing the test if it has not returned after 10 s.
	within := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: still blocked after 2 min", what)
		}
	}
	writePair(t, certFile, keyFile, "first.example")
	fifo()
	within("TLSConfig with a FIFO", func() {
		_, err := TLSConfig(certFile, keyFile, nil, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("TLSConfig with a FIFO as --tls-cert-file: %v; want an error saying it is not a regular file", err)
		}
	})

	writePair(t, certFile, keyFile, "first.example")
	addr := startTLS(t, certFile, keyFile)
	served := func() (name string) {
		t.Helper()
		within("a TLS handshake", func() {
			conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
			if err != nil {
				name = err.Error()
				return
			}
			defer conn.Close()
			name = conn.ConnectionState().PeerCertificates[0].DNSNames[0]
		})
		return name
	}
	if got := served(); got != "first.example" {
		t.Fatalf("served %q, want first.example", got)
	}
	fifo()
	if got := served(); got != "first.example" {
		t.Errorf("with a FIFO as the certificate file: served %q, want the last good certificate", got)
	}
	writePair(t, certFile, keyFile, "second.example")
	if got := served(); got != "second.example" {
		t.Errorf("once the file is right again: served %q, want the new certificate", got)
	}
}
