package ciliumnode

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

const (
	defaultTokenFile      = kubeapi.DefaultTokenFile
	defaultCAFile         = kubeapi.DefaultCAFile
	defaultResync         = 5 * time.Minute
	defaultWatchTimeout   = 2 * time.Minute
	defaultRequestTimeout = 30 * time.Second

	apiVersion = "cilium.io/v2"
	kind       = "CiliumNode"
	listKind   = "CiliumNodeList"
	resource   = "/apis/cilium.io/v2/ciliumnodes"

	maxBody = 4 << 20 // a GET's body, and one object of a list or a watch; etcd caps objects at 1.5 MiB
)

// Config for reading CiliumNodes: one node's with New, every node's with NewPeers.
type Config struct {
	// Server is the API server's URL, https://host:port. InClusterConfig fills it from
	// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT.
	Server string
	// NodeName names the CiliumNode (the Kubernetes node's name) that a Source reads; it must
	// be a DNS subdomain. NewPeers ignores it: a PeerSource reads every node.
	NodeName string
	// TokenFile holds the bearer token. It is read again before every request because the
	// kubelet rotates it. Default /var/run/secrets/kubernetes.io/serviceaccount/token.
	TokenFile string
	// CAFile holds the PEM certificates that verify the server, read once by New and NewPeers.
	// Default /var/run/secrets/kubernetes.io/serviceaccount/ca.crt. Unused when HTTPClient is
	// set.
	CAFile string
	// Resync is how often a Source reads its object again in full (a GET, then a fresh watch),
	// even while the watch is healthy. Default 5m. A PeerSource ignores it: it never re-reads
	// every node while its watch is healthy (see the package doc).
	Resync time.Duration
	// WatchTimeout restarts a watch that delivers no bytes, not even a bookmark, for this long.
	// API servers send a bookmark about once a minute. Default 2m; for a Source, a value of
	// Resync or more leaves hang detection to the resync.
	WatchTimeout time.Duration
	// RequestTimeout bounds a GET, and each page of a PeerSource's list. Default 30s.
	RequestTimeout time.Duration
	// Backoff spaces the retries after failures; it is reset after a success and used by Run's
	// goroutine only, so two sources must not share one. Default
	// backoff.NewExponentialBackOff(backoff.WithMaxElapsedTime(0)) (about 0.5 s, doubling up to
	// 1 min, never giving up).
	Backoff backoff.BackOff
	// Logger receives failures (warn), registration waits and deletions; default discard.
	Logger *slog.Logger
	// HTTPClient replaces the client that New and NewPeers build from CAFile (for tests). It
	// must not set a Timeout, since a watch is a long request. Its CheckRedirect is
	// replaced: no redirect is ever followed.
	HTTPClient *http.Client
}

// InClusterConfig returns the Config of a pod's service account for nodeName: the API server
// from KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, and the default token and CA files.
func InClusterConfig(nodeName string) (Config, error) {
	server, err := kubeapi.InClusterServer()
	if err != nil {
		return Config{}, fmt.Errorf("ciliumnode: %w", err)
	}
	return Config{
		Server:    server,
		NodeName:  nodeName,
		TokenFile: defaultTokenFile,
		CAFile:    defaultCAFile,
	}, nil
}

// settle checks cfg's common fields, fills in their defaults and returns the server URL
// without a trailing slash. It does not look at NodeName.
func settle(cfg *Config) (server string, err error) {
	if server, err = kubeapi.ParseServer(cfg.Server); err != nil {
		return "", fmt.Errorf("ciliumnode: %w", err)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"Resync", &cfg.Resync, defaultResync},
		{"WatchTimeout", &cfg.WatchTimeout, defaultWatchTimeout},
		{"RequestTimeout", &cfg.RequestTimeout, defaultRequestTimeout},
	} {
		switch {
		case *d.v < 0:
			return "", fmt.Errorf("ciliumnode: negative %s %v", d.name, *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if cfg.TokenFile == "" {
		cfg.TokenFile = defaultTokenFile
	}
	if cfg.CAFile == "" {
		cfg.CAFile = defaultCAFile
	}
	if cfg.Backoff == nil {
		cfg.Backoff = backoff.NewExponentialBackOff(backoff.WithMaxElapsedTime(0))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return server, nil
}

// httpClient returns cfg.HTTPClient, or a new client that trusts cfg.CAFile; own reports
// whether the client is new (its idle connections are then closed when Run returns).
func httpClient(cfg Config) (c *http.Client, own bool, err error) {
	if cfg.HTTPClient != nil {
		return kubeapi.NoRedirects(cfg.HTTPClient), false, nil
	}
	if c, err = kubeapi.NewHTTPClient(cfg.CAFile); err != nil {
		return nil, false, fmt.Errorf("ciliumnode: %w", err)
	}
	return c, true, nil
}

// validNodeName checks that name is a DNS subdomain (RFC 1123), as Kubernetes node names are.
func validNodeName(name string) error {
	if name == "" {
		return errors.New("ciliumnode: empty node name")
	}
	if len(name) > 253 {
		return fmt.Errorf("ciliumnode: invalid node name %.20q...: longer than 253 characters", name)
	}
	for label := range strings.SplitSeq(name, ".") {
		ok := label != "" && alnum(label[0]) && alnum(label[len(label)-1])
		for i := 0; ok && i < len(label); i++ {
			ok = alnum(label[i]) || label[i] == '-'
		}
		if !ok {
			return fmt.Errorf("ciliumnode: invalid node name %q: not a DNS subdomain (lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit)", name)
		}
	}
	return nil
}

func alnum(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' }
