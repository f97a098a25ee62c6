//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"

	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/kubeauth"
	"github.com/marksplit/marksplit/internal/metricsserver"
)

// The secure metrics listener (--secure-metrics-addr): /metrics over HTTPS on
// the node's address, to the bearer tokens the API server authenticates and
// allows get on the non-resource URL /metrics (package kubeauth), served as
// the loopback listener is (package metricsserver). The probes stay on the
// loopback listener.

// serveSecure serves /metrics on s's listener, over TLS, to the tokens its
// Authorizer allows, until ctx ends.
// A port another program holds is tried again (listenRetry).
func serveSecure(ctx context.Context, s secureListener, m *metrics, log *slog.Logger) {
	ln := listenRetry(ctx, "secure-metrics-addr", s.listen, m.listenFailed.WithLabelValues("secure-metrics"), log)
	if ln == nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.authz.Handler(m.handler(log)))
	metricsserver.Serve(ctx, ln, metricsserver.DefaultLimits(), mux, s.tls, log)
}

// newMetricsAuth returns the Authorizer of the secure listener: it reviews
// tokens with the pod's own service account (the token and CA of
// $MARKSPLIT_SERVICEACCOUNT_DIR or the kubelet's mount).
func newMetricsAuth(log *slog.Logger) (*kubeauth.Authorizer, error) {
	server, err := kubeapi.InClusterServer()
	if err != nil {
		return nil, usageErrorf("--secure-metrics-addr asks the API server who may scrape, from inside a pod: %v (or leave it empty)", err)
	}
	dir := os.Getenv(serviceAccountDirEnv)
	if dir == "" {
		dir = defaultServiceAccountDir
	}
	hc, err := kubeapi.NewHTTPClient(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("--secure-metrics-addr: %w", err)
	}
	return kubeauth.New(kubeauth.Config{
		API:    &kubeapi.Client{Server: server, TokenFile: filepath.Join(dir, "token"), HTTP: hc},
		Logger: log,
	})
}

// addAuth registers the secure listener's metrics when a is not nil.
func (m *metrics) addAuth(a *kubeauth.Authorizer) {
	if m == nil || a == nil {
		return
	}
	m.reg.MustRegister(metricsserver.AuthCollector{A: a})
}

// newTLSConfig returns the secure listener's TLS configuration: the
// certificate of o's files (read again when they change) or a self-signed
// one for the node's names.
func newTLSConfig(o options, listen string, log *slog.Logger) (*tls.Config, error) {
	return metricsserver.TLSConfig(o.tlsCertFile, o.tlsKeyFile, metricsserver.CertNames(o.nodeName, listen), log)
}

// secureListener is what --secure-metrics-addr needs; all nil when it is
// empty.
type secureListener struct {
	listen string // the address, listened on by serveSecure
	authz  *kubeauth.Authorizer
	tls    *tls.Config
}

// listenSecure prepares the secure metrics listener of o.
func listenSecure(o options, log *slog.Logger) (secureListener, error) {
	var s secureListener
	if o.secureMetricsAddr == "" {
		return s, nil
	}
	var err error
	if s.authz, err = newMetricsAuth(log); err != nil {
		return s, err
	}
	if s.tls, err = newTLSConfig(o, o.secureMetricsAddr, log); err != nil {
		return s, err
	}
	s.listen = o.secureMetricsAddr
	return s, nil
}

func (s secureListener) addr() string {
	if s.listen == "" {
		return "off"
	}
	return s.listen
}
