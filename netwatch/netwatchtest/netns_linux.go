//go:build linux

package netwatchtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// kernelTestsEnv turns a skipped real-kernel test into a failed one: CI
// sets it to 1.
const kernelTestsEnv = "MARKSPLIT_KERNEL_TESTS"

// RequireKernel skips the test, with the reason, when real-kernel tests
// cannot run here: not root, network namespaces not permitted, or ip(8) or
// nsenter(1) missing. With MARKSPLIT_KERNEL_TESTS=1 it fails the test
// instead.
func RequireKernel(t testing.TB) {
	t.Helper()
	if reason := kernelUnavailable(); reason != "" {
		if os.Getenv(kernelTestsEnv) == "1" {
			t.Fatalf("netwatchtest: real-kernel test cannot run (%s) but %s=1", reason, kernelTestsEnv)
		}
		t.Skipf("netwatchtest: skipping real-kernel test: %s (set %s=1 to fail instead)", reason, kernelTestsEnv)
	}
}

func kernelUnavailable() string {
	if os.Geteuid() != 0 {
		return "not running as root"
	}
	for _, bin := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found in PATH"
		}
	}
	// Try an unshare on a thread that is thrown away afterwards.
	errc := make(chan error, 1)
	goLocked(func() { errc <- unix.Unshare(unix.CLONE_NEWNET) })
	if err := <-errc; err != nil {
		return "unshare(CLONE_NEWNET) not permitted: " + err.Error()
	}
	return ""
}

// NetNS is a fresh anonymous network namespace, held by a goroutine locked
// to an OS thread that lives in it. It goes away when the test ends.
type NetNS struct {
	fd   int
	path string
	work chan func()
	done chan struct{}
}

// NewNetNS creates a network namespace for the test (after
// RequireKernel) and removes it in t.Cleanup: the handle is closed and
// the thread that held the namespace exits.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	RequireKernel(t)
	ns, err := newNetNS()
	if err != nil {
		t.Fatalf("netwatchtest: %v", err)
	}
	t.Cleanup(ns.close)
	return ns
}

func newNetNS() (*NetNS, error) {
	ns := &NetNS{work: make(chan func()), done: make(chan struct{})}
	errc := make(chan error, 1)
	goLocked(func() {
		defer close(ns.done)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		tid := unix.Gettid()
		fd, err := unix.Open("/proc/self/task/"+strconv.Itoa(tid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open network namespace handle: %w", err)
			return
		}
		ns.fd = fd
		ns.path = "/proc/" + strconv.Itoa(os.Getpid()) + "/task/" + strconv.Itoa(tid) + "/ns/net"
		errc <- nil
		for fn := range ns.work {
			fn()
		}
	})
	if err := <-errc; err != nil {
		<-ns.done
		return nil, err
	}
	return ns, nil
}

// goLocked runs fn on a new goroutine locked to an OS thread that is not the
// process's main thread. The thread is never unlocked, so it ends with fn:
// whatever fn did to it (unshare) goes with it. The main thread is avoided
// because the runtime never ends it; it would stay in the namespace.
func goLocked(fn func()) { go runLocked(fn, nil) }

func runLocked(fn func(), locked chan<- struct{}) {
	runtime.LockOSThread()
	if locked != nil {
		close(locked)
	}
	if unix.Gettid() == unix.Getpid() {
		// Hold the main thread until another goroutine has a thread of
		// its own, then give the main thread back.
		next := make(chan struct{})
		go runLocked(fn, next)
		<-next
		runtime.UnlockOSThread()
		return
	}
	fn()
}

func (ns *NetNS) close() {
	close(ns.work)
	<-ns.done
	unix.Close(ns.fd)
}

// FD is the namespace's file descriptor, for netlink.Config.NetNS.
func (ns *NetNS) FD() int { return ns.fd }

// Path names the namespace in /proc, for nsenter --net=PATH; it is valid
// until the test ends.
func (ns *NetNS) Path() string { return ns.path }

// Do runs fn on the thread that lives in the namespace and returns its
// error. Goroutines that fn starts are not in the namespace.
func (ns *NetNS) Do(fn func() error) error {
	var err error
	ran := make(chan struct{})
	ns.work <- func() {
		defer close(ran)
		err = fn()
	}
	<-ran
	return err
}

// IP runs ip(8) with args inside the namespace, fails the test on error and
// returns its standard output.
func (ns *NetNS) IP(t testing.TB, args ...string) string {
	t.Helper()
	out, err := ns.ip(args...)
	if err != nil {
		t.Fatalf("netwatchtest: %v", err)
	}
	return out
}

// AddRoutes adds n /24 routes from 11.0.0.0/24 upwards to the main table,
// via gw out of dev with proto bgp, in one ip -batch: a BGP-sized table for
// benchmarks.
func (ns *NetNS) AddRoutes(t testing.TB, n int, gw, dev string) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "routes"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i := range n {
		a := 11<<24 + i<<8
		fmt.Fprintf(w, "route add %d.%d.%d.0/24 via %s dev %s proto bgp\n", a>>24, a>>16&0xff, a>>8&0xff, gw, dev)
	}
	err = w.Flush()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	ns.IP(t, "-batch", f.Name())
}

// IPJSON runs "ip -j" with args inside the namespace and decodes its output
// into v, failing the test on error.
func (ns *NetNS) IPJSON(t testing.TB, v any, args ...string) {
	t.Helper()
	out := ns.IP(t, append([]string{"-j"}, args...)...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("netwatchtest: decode output of ip -j %q: %v\n%s", args, err, out)
	}
}

func (ns *NetNS) ip(args ...string) (string, error) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.path, "ip"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ip %q: %w: %s", args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), nil
}

// LoUp brings the loopback link up.
func (ns *NetNS) LoUp(t testing.TB) {
	t.Helper()
	ns.IP(t, "link", "set", "dev", "lo", "up")
}

// AddVeth creates a veth pair: name in ns and peerName in peer (in ns too
// when peer is nil or ns). Both ends are left down.
func (ns *NetNS) AddVeth(t testing.TB, name string, peer *NetNS, peerName string) {
	t.Helper()
	args := []string{"link", "add", "name", name, "type", "veth", "peer", "name", peerName}
	if peer != nil && peer != ns {
		args = append(args, "netns", peer.path)
	}
	ns.IP(t, args...)
}

// AddTun creates a tun device (no process attaches to it, so it has no
// carrier when up).
func (ns *NetNS) AddTun(t testing.TB, name string) {
	t.Helper()
	ns.IP(t, "tuntap", "add", "mode", "tun", "name", name)
}

// LinkIndex returns the index of the link called name.
func (ns *NetNS) LinkIndex(t testing.TB, name string) uint32 {
	t.Helper()
	var links []struct {
		Index uint32 `json:"ifindex"`
	}
	ns.IPJSON(t, &links, "link", "show", "dev", name)
	if len(links) != 1 {
		t.Fatalf("netwatchtest: ip link show dev %s: %d links", name, len(links))
	}
	return links[0].Index
}
