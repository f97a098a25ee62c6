//go:build linux

package image

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
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

// The seed topology (scripts/demo.sh): a node at 10.0.0.5 on enp7s0 (MTU
// 1450) with its gateway 10.0.0.1 in a namespace of its own, the private
// network's route lowered to the tunnel MTU by the old shell loop, and a tun
// device standing in for Cilium's WireGuard link (MTU 1355).
const (
	peer      = "10.0.0.9"
	linkMTU   = 1450
	tunnelMTU = 1355
)

func seedTopology(node, gw string) [][]string {
	lines := []string{
		"-n " + node + " link set lo up",
		"-n " + gw + " link set lo up",
		"-n " + node + " link add enp7s0 mtu 1450 type veth peer name gw0 mtu 1450 netns " + gw,
		"-n " + gw + " addr add 10.0.0.1/16 dev gw0",
		"-n " + gw + " link set gw0 up",
		"-n " + node + " addr add 10.0.0.5/16 dev enp7s0 noprefixroute",
		"-n " + node + " link set enp7s0 up",
		"-n " + node + " route add 10.0.0.1 dev enp7s0 proto dhcp scope link src 10.0.0.5",
		"-n " + node + " route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5 mtu 1355",
		"-n " + node + " tuntap add mode tun name cilium_wg0",
		"-n " + node + " link set cilium_wg0 mtu 1355 up",
	}
	var out [][]string
	for _, l := range lines {
		out = append(out, strings.Fields(l))
	}
	return out
}

// world is one test's setting: the image, runc, and a node with its
// gateway in throwaway network namespaces.
type world struct {
	t        *testing.T
	dir      string
	runc     string
	runcRoot string
	layout   layoutArchive
	manifest manifestJSON
	image    imageConfig
	pod      pod
	node, gw string // network namespace names
}

var (
	seq      int
	seqMu    sync.Mutex
	runcOnce sync.Once
	runcPath string
	runcErr  error
	probe    struct {
		once sync.Once
		path string
		err  error
	}
)

// TestMain removes the probe binary the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if probe.path != "" {
		os.RemoveAll(filepath.Dir(probe.path))
	}
	os.Exit(code)
}

func next() int {
	seqMu.Lock()
	defer seqMu.Unlock()
	seq++
	return seq
}

// newWorld sets up a world or skips (fails under MARKSPLIT_KERNEL_TESTS=1)
// when a prerequisite is missing.
func newWorld(t *testing.T) *world {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "not root: the image test needs network namespaces and runc")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skipOrFail(t, "ip (iproute2) not found")
	}
	archive := os.Getenv("MARKSPLIT_IMAGE")
	if archive == "" {
		archive = filepath.Join("..", "..", "bin", "marksplit-image.tar")
	}
	if _, err := os.Stat(archive); err != nil {
		skipOrFail(t, fmt.Sprintf("no image archive at %s: `make test-image` builds it first (make image)", archive))
	}
	runcOnce.Do(func() { runcPath, runcErr = ensureRunc(t) })
	if runcErr != nil {
		skipOrFail(t, runcErr.Error())
	}

	w := &world{t: t, dir: t.TempDir(), runc: runcPath, pod: readPod(t)}
	w.runcRoot = filepath.Join(w.dir, "runc")
	var err error
	if w.layout, err = readLayout(archive); err != nil {
		t.Fatal(err)
	}
	if w.manifest, w.image, err = w.layout.image("linux", "amd64"); err != nil {
		t.Fatalf("%s: %v", archive, err)
	}

	removeStale()
	n := next()
	w.node = fmt.Sprintf("msimg-%d-%dnode", os.Getpid(), n)
	w.gw = fmt.Sprintf("msimg-%d-%dgw", os.Getpid(), n)
	if out, err := exec.Command("ip", "netns", "add", w.node).CombinedOutput(); err != nil {
		skipOrFail(t, fmt.Sprintf("network namespaces not permitted: ip netns add: %v: %s", err, bytes.TrimSpace(out)))
	}
	t.Cleanup(func() {
		exec.Command("ip", "netns", "del", w.node).Run()
		exec.Command("ip", "netns", "del", w.gw).Run()
	})
	if out, err := exec.Command("ip", "netns", "add", w.gw).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", w.gw, err, out)
	}
	for _, args := range seedTopology(w.node, w.gw) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return w
}

// removeStale removes the namespaces of earlier runs whose process is gone.
func removeStale() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		parts := strings.SplitN(e.Name(), "-", 3)
		if len(parts) != 3 || parts[0] != "msimg" {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", parts[1])); errors.Is(err, os.ErrNotExist) {
			exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
}

// ensureRunc returns runc's path, installing Debian's runc when it is
// missing.
func ensureRunc(t *testing.T) (string, error) {
	if p, err := exec.LookPath("runc"); err == nil {
		return p, nil
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", errors.New("runc not found, and no apt-get to install it with")
	}
	t.Log("runc not found: installing Debian's (apt-get install runc)")
	install := func() ([]byte, error) {
		cmd := exec.Command("apt-get", "install", "-y", "-q", "--no-install-recommends", "runc")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd.CombinedOutput()
	}
	if _, err := install(); err != nil {
		// A fresh machine's package lists may be empty or old.
		if out, err := exec.Command("apt-get", "update", "-q").CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get update: %v: %s", err, lastLines(out, 5))
		}
		if out, err := install(); err != nil {
			return "", fmt.Errorf("apt-get install runc: %v: %s", err, lastLines(out, 5))
		}
	}
	return exec.LookPath("runc")
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// agentRun is the agent's container as the DaemonSet declares it, with the
// cluster-less policy (doc.go) and the kubelet's mounts.
func (w *world) agentRun() run {
	c := w.pod.container
	envMap, env, err := w.pod.containerEnv("image-test-node")
	if err != nil {
		w.t.Fatal(err)
	}
	var args []string
	for _, a := range c.Args {
		args = append(args, expand(a, envMap))
	}
	// What the kubelet mounts into every container of such a pod: the
	// termination log and the service account (read-only).
	sa := filepath.Join(w.dir, "serviceaccount")
	termLog := filepath.Join(w.dir, "termination-log")
	if err := os.MkdirAll(sa, 0o755); err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(termLog, nil, 0o644); err != nil {
		w.t.Fatal(err)
	}
	mounts := []specs.Mount{
		{Destination: "/dev/termination-log", Type: "bind", Source: termLog, Options: []string{"rbind", "rprivate", "rw"}},
		{Destination: "/var/run/secrets/kubernetes.io/serviceaccount", Type: "bind", Source: sa, Options: []string{"rbind", "rprivate", "ro"}},
	}
	// The pod's emptyDir volumes (the health socket's directory), as the
	// kubelet makes them: mode 0777; a tmpfs for medium Memory.
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(w.pod.volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || w.pod.volumes[i].EmptyDir == nil {
			continue
		}
		mounts = append(mounts, specs.Mount{Destination: m.MountPath, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=777", "size=1m"}})
	}
	return run{
		pod:    w.pod,
		image:  w.image,
		args:   clusterless(args),
		env:    env,
		netns:  "/run/netns/" + w.node,
		mounts: mounts,
	}
}

// probeRun is r with the probe program as its process, bind-mounted
// read-only at /probe.
func (w *world) probeRun(r run) run {
	probe.once.Do(func() {
		dir, err := os.MkdirTemp("", "msimg-probe-")
		if err != nil {
			probe.err = err
			return
		}
		probe.path = filepath.Join(dir, "probe")
		cmd := exec.Command("go", "build", "-trimpath", "-o", probe.path, "./probe")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			probe.err = fmt.Errorf("build ./probe: %v: %s", err, out)
		}
	})
	if probe.err != nil {
		w.t.Fatal(probe.err)
	}
	r.process = []string{"/probe"}
	r.mounts = append(append([]specs.Mount(nil), r.mounts...),
		specs.Mount{Destination: "/probe", Type: "bind", Source: probe.path, Options: []string{"rbind", "rprivate", "ro"}})
	return r
}

// container is a runc container running in the foreground of `runc run`,
// whose exit code is the container process's.
type container struct {
	id   string
	w    *world
	spec *specs.Spec
	out  *syncBuffer
	cmd  *exec.Cmd
	done chan struct{}
	exit int // valid after done
}

// start unpacks a fresh root filesystem from the image, writes r's config
// and starts `runc run`. The container is deleted at the end of the test.
func (w *world) start(r run) *container {
	t := w.t
	t.Helper()
	spec, err := runtimeSpec(r)
	if err != nil {
		t.Fatalf("runtime config from %s: %v", manifestPath, err)
	}
	c := &container{id: fmt.Sprintf("msimg-%d-%d", os.Getpid(), next()), w: w, spec: spec, out: &syncBuffer{}, done: make(chan struct{})}
	bundle := filepath.Join(w.dir, c.id)
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.layout.unpack(w.manifest, filepath.Join(bundle, "rootfs")); err != nil {
		t.Fatal(err)
	}
	cfg, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	c.cmd = exec.Command(w.runc, "--root", w.runcRoot, "run", "--bundle", bundle, c.id)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	// runc dies with the test process. Pdeathsig fires when the thread that
	// forked it ends, and the runtime ends locked threads (dialIn's): so
	// fork from a thread locked for as long as runc runs.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := c.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.cmd.Wait() // its exit code is what counts
		c.exit = c.cmd.ProcessState.ExitCode()
		close(c.done)
	}()
	if err := <-started; err != nil {
		t.Fatalf("runc run: %v", err)
	}
	t.Cleanup(func() {
		exec.Command(w.runc, "--root", w.runcRoot, "kill", c.id, "KILL").Run()
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			c.cmd.Process.Kill()
			<-c.done
		}
		exec.Command(w.runc, "--root", w.runcRoot, "delete", "--force", c.id).Run()
		if t.Failed() {
			t.Logf("%s config.json:\n%s", c.id, cfg)
		}
	})
	return c
}

func (c *container) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// wait waits at most d for the container to exit and returns its exit code.
func (c *container) wait(d time.Duration) (int, error) {
	select {
	case <-c.done:
		return c.exit, nil
	case <-time.After(d):
		return 0, fmt.Errorf("still running after %s", d)
	}
}

// signal sends sig to the container's process through runc, as the
// kubelet's stop does through containerd.
func (c *container) signal(sig string) error {
	out, err := exec.Command(c.w.runc, "--root", c.w.runcRoot, "kill", c.id, sig).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runc kill %s %s: %v: %s", c.id, sig, err, bytes.TrimSpace(out))
	}
	return nil
}

// exec runs args in the container as the kubelet's exec probe does (runc
// exec: the container's user, capabilities, seccomp filter and root), and
// returns its output.
func (c *container) exec(args ...string) (string, error) {
	out, err := exec.Command(c.w.runc, append([]string{"--root", c.w.runcRoot, "exec", c.id}, args...)...).CombinedOutput()
	return string(bytes.TrimSpace(out)), err
}

// pid returns the container process's pid in the test's pid namespace.
func (c *container) pid() (int, error) {
	out, err := exec.Command(c.w.runc, "--root", c.w.runcRoot, "state", c.id).Output()
	if err != nil {
		return 0, fmt.Errorf("runc state %s: %v", c.id, err)
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return 0, err
	}
	if st.Status != "running" || st.Pid == 0 {
		return 0, fmt.Errorf("container %s is %s", c.id, st.Status)
	}
	return st.Pid, nil
}

// routeGet asks the node's kernel for the route to peer, with or without
// the encryption mark, as `ip route get` does.
func (w *world) routeGet(mark string) string {
	args := []string{"-n", w.node, "route", "get", peer}
	if mark != "" {
		args = append(args, "mark", mark)
	}
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		w.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.Join(strings.Fields(string(out)), " ")
}

// httpGet asks url from inside the node's network namespace, where the
// kubelet's probes (hostNetwork) reach the agent's loopback listener.
func (w *world) httpGet(url string) (int, error) {
	client := &http.Client{
		Timeout: 2 * time.Second,
		Transport: &http.Transport{
			DialContext:       dialIn("/run/netns/" + w.node),
			DisableKeepAlives: true,
		},
	}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// dialIn returns a dialer whose sockets are opened in the network namespace
// at nsPath: on a locked thread moved there, which the runtime discards
// when its goroutine ends.
func dialIn(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
			ns, err := os.Open(nsPath)
			if err != nil {
				ch <- result{nil, err}
				return
			}
			defer ns.Close()
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
				ch <- result{nil, fmt.Errorf("setns %s: %w", nsPath, err)}
				return
			}
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// procStatus returns the fields of /proc/PID/status.
func procStatus(pid int) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return nil, err
	}
	st := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			st[k] = strings.TrimSpace(v)
		}
	}
	return st, nil
}

// syncBuffer is a bytes.Buffer safe for a writing process and a reading
// test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// poll calls cond every 50 ms until it returns nil or, after 2 minutes (or
// d, if longer: only a hang reaches either), returns cond's last error. d is
// how long it takes on a quiet machine.
func poll(d time.Duration, cond func() error) error {
	d = max(d, 2*time.Minute)
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %w", d, err)
		}
		<-tick.C
	}
}
