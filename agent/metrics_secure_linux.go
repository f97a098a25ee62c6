//go:build linux

package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/kubeauth"
	"github.com/prometheus/client_golang/prometheus"
)

// The secure metrics listener (--secure-metrics-addr): /metrics over HTTPS on
// the node's address, to the bearer tokens the API server authenticates and
// allows get on the non-resource URL /metrics (package kubeauth), with the
// loopback listener's limits. The probes stay on the loopback listener.

// selfSignedValidity is how long a self-signed certificate is valid; it is
// made again when a fifth of that is left.
const selfSignedValidity = 365 * 24 * time.Hour

// serveSecure serves /metrics on ln over TLS to the tokens authz allows, until
// ctx ends.
func serveSecure(ctx context.Context, ln net.Listener, lim httpLimits, m *metrics, authz *kubeauth.Authorizer, tlsConfig *tls.Config, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", authz.Handler(m.handler(log)))
	serve(ctx, ln, lim, mux, tlsConfig, log)
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

// newTLSConfig returns the secure listener's TLS configuration: the
// certificate of o's files (read again when they change) or a self-signed
// one for the node's names.
func newTLSConfig(o options, listen string, log *slog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.tlsCertFile != "" {
		r := &certFiles{cert: o.tlsCertFile, key: o.tlsKeyFile, log: log}
		if _, err := r.get(nil); err != nil {
			return nil, err
		}
		cfg.GetCertificate = r.get
		return cfg, nil
	}
	s := &selfSigned{names: certNames(o.nodeName, listen)}
	if _, err := s.get(nil); err != nil {
		return nil, err
	}
	cfg.GetCertificate = s.get
	return cfg, nil
}

// certNames are the self-signed certificate's SANs: "marksplit" (a fixed name
// a scraper can give as serverName), the node's name, the host's name, and the
// listen address's IP when it names one.
func certNames(node, listen string) []string {
	names := []string{"marksplit"}
	if node != "" {
		names = append(names, node)
	}
	if h, err := os.Hostname(); err == nil && h != "" && h != node {
		names = append(names, h)
	}
	if host, _, err := net.SplitHostPort(listen); err == nil {
		if ip, err := netip.ParseAddr(host); err == nil && !ip.IsUnspecified() {
			names = append(names, ip.String())
		}
	}
	return names
}

// selfSigned makes an ECDSA P-256 certificate in memory, and makes it again
// when it nears its end.
type selfSigned struct {
	names []string
	mu    sync.Mutex
	cert  *tls.Certificate
	renew time.Time
}

func (s *selfSigned) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.cert != nil && now.Before(s.renew) {
		return s.cert, nil
	}
	c, err := newSelfSigned(s.names, now, selfSignedValidity)
	if err != nil {
		return nil, err
	}
	s.cert, s.renew = c, now.Add(selfSignedValidity*4/5)
	return c, nil
}

// newSelfSigned returns a self-signed serving certificate for names (DNS names
// or IP addresses), valid from an hour before now for validity.
func newSelfSigned(names []string, now time.Time, validity time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: names[0] + "@" + fmt.Sprint(now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// certFiles serves the certificate of a mounted Secret, read again when a
// file's size or modification time changes (the kubelet swaps the files on
// an update). A new pair that does not load leaves the old one in use.
type certFiles struct {
	cert, key string
	log       *slog.Logger
	mu        sync.Mutex
	loaded    *tls.Certificate
	stamp     string
}

func (r *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	stamp := ""
	for _, f := range []string{r.cert, r.key} {
		fi, err := os.Stat(f)
		if err != nil {
			stamp += "?"
			continue
		}
		stamp += fmt.Sprintf("%d/%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.loaded != nil && stamp == r.stamp {
		return r.loaded, nil
	}
	c, err := tls.LoadX509KeyPair(r.cert, r.key)
	if err != nil {
		err = fmt.Errorf("--tls-cert-file, --tls-key-file: %w", err)
		if r.loaded == nil {
			return nil, err
		}
		r.log.Warn("kept the previous TLS certificate of the secure metrics listener", "err", err)
		r.stamp = stamp // one warning per change
		return r.loaded, nil
	}
	if r.loaded != nil {
		r.log.Info("loaded a new TLS certificate for the secure metrics listener", "file", r.cert)
	}
	r.loaded, r.stamp = &c, stamp
	return r.loaded, nil
}

var (
	descAuthResults = prometheus.NewDesc("marksplit_metrics_auth_total",
		"Requests to the secure /metrics listener, by result: allowed, unauthenticated (401), denied (403: authenticated, not allowed get on /metrics), unavailable (503: the API server did not answer and no decision was cached), throttled (429: too many tokens to review).", []string{"result"}, nil)
	descAuthReviews = prometheus.NewDesc("marksplit_metrics_auth_api_requests_total",
		"TokenReviews and SubjectAccessReviews sent to the API server for the secure /metrics listener (decisions are cached: an allow 1 min, a denial 15 s).", nil, nil)
)

// authCollector reads the Authorizer's counters at scrape time.
type authCollector struct{ a *kubeauth.Authorizer }

// addAuth registers the secure listener's metrics when a is not nil.
func (m *metrics) addAuth(a *kubeauth.Authorizer) {
	if m == nil || a == nil {
		return
	}
	m.reg.MustRegister(authCollector{a})
}

func (c authCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAuthResults
	ch <- descAuthReviews
}

func (c authCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.a.Stats()
	for _, d := range kubeauth.Decisions() {
		ch <- prometheus.MustNewConstMetric(descAuthResults, prometheus.CounterValue, float64(st.Results[d]), d.String())
	}
	ch <- prometheus.MustNewConstMetric(descAuthReviews, prometheus.CounterValue, float64(st.APIRequests))
}

// secureListener is what --secure-metrics-addr needs; all nil when it is
// empty.
type secureListener struct {
	ln    net.Listener
	authz *kubeauth.Authorizer
	tls   *tls.Config
}

// listenSecure opens the secure metrics listener of o.
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
	if s.ln, err = net.Listen("tcp", o.secureMetricsAddr); err != nil {
		return s, fmt.Errorf("--secure-metrics-addr: %w", err)
	}
	return s, nil
}

func (s secureListener) addr() string {
	if s.ln == nil {
		return "off"
	}
	return s.ln.Addr().String()
}
