package apitest

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	resource       = "/apis/cilium.io/v2/ciliumnodes"
	defaultToken   = "apitest-token"
	defaultHistory = 10000
	maxSnapshots   = 16 // lists whose continue tokens stay valid
)

// Options configure a Server. The zero value serves HTTP/2 on a new loopback port, accepts
// the token "apitest-token", keeps 10,000 events of history, sends no periodic bookmarks
// and never ends a watch by itself.
type Options struct {
	// Token is the bearer token the server accepts; default "apitest-token".
	Token string
	// Listener is where to serve (for example one opened inside a network namespace);
	// default a new listener on 127.0.0.1:0. The server closes it.
	Listener net.Listener
	// HTTP1 serves HTTP/1.1 only; by default the server speaks HTTP/2, as kube-apiserver.
	HTTP1 bool
	// MaxPageSize caps the items of a list page, whatever the client's limit; 0 means the
	// limit alone decides.
	MaxPageSize int
	// History is how many events are kept for watches that resume; a watch from before the
	// oldest kept event gets 410. Default 10,000.
	History int
	// BookmarkInterval sends a BOOKMARK this often on every watch that asked for bookmarks
	// (kube-apiserver: about once a minute); 0 sends none but those of Bookmark and deadlines.
	BookmarkInterval time.Duration
	// MinRequestTimeout ends a watch without timeoutSeconds after MinRequestTimeout × [1, 2),
	// as kube-apiserver's --min-request-timeout (1800 s) does; 0 never ends one.
	MinRequestTimeout time.Duration
	// Users maps the tokens a TokenReview authenticates to their user names; the caller of
	// the review itself needs Token.
	Users map[string]string
	// Extra is the user's extra of every authenticated TokenReview (a service account's
	// token carries its pod's name and the credential's id there); none when nil.
	Extra map[string][]string
	// Allowed lists, by user, the non-resource paths a SubjectAccessReview allows "get" on.
	Allowed map[string][]string
	// NoCiliumConfig starts the server without kube-system/cilium-config (configmap.go).
	NoCiliumConfig bool
}

// Kind is a kind of request, for counting and for faults.
type Kind string

// Kinds of requests.
const (
	KindList         Kind = "list"         // a page of a list of CiliumNodes
	KindWatch        Kind = "watch"        // a watch of every CiliumNode
	KindGet          Kind = "get"          // a GET of one CiliumNode
	KindWatchOne     Kind = "watch-one"    // a watch with fieldSelector metadata.name=
	KindListOne      Kind = "list-one"     // a list with fieldSelector metadata.name=
	KindUnauthorized Kind = "unauthorized" // refused for its token (401)
	KindTokenReview  Kind = "tokenreview"  // a TokenReview (POST)
	KindAccessReview Kind = "accessreview" // a SubjectAccessReview (POST)
	KindHandled      Kind = "handled"      // a request to a path of Handle
	KindOther        Kind = "other"        // anything else (answered 404, 405 or 400)
)

// Fault is a wrong answer to one request.
type Fault struct {
	// Code answers with this HTTP status and a Status object (500, 403, 404, 410, ...).
	Code int
	// Message is the Status message; default a message fitting Code.
	Message string
	// Body answers with this raw body instead (status Code, or 200 when Code is 0): garbage.
	// On a watch it is written after the 200 header, and the watch then ends.
	Body string
	// Drop breaks the connection (HTTP/1.1) or resets the stream (HTTP/2) without answering.
	Drop bool
	// Hang answers nothing at all (a watch: the 200 header, then nothing) until the client
	// gives up or the server closes.
	Hang bool
	// Location answers with a redirect there (status Code, default 302 Found), as
	// kube-apiserver never does: a client must not follow it.
	Location string
}

// Server is a stand-in Kubernetes API server for CiliumNodes. Create it with Start or New.
type Server struct {
	opts    Options
	srv     *httptest.Server
	creds   credentials
	closing chan struct{}
	closed  sync.Once

	mu         sync.Mutex
	token      string
	rv         uint64
	nodes      map[string]*object
	events     []event // the history, by rv
	compacted  uint64  // events up to this rv are forgotten: older watches get 410
	changed    chan struct{}
	watchers   map[*watcher]struct{}
	hang       bool
	down       bool
	faults     map[Kind][]Fault
	counts     map[Kind]int
	snapshots  map[uint64]*snapshot
	nextSnap   uint64
	endless    bool   // SetEndlessList
	pages      uint64 // pages served endless
	handlers   map[string]http.Handler
	intercepts map[Kind]Interceptor
	configMaps map[string]*configMap // by namespace/name (configmap.go)
	cmChanged  chan struct{}         // closed at each change of configMaps
}

// Start serves a new Server.
func Start(opts Options) (*Server, error) {
	if opts.Token == "" {
		opts.Token = defaultToken
	}
	if opts.History <= 0 {
		opts.History = defaultHistory
	}
	ln := opts.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("apitest: listen: %w", err)
		}
	}
	var ip net.IP
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		ip = a.IP
	}
	creds, err := newCredentials(ip)
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{
		opts:       opts,
		creds:      creds,
		closing:    make(chan struct{}),
		token:      opts.Token,
		nodes:      map[string]*object{},
		changed:    make(chan struct{}),
		watchers:   map[*watcher]struct{}{},
		faults:     map[Kind][]Fault{},
		counts:     map[Kind]int{},
		snapshots:  map[uint64]*snapshot{},
		handlers:   map[string]http.Handler{},
		intercepts: map[Kind]Interceptor{},
		rv:         1000, // resourceVersions are opaque; starting high catches clients that assume small ones
		configMaps: map[string]*configMap{},
		cmChanged:  make(chan struct{}),
	}
	s.handlers[configMapsPrefix] = http.HandlerFunc(s.serveConfigMaps)
	if !opts.NoCiliumConfig {
		s.SetConfigMap("kube-system", "cilium-config", CiliumConfigData())
	}
	s.srv = &httptest.Server{
		Listener:    ln,
		EnableHTTP2: !opts.HTTP1,
		Config: &http.Server{
			Handler:  s,
			ErrorLog: log.New(io.Discard, "", 0), // TLS handshake errors of clients that distrust the CA
		},
		TLS: &tls.Config{Certificates: []tls.Certificate{creds.cert}},
	}
	s.srv.StartTLS()
	return s, nil
}

// New is Start for a test: it fails tb on error and closes the server when the test ends.
func New(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := Start(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Close ends every watch, cuts every connection and stops the server; it waits for the
// handlers to return. Safe to call twice.
func (s *Server) Close() {
	s.closed.Do(func() {
		close(s.closing)
		s.srv.CloseClientConnections()
		s.srv.Close()
	})
}

// URL returns https://host:port.
func (s *Server) URL() string { return s.srv.URL }

// HostPort returns the server's address as KUBERNETES_SERVICE_HOST and _PORT say it.
func (s *Server) HostPort() (host, port string) {
	host, port, _ = net.SplitHostPort(s.srv.Listener.Addr().String())
	return host, port
}

// Env returns KUBERNETES_SERVICE_HOST=… and KUBERNETES_SERVICE_PORT=… for a child process.
func (s *Server) Env() []string {
	host, port := s.HostPort()
	return []string{"KUBERNETES_SERVICE_HOST=" + host, "KUBERNETES_SERVICE_PORT=" + port}
}

// CAPEM returns the PEM of the CA that signed the serving certificate: the ca.crt a client
// must trust.
func (s *Server) CAPEM() []byte { return slices.Clone(s.creds.caPEM) }

// Client returns an HTTP client that trusts the server's CA (and sends no token).
func (s *Server) Client() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.creds.caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: !s.opts.HTTP1}
	return &http.Client{Transport: tr}
}

// Token returns the token the server accepts now.
func (s *Server) Token() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.token
}

// SetToken makes the server accept only token from now on; requests already running go on.
func (s *Server) SetToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token = token
}

// WriteServiceAccount writes the accepted token and the CA into dir as "token" and
// "ca.crt", the files the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount.
func (s *Server) WriteServiceAccount(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("apitest: %w", err)
	}
	if err := writeAtomic(filepath.Join(dir, "ca.crt"), s.creds.caPEM); err != nil {
		return err
	}
	return WriteToken(dir, s.Token())
}

// RotateToken makes the server accept only token and writes it into dir, as the kubelet
// rotates a projected token (the old token stops working first, as when it expires).
func (s *Server) RotateToken(dir, token string) error {
	s.SetToken(token)
	return WriteToken(dir, token)
}

// WriteToken writes token into dir/token the way the kubelet replaces it: a new file renamed
// into place, so that a reader never sees half a token.
func WriteToken(dir, token string) error {
	return writeAtomic(filepath.Join(dir, "token"), []byte(token+"\n"))
}

func writeAtomic(name string, data []byte) error {
	tmp := name + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("apitest: %w", err)
	}
	if err := os.Rename(tmp, name); err != nil {
		return fmt.Errorf("apitest: %w", err)
	}
	return nil
}

// Count returns how many requests of kind the server received.
func (s *Server) Count(k Kind) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[k]
}

// Counts returns the request counts by kind.
func (s *Server) Counts() map[Kind]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.counts)
}

// ResetCounts sets every request count to zero.
func (s *Server) ResetCounts() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.counts)
}

// Inject queues faults for the next requests of kind, one fault a request, in order.
func (s *Server) Inject(kind Kind, faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[kind] = append(s.faults[kind], faults...)
}

// SetEndlessList, while on, makes every page of a list end with a new continue token, the
// pages cycling through the objects again and again: a broken or hostile server whose list
// never ends.
func (s *Server) SetEndlessList(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endless = on
}

// SetDown makes every request fail, its connection cut without an answer, while down is
// true: an API server that is gone.
func (s *Server) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// Handle makes h answer the requests, of any method, to path (or under it, when path ends
// with "/") that the server itself does not serve: an API the server does not model, or a
// hostile answer a test writes itself. The server still checks the token, counts the
// requests as KindHandled and answers the faults injected for KindHandled first. A nil h
// removes the handler.
func (s *Server) Handle(path string, h http.Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h == nil {
		delete(s.handlers, path)
		return
	}
	s.handlers[path] = h
}

// An Interceptor sees a request before the server answers it: it answers the request
// itself (a hostile or failing answer), or calls next for the server's answer, before or
// after whatever it does (hold the request, count the requests under way, read the body:
// it then hands next a request with the body put back).
type Interceptor func(w http.ResponseWriter, r *http.Request, next http.Handler)

// Intercept makes f see every request of kind that has no fault injected for it, until
// Intercept(kind, nil); the requests refused for their token are of KindUnauthorized
// (next answers 401). The request is counted before f sees it.
func (s *Server) Intercept(kind Kind, f Interceptor) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		delete(s.intercepts, kind)
		return
	}
	s.intercepts[kind] = f
}

// handlerLocked returns the handler of Handle for path, the longest match first.
func (s *Server) handlerLocked(path string) http.Handler {
	if h := s.handlers[path]; h != nil {
		return h
	}
	var best string
	for p := range s.handlers {
		if strings.HasSuffix(p, "/") && strings.HasPrefix(path, p) && len(p) > len(best) {
			best = p
		}
	}
	return s.handlers[best]
}

// ServeHTTP answers a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind, name, fieldName, err := classify(r)
	s.mu.Lock()
	var handler http.Handler
	if kind == KindOther {
		if handler = s.handlerLocked(r.URL.Path); handler != nil {
			kind, err = KindHandled, nil
		}
	}
	down := s.down
	authorized := r.Header.Get("Authorization") == "Bearer "+s.token
	if !authorized {
		kind = KindUnauthorized
	}
	s.counts[kind]++
	var fault *Fault
	if q := s.faults[kind]; authorized && len(q) > 0 {
		fault = &q[0]
		s.faults[kind] = q[1:]
	}
	intercept := s.intercepts[kind]
	s.mu.Unlock()

	switch {
	case down:
		panic(http.ErrAbortHandler)
	case authorized && err != nil:
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	case fault != nil:
		s.fault(w, r, kind, *fault)
		return
	}
	answer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.answer(w, r, kind, name, fieldName, handler)
	})
	if intercept != nil {
		intercept(w, r, answer)
		return
	}
	answer(w, r)
}

// answer gives the server's own answer to a request of kind.
func (s *Server) answer(w http.ResponseWriter, r *http.Request, kind Kind, name, fieldName string, handler http.Handler) {
	switch kind {
	case KindUnauthorized:
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
	case KindGet:
		s.get(w, name)
	case KindList, KindListOne:
		s.list(w, r, fieldName)
	case KindWatch, KindWatchOne:
		s.watch(w, r, fieldName)
	case KindTokenReview:
		s.tokenReview(w, r)
	case KindAccessReview:
		s.subjectAccessReview(w, r)
	case KindHandled:
		handler.ServeHTTP(w, r)
	default:
		if r.Method != http.MethodGet {
			writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "the server does not allow this method on the requested resource")
			return
		}
		writeStatus(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
	}
}

// classify says what a request is. fieldName is the name of a metadata.name field selector.
func classify(r *http.Request) (kind Kind, name, fieldName string, err error) {
	switch r.URL.Path {
	case tokenReviewsPath:
		return KindTokenReview, "", "", nil
	case subjectAccessReviewsPath:
		return KindAccessReview, "", "", nil
	}
	if r.Method != http.MethodGet {
		return KindOther, "", "", nil
	}
	q := r.URL.Query()
	if fs := q.Get("fieldSelector"); fs != "" {
		v, ok := strings.CutPrefix(fs, "metadata.name==")
		if !ok {
			v, ok = strings.CutPrefix(fs, "metadata.name=")
		}
		if !ok || v == "" || strings.ContainsAny(v, ",=!") {
			return KindOther, "", "", fmt.Errorf("unsupported field selector %q (only metadata.name=NAME)", fs)
		}
		fieldName = v
	}
	watch := q.Get("watch") == "1" || q.Get("watch") == "true"
	switch {
	case r.URL.Path == resource && watch && fieldName != "":
		return KindWatchOne, "", fieldName, nil
	case r.URL.Path == resource && watch:
		return KindWatch, "", "", nil
	case r.URL.Path == resource && fieldName != "":
		return KindListOne, "", fieldName, nil
	case r.URL.Path == resource:
		return KindList, "", "", nil
	}
	if n, ok := strings.CutPrefix(r.URL.Path, resource+"/"); ok && n != "" && !strings.Contains(n, "/") {
		return KindGet, n, "", nil
	}
	return KindOther, "", "", nil
}

func (s *Server) fault(w http.ResponseWriter, r *http.Request, kind Kind, f Fault) {
	watch := kind == KindWatch || kind == KindWatchOne
	switch {
	case f.Drop:
		panic(http.ErrAbortHandler)
	case f.Location != "":
		code := f.Code
		if code == 0 {
			code = http.StatusFound
		}
		http.Redirect(w, r, f.Location, code)
	case f.Hang:
		if watch {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
	case f.Body != "":
		code := f.Code
		if code == 0 {
			code = http.StatusOK
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		io.WriteString(w, f.Body)
	default:
		msg := f.Message
		if msg == "" {
			msg = defaultMessage(f.Code)
		}
		writeStatus(w, f.Code, reason(f.Code), msg)
	}
}

func reason(code int) string {
	switch code {
	case http.StatusGone:
		return "Expired"
	case http.StatusInternalServerError:
		return "InternalError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailable"
	case http.StatusGatewayTimeout:
		return "Timeout"
	}
	return strings.ReplaceAll(http.StatusText(code), " ", "")
}

func defaultMessage(code int) string {
	switch code {
	case http.StatusGone:
		return "too old resource version"
	case http.StatusForbidden:
		return `ciliumnodes.cilium.io is forbidden: User "system:serviceaccount:kube-system:marksplit" cannot list resource "ciliumnodes" in API group "cilium.io" at the cluster scope`
	case http.StatusInternalServerError:
		return "Internal error occurred: etcdserver: request timed out"
	}
	return http.StatusText(code)
}

func writeStatus(w http.ResponseWriter, code int, reason, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	io.WriteString(w, statusJSON(code, reason, message))
}

// get answers a GET of one object.
func (s *Server) get(w http.ResponseWriter, name string) {
	s.mu.Lock()
	o := s.nodes[name]
	s.mu.Unlock()
	if o == nil {
		writeStatus(w, http.StatusNotFound, "NotFound", `ciliumnodes.cilium.io "`+name+`" not found`)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(o.json)
}

// Put adds n, or replaces the node of its name, and returns the resourceVersion of the
// ADDED or MODIFIED event.
func (s *Server) Put(n Node) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rv, err := s.putLocked(n)
	return strconv.FormatUint(rv, 10), err
}

// MustPut is Put for a test: it fails tb on error.
func (s *Server) MustPut(tb testing.TB, nodes ...Node) string {
	tb.Helper()
	var rv string
	for _, n := range nodes {
		var err error
		if rv, err = s.Put(n); err != nil {
			tb.Fatal(err)
		}
	}
	return rv
}

func (s *Server) putLocked(n Node) (uint64, error) {
	if n.Name == "" {
		return 0, errors.New("apitest: Put: a node without a name")
	}
	n = n.clone()
	rv := s.rv + 1
	js, err := render(n, rv)
	if err != nil {
		return 0, err
	}
	typ := "MODIFIED"
	if s.nodes[n.Name] == nil {
		typ = "ADDED"
	}
	o := &object{node: n, rv: rv, json: js}
	s.rv = rv
	s.nodes[n.Name] = o
	s.appendLocked(newEvent(typ, o))
	return rv, nil
}

// Update edits the node called name with edit and stores it (a MODIFIED event, even if edit
// changed nothing: a status update). It returns the event's resourceVersion, or false if
// there is no such node.
func (s *Server) Update(name string, edit func(*Node)) (string, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.nodes[name]
	if o == nil {
		return "", false, nil
	}
	n := o.node.clone()
	if edit != nil {
		edit(&n)
	}
	if n.Name != name {
		return "", true, fmt.Errorf("apitest: Update %q: the edit renamed it to %q", name, n.Name)
	}
	rv, err := s.putLocked(n)
	return strconv.FormatUint(rv, 10), true, err
}

// SetKey sets spec.encryption.key of the node called name (0: opt it out).
func (s *Server) SetKey(name string, key int64) (string, bool) {
	rv, ok, _ := s.Update(name, func(n *Node) { n.Key = key })
	return rv, ok
}

// SetAddrs sets the InternalIPs of the node called name.
func (s *Server) SetAddrs(name string, ips ...string) (string, bool) {
	rv, ok, _ := s.Update(name, func(n *Node) { n.InternalIPs = slices.Clone(ips) })
	return rv, ok
}

// Touch stores the node called name unchanged: a MODIFIED event that changes nothing a
// reader keeps, as Cilium's status updates are.
func (s *Server) Touch(name string) (string, bool) {
	rv, ok, _ := s.Update(name, nil)
	return rv, ok
}

// Delete removes the node called name (a DELETED event) and returns the event's
// resourceVersion, or false if there is no such node.
func (s *Server) Delete(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.nodes[name]
	if o == nil {
		return "", false
	}
	rv := s.rv + 1
	js, err := render(o.node, rv)
	if err != nil {
		js = o.json // it rendered before
	}
	s.rv = rv
	delete(s.nodes, name)
	s.appendLocked(newEvent("DELETED", &object{node: o.node, rv: rv, json: js}))
	return strconv.FormatUint(rv, 10), true
}

// Replace makes the stored nodes exactly nodes: it puts each (ADDED or MODIFIED) and
// deletes the others, in one step no request sees half of. It returns the last
// resourceVersion.
func (s *Server) Replace(nodes ...Node) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := map[string]bool{}
	for _, n := range nodes {
		if _, err := s.putLocked(n); err != nil {
			return "", err
		}
		keep[n.Name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(s.nodes)) {
		if !keep[name] {
			o := s.nodes[name]
			s.rv++
			delete(s.nodes, name)
			s.appendLocked(newEvent("DELETED", &object{node: o.node, rv: s.rv, json: o.json}))
		}
	}
	return strconv.FormatUint(s.rv, 10), nil
}

// Get returns the node called name.
func (s *Server) Get(name string) (Node, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.nodes[name]
	if o == nil {
		return Node{}, false
	}
	return o.node.clone(), true
}

// Names returns the names of the stored nodes, sorted.
func (s *Server) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.nodes))
}

// Len returns the number of stored nodes.
func (s *Server) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.nodes)
}

// ResourceVersion returns the resourceVersion of the last change.
func (s *Server) ResourceVersion() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strconv.FormatUint(s.rv, 10)
}

// appendLocked adds ev to the history, drops what exceeds Options.History and wakes the
// watches.
func (s *Server) appendLocked(ev event) {
	s.events = append(s.events, ev)
	if over := len(s.events) - s.opts.History; over > 0 {
		s.compacted = s.events[over-1].rv
		s.events = slices.Delete(s.events, 0, over)
	}
	s.wakeLocked()
}

// Compact forgets the history and every continue token: a watch from any resourceVersion
// before now, and the next page of any list, get 410. Open watches are not affected.
func (s *Server) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.compacted = s.rv
	s.events = nil
	clear(s.snapshots)
}

// Restart does to the clients what an API server that restarted and lost its state (an
// etcd restored from a backup) does: every connection is cut (open watches and lists
// break), the history and continue tokens are gone, and a watch from any resourceVersion
// before the restart gets 410, so that clients list again. The objects stay; a test that
// wants them changed as well changes them after Restart.
func (s *Server) Restart() {
	s.mu.Lock()
	s.rv++
	s.compacted = s.rv
	s.events = nil
	clear(s.snapshots)
	s.mu.Unlock()
	s.srv.CloseClientConnections()
}
