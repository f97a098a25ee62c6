package metricsserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
)

// selfSignedValidity is how long a self-signed certificate is valid; it is
// made again when a fifth of that is left.
const selfSignedValidity = 365 * 24 * time.Hour

// TLSConfig returns a server's TLS configuration: the certificate of certFile
// and keyFile (read again when they change), or, when both are empty, a
// self-signed one for names (DNS names or IP addresses; the first is the
// subject's). The flags named in errors are the agent's.
func TLSConfig(certFile, keyFile string, names []string, log *slog.Logger) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if certFile != "" || keyFile != "" {
		r := &certFiles{cert: certFile, key: keyFile, log: log}
		if _, err := r.get(nil); err != nil {
			return nil, err
		}
		cfg.GetCertificate = r.get
		return cfg, nil
	}
	s := &selfSigned{names: names}
	if _, err := s.get(nil); err != nil {
		return nil, err
	}
	cfg.GetCertificate = s.get
	return cfg, nil
}

// CertNames are the SANs of a self-signed certificate: "marksplit" (a fixed
// name a scraper can give as serverName), the node's name, the host's name,
// and the listen address's IP when it names one.
func CertNames(node, listen string) []string {
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
	c, err := SelfSigned(s.names, now, selfSignedValidity)
	if err != nil {
		return nil, err
	}
	s.cert, s.renew = c, now.Add(selfSignedValidity*4/5)
	return c, nil
}

// SelfSigned returns a self-signed serving certificate for names (DNS names
// or IP addresses), valid from an hour before now for validity.
func SelfSigned(names []string, now time.Time, validity time.Duration) (*tls.Certificate, error) {
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
	c, err := loadPair(r.cert, r.key)
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

// maxPEM bounds a certificate or key file: a chain of a few certificates is a
// few KiB.
const maxPEM = 1 << 20

// loadPair is tls.LoadX509KeyPair for files that must be regular files of at
// most maxPEM bytes: a FIFO, a device or a directory is refused at once,
// without blocking on it.
func loadPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := readRegular(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := readRegular(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(cert, key)
}

// readRegular reads name, which must be a regular file of at most maxPEM
// bytes. It opens without blocking (O_NONBLOCK: a FIFO's open would wait for
// a writer) and checks what it opened.
func readRegular(name string) ([]byte, error) {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", name, fi.Mode().Type())
	}
	if fi.Size() > maxPEM {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", name, fi.Size(), maxPEM)
	}
	return io.ReadAll(io.LimitReader(f, maxPEM+1))
}
