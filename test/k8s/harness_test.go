//go:build linux

package k8s

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/test/k8s/depbuild"
)

// Addresses inside the apihost namespace. The namespace is private, so the
// ports are always free.
const (
	apiAddr    = "192.0.2.1" // TEST-NET-1, on the apihost bridge
	apiPrefix  = 24
	apiPort    = "6443"
	etcdClient = "http://127.0.0.1:2379"
	etcdPeer   = "http://127.0.0.1:2380"
)

// strict reports whether skips must fail instead (CI sets it).
func strict() bool { return os.Getenv("MARKSPLIT_KERNEL_TESTS") == "1" }

// skipOrFail skips t with reason, or fails it when MARKSPLIT_KERNEL_TESTS=1.
func skipOrFail(t testing.TB, reason string) {
	t.Helper()
	if strict() {
		t.Fatalf("MARKSPLIT_KERNEL_TESTS=1 but %s", reason)
	}
	t.Skip(reason)
}

// missing is a prerequisite that is absent: the test skips, or fails under
// MARKSPLIT_KERNEL_TESTS=1. Any other setup error always fails.
type missing struct{ reason string }

func (m *missing) Error() string { return m.reason }

// cluster is the shared world of the package's tests: the built binaries, the
// apihost namespace, etcd, the API server and the admin client. TestMain owns
// it; tests reach it through need and needAgent.
type cluster struct {
	id   string // distinguishes this run's namespaces: the test process's pid
	repo string // repository root
	dir  string // working directory, removed at the end

	startOnce sync.Once
	startErr  error

	agentOnce sync.Once
	agentBin  string
	agentErr  error

	mu      sync.Mutex
	seq     int
	unready []window // while the API server was stopped or starting

	apihost   string // namespace name
	etcdBin   string // etcd binary
	apiBin    string // kube-apiserver binary
	apiArgs   []string
	etcd      *proc
	apiserver *proc
	admin     *kube
	rbac      []object // deploy/rbac.yaml, as applied
	sa        object   // its ServiceAccount
}

// the is the cluster of this test binary, set up by TestMain.
var the *cluster

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	c := &cluster{id: strconv.Itoa(os.Getpid())}
	the = c
	removeStale()

	// An interrupted run still stops what it started.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "test/k8s: %v: stopping the cluster\n", s)
		c.close()
		os.Exit(1)
	}()

	defer c.close()
	return m.Run()
}

// need returns the running cluster, starting it on first use. It skips (or
// fails) t when a prerequisite is missing.
func need(t testing.TB) *cluster {
	t.Helper()
	c := the
	if testing.Short() {
		t.Skip("starts a real kube-apiserver; skipped with -short")
	}
	c.startOnce.Do(func() {
		start := time.Now()
		c.startErr = c.start()
		if c.startErr == nil {
			t.Logf("cluster up in %s", time.Since(start).Round(time.Millisecond))
		}
	})
	var m *missing
	if errors.As(c.startErr, &m) {
		skipOrFail(t, m.reason)
	}
	if c.startErr != nil {
		t.Fatalf("cluster: %v", c.startErr)
	}
	return c
}

// needAgent returns the path of the marksplit binary built from ./agent.
func needAgent(t testing.TB) string {
	t.Helper()
	c := need(t)
	c.agentOnce.Do(func() { c.agentBin, c.agentErr = c.buildAgent() })
	var m *missing
	if errors.As(c.agentErr, &m) {
		skipOrFail(t, m.reason)
	}
	if c.agentErr != nil {
		t.Fatalf("agent: %v", c.agentErr)
	}
	return c.agentBin
}

func (c *cluster) start() error {
	if os.Geteuid() != 0 {
		return &missing{"not root: the tests need network namespaces"}
	}
	for _, bin := range []string{"ip", "go"} {
		if _, err := exec.LookPath(bin); err != nil {
			return &missing{fmt.Sprintf("%s not found on PATH", bin)}
		}
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		return err
	}
	if b, err := os.ReadFile(filepath.Join(repo, "go.mod")); err != nil || !bytes.Contains(b, []byte("module github.com/marksplit/marksplit\n")) {
		return fmt.Errorf("../.. is not the marksplit repository (run the tests from test/k8s)")
	}
	c.repo = repo
	rbacPath := filepath.Join(repo, "deploy", "rbac.yaml")
	rbacYAML, err := os.ReadFile(rbacPath)
	if errors.Is(err, os.ErrNotExist) {
		return &missing{"deploy/rbac.yaml does not exist yet"}
	}
	if err != nil {
		return err
	}
	if c.rbac, err = parseManifests(rbacYAML); err != nil {
		return fmt.Errorf("deploy/rbac.yaml: %w", err)
	}
	if c.sa, err = serviceAccountOf(c.rbac); err != nil {
		return fmt.Errorf("deploy/rbac.yaml: %w", err)
	}

	c.dir = filepath.Join(os.TempDir(), "marksplit-k8s-"+c.id)
	if err := os.RemoveAll(c.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(c.dir, "pki"), 0o700); err != nil {
		return err
	}

	// Network namespaces first: they are the cheapest prerequisite to test.
	c.apihost, err = c.newNetns("api")
	if err != nil {
		return &missing{fmt.Sprintf("network namespaces not permitted: %v", err)}
	}
	if err := ipBatch(c.apihost,
		"link add k8sbr type bridge",
		fmt.Sprintf("addr add %s/%d dev k8sbr", apiAddr, apiPrefix),
		"link set k8sbr up",
	); err != nil {
		return err
	}

	if c.etcdBin, c.apiBin, err = buildDeps(); err != nil {
		return err
	}
	if err := c.writeConfig(); err != nil {
		return err
	}
	if err := c.startEtcd(); err != nil {
		return err
	}
	c.admin = newKube(c.apihost, c.caFile(), adminToken)
	if err := c.startAPIServer(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.admin.createCRD(ctx); err != nil {
		return err
	}
	for _, o := range c.rbac {
		if err := c.admin.create(ctx, o); err != nil {
			return fmt.Errorf("apply deploy/rbac.yaml: %w", err)
		}
	}
	// Cilium's configuration with node encryption on, as the agent's
	// --encryption=auto needs it (ciliumconfig_test.go).
	if err := c.admin.createCiliumConfig(ctx, "true"); err != nil {
		return err
	}
	// Prove the token path once here, so a broken TokenRequest fails setup
	// with a clear error instead of every test.
	if _, err := c.token(ctx); err != nil {
		return err
	}
	return nil
}

// close stops and removes everything start created. Safe to call twice.
func (c *cluster) close() {
	c.stopAPIServer()
	if c.etcd != nil {
		c.etcd.stop(10 * time.Second)
		c.etcd = nil
	}
	removeNetnsWithPrefix("msk8s-" + c.id + "-")
	if c.dir != "" {
		os.RemoveAll(c.dir)
		c.dir = ""
	}
}

// removeStale removes namespaces and working directories of earlier runs
// whose process is gone (a run killed before it could clean up).
func removeStale() {
	alive := func(pid string) bool {
		_, err := os.Stat(filepath.Join("/proc", pid))
		return err == nil
	}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		parts := strings.SplitN(e.Name(), "-", 3)
		if len(parts) == 3 && parts[0] == "msk8s" && !alive(parts[1]) {
			exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "marksplit-k8s-*"))
	for _, d := range dirs {
		if pid := strings.TrimPrefix(filepath.Base(d), "marksplit-k8s-"); !alive(pid) {
			os.RemoveAll(d)
		}
	}
	depbuild.RemoveStale(depbuild.CacheDir())
}

// adminToken authenticates the harness itself (system:masters) through
// --token-auth-file. It never leaves the private namespace.
const adminToken = "marksplit-k8s-test-admin"

func (c *cluster) caFile() string { return filepath.Join(c.dir, "pki", "apiserver.crt") }

func (c *cluster) writeConfig() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"sa.key":     pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
		"sa.pub":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}),
		"tokens.csv": []byte(adminToken + ",admin,admin,system:masters\n"),
		// Every request of a service account, so tests can see what the
		// agent asked and what it was answered.
		"audit-policy.yaml": []byte(`apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
`),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(c.dir, name), b, 0o600); err != nil {
			return err
		}
	}
	c.apiArgs = []string{
		"--etcd-servers=" + etcdClient,
		"--bind-address=" + apiAddr,
		"--advertise-address=" + apiAddr,
		"--secure-port=" + apiPort,
		"--cert-dir=" + filepath.Join(c.dir, "pki"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(c.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(c.dir, "sa.key"),
		"--authorization-mode=RBAC",
		"--token-auth-file=" + filepath.Join(c.dir, "tokens.csv"),
		"--service-cluster-ip-range=10.96.0.0/12",
		"--audit-policy-file=" + filepath.Join(c.dir, "audit-policy.yaml"),
		"--audit-log-path=" + c.auditLog(),
		"--audit-log-mode=blocking",
	}
	return nil
}

func (c *cluster) auditLog() string { return filepath.Join(c.dir, "audit.log") }

func (c *cluster) startEtcd() error {
	p, err := startProc("etcd", filepath.Join(c.dir, "etcd.log"), nil,
		"ip", "netns", "exec", c.apihost, c.etcdBin,
		"--name=default",
		"--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+etcdClient,
		"--advertise-client-urls="+etcdClient,
		"--listen-peer-urls="+etcdPeer,
		"--initial-advertise-peer-urls="+etcdPeer,
		"--initial-cluster=default="+etcdPeer,
	)
	if err != nil {
		return err
	}
	c.etcd = p
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := httpClientIn(c.apihost, nil)
	return poll(ctx, 100*time.Millisecond, func() error {
		if p.exited() {
			return stopPolling(fmt.Errorf("etcd exited: %v\n%s", p.waitErr(), p.tail(20)))
		}
		resp, err := hc.Get(etcdClient + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	})
}

// startAPIServer starts kube-apiserver (again, after stopAPIServer) and
// waits until /readyz answers ok.
func (c *cluster) startAPIServer() error {
	c.setReady(false)
	args := append([]string{"netns", "exec", c.apihost, c.apiBin}, c.apiArgs...)
	p, err := startProc("kube-apiserver", filepath.Join(c.dir, "kube-apiserver.log"), nil, "ip", args...)
	if err != nil {
		return err
	}
	c.apiserver = p
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	err = poll(ctx, 100*time.Millisecond, func() error {
		if p.exited() {
			return stopPolling(fmt.Errorf("kube-apiserver exited: %v\n%s", p.waitErr(), p.tail(30)))
		}
		code, body, err := c.admin.do(ctx, "GET", "/readyz", nil)
		if err != nil {
			return err
		}
		if code != 200 {
			return fmt.Errorf("/readyz: %d %s", code, body)
		}
		return nil
	})
	if err == nil {
		c.setReady(true)
	}
	return err
}

// window is a span of time; a zero to means it has not ended.
type window struct{ from, to time.Time }

// setReady opens (false) or closes (true) a window of c.unready.
func (c *cluster) setReady(ready bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	open := len(c.unready) > 0 && c.unready[len(c.unready)-1].to.IsZero()
	switch {
	case ready && open:
		c.unready[len(c.unready)-1].to = time.Now()
	case !ready && !open:
		c.unready = append(c.unready, window{from: time.Now()})
	}
}

// wasUnready reports whether the API server was stopped or not yet ready at
// ts. A starting API server denies requests (403) until its RBAC cache has
// synced; that says nothing about the ClusterRole.
func (c *cluster) wasUnready(ts time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.unready {
		if !ts.Before(w.from) && (w.to.IsZero() || !ts.After(w.to)) {
			return true
		}
	}
	return false
}

// stopAPIServer stops kube-apiserver and waits until it has exited.
func (c *cluster) stopAPIServer() {
	c.setReady(false)
	if c.apiserver != nil {
		c.apiserver.stop(10 * time.Second)
		c.apiserver = nil
	}
}

// buildDeps returns the etcd and kube-apiserver binaries, building them
// into the cache first when needed (depbuild; `make test` has usually done
// it already, showing its progress).
func buildDeps() (etcd, apiserver string, err error) {
	bins := map[string]string{}
	for _, p := range depbuild.Programs(".") {
		if p.Name == "helm" {
			continue // only the tests that run helm build it (helmBin)
		}
		if bins[p.Name], err = p.Build(os.Stderr, 30*time.Second); err != nil {
			return "", "", err
		}
	}
	return bins["etcd"], bins["kube-apiserver"], nil
}

// helmBin returns the helm client built from ./helm (depbuild), building
// it first when it is not cached.
func helmBin() (string, error) {
	for _, p := range depbuild.Programs(".") {
		if p.Name == "helm" {
			return p.Build(os.Stderr, 30*time.Second)
		}
	}
	return "", errors.New("depbuild has no helm")
}

// buildAgent builds ./agent of the repository.
func (c *cluster) buildAgent() (string, error) {
	if _, err := os.Stat(filepath.Join(c.repo, "agent")); errors.Is(err, os.ErrNotExist) {
		return "", &missing{"./agent does not exist yet: the marksplit binary cannot be built"}
	}
	bin := filepath.Join(c.dir, "marksplit")
	if err := goBuild(c.repo, bin, "./agent"); err != nil {
		return "", fmt.Errorf("go build ./agent (the end-to-end tests need the marksplit binary): %w", err)
	}
	return bin, nil
}

func goBuild(dir, out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	// A test binary killed by -timeout takes the build with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w\n%s", err, b)
	}
	return nil
}

// proc is a process started in its own process group, so that stop reaches
// everything it started. It also dies with the test process (Pdeathsig).
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid after done is closed
}

func startProc(name, logPath string, env []string, argv0 string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(argv0, args...)
	cmd.Stdout = f
	cmd.Stderr = f
	if env != nil {
		cmd.Env = env
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) waitErr() error {
	<-p.done
	return p.err
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and
// waits for the process. It reports whether the process exited within grace.
func (p *proc) stop(grace time.Duration) bool {
	if p.exited() {
		return true // its group may be gone and its id reused: signal nothing
	}
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
		return false
	}
}

// output returns everything the process has written.
func (p *proc) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// tail returns the last n lines the process has written.
func (p *proc) tail(n int) string {
	lines := strings.Split(strings.TrimRight(p.output(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// errStop wraps an error that ends poll at once.
type errStop struct{ err error }

func (e errStop) Error() string { return e.err.Error() }

func stopPolling(err error) error { return errStop{err} }

// poll calls cond every interval until it returns nil, returns an error made
// with stopPolling, or ctx ends; then it returns cond's last error.
func poll(ctx context.Context, interval time.Duration, cond func() error) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		var s errStop
		if errors.As(err, &s) {
			return s.err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %v", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// eventually fails t unless cond returns nil within timeout.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	if err := poll(ctx, 50*time.Millisecond, cond); err != nil {
		t.Fatalf("%s: not within %s: %v", what, timeout, err)
	}
	took := time.Since(start)
	t.Logf("%s: %s", what, took.Round(time.Millisecond))
	return took
}
