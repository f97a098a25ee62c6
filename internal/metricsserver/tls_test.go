package metricsserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// writePair writes a new self-signed certificate for name and its key.
func writePair(t *testing.T, certFile, keyFile, name string) *x509.Certificate {
	t.Helper()
	c, err := SelfSigned([]string{name}, time.Now(), time.Hour)
	must(t, err)
	der, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	must(t, err)
	must(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600))
	os.Remove(certFile) // it may be a FIFO
	must(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600))
	return c.Leaf
}

// startTLS serves "ok" over TLS with the certificate of certFile and keyFile
// (self-signed for "marksplit" when both are empty) on 127.0.0.1 until t
// ends, and returns its address.
func startTLS(t *testing.T, certFile, keyFile string) string {
	t.Helper()
	cfg, err := TLSConfig(certFile, keyFile, []string{"marksplit"}, slog.New(slog.DiscardHandler))
	must(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
		Serve(ctx, ln, DefaultLimits(), ok, cfg, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// TestSecureMetricsCertFiles checks that a mounted certificate is served, and a
// new one once the files change.
func TestSecureMetricsCertFiles(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func(name string) *x509.Certificate { return writePair(t, certFile, keyFile, name) }
	write("first.example")
	addr := startTLS(t, certFile, keyFile)
	served := func() string {
		t.Helper()
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		must(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].DNSNames[0]
	}
	if got := served(); got != "first.example" {
		t.Fatalf("served %q, want first.example", got)
	}
	write("second.example-with-a-longer-name") // a new size, whatever the clock's granularity
	if got := served(); got != "second.example-with-a-longer-name" {
		t.Errorf("served %q after the files changed, want the new certificate", got)
	}
	must(t, os.WriteFile(certFile, []byte("not PEM"), 0o600))
	if got := served(); got != "second.example-with-a-longer-name" {
		t.Errorf("served %q after a bad update, want the last good certificate", got)
	}
	if _, err := TLSConfig(filepath.Join(dir, "none"), keyFile, nil, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("TLSConfig with a missing certificate file: no error")
	}
}
