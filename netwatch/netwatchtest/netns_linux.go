//go:build linux

package netwatchtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/marksplit/marksplit/internal/nstest"
	"github.com/marksplit/marksplit/netwatch"
	"golang.org/x/sys/unix"
)

// RequireKernel fails the test, with the reason, when real-kernel tests
// cannot run here: not root, network namespaces not permitted, or ip(8) or
// nsenter(1) missing. NewNetNS skips such a test instead; a test suite
// whose CI must not skip them calls RequireKernel first (this project's
// tests do when MARKSPLIT_KERNEL_TESTS=1).
func RequireKernel(t testing.TB) {
	t.Helper()
	if reason := nstest.Unavailable(); reason != "" {
		t.Fatalf("netwatchtest: real-kernel test cannot run: %s", reason)
	}
}

// NetNS is a fresh anonymous network namespace, held by a goroutine locked
// to an OS thread that lives in it. It goes away when the test ends.
type NetNS struct {
	ns   *nstest.NS
	path string
	h    *netwatch.NetNS
}

// NewNetNS creates a network namespace for the test (after
// RequireKernel) and removes it in t.Cleanup: the handle is closed and
// the thread that held the namespace exits.
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	if reason := nstest.Unavailable(); reason != "" {
		t.Skipf("netwatchtest: skipping real-kernel test: %s (RequireKernel fails instead)", reason)
	}
	n, err := nstest.New()
	if err != nil {
		t.Fatalf("netwatchtest: %v", err)
	}
	t.Cleanup(n.Close)
	h, err := netwatch.OpenNetNS(n.Path())
	if err != nil {
		t.Fatalf("netwatchtest: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return &NetNS{ns: n, path: n.Path(), h: h}
}

// NetNS returns the namespace as netwatch opens it, as Kernel.NetNS
// returns the fake kernel's: give it to netwatch.Options.NetNS and
// netwatch.DialApplier, and ask it RouteGet and OwnedText. It is closed
// when the test ends.
func (ns *NetNS) NetNS() *netwatch.NetNS { return ns.h }

// Named gives the namespace a name, as `ip netns add` does: it is bound
// at /run/netns/NAME, so that `ip -n NAME` and `ip netns exec NAME` reach
// it, until the test ends. A name that is taken or is not a file name
// fails the test.
func (ns *NetNS) Named(t testing.TB, name string) {
	t.Helper()
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
		t.Fatalf("netwatchtest: %q is not a namespace name", name)
	}
	if err := os.MkdirAll("/run/netns", 0o755); err != nil {
		t.Fatalf("netwatchtest: %v", err)
	}
	p := filepath.Join("/run/netns", name)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		t.Fatalf("netwatchtest: name the namespace: %v", err)
	}
	f.Close()
	if err := unix.Mount(ns.path, p, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(p)
		t.Fatalf("netwatchtest: name the namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		unix.Unmount(p, unix.MNT_DETACH)
		os.Remove(p)
	})
}

// FD is the namespace's file descriptor, for netlink.Config.NetNS.
func (ns *NetNS) FD() int { return ns.ns.FD() }

// Path names the namespace in /proc, for nsenter --net=PATH; it is valid
// until the test ends.
func (ns *NetNS) Path() string { return ns.path }

// Do runs fn on the thread that lives in the namespace and returns its
// error. Goroutines that fn starts are not in the namespace.
func (ns *NetNS) Do(fn func() error) error { return ns.ns.Do(fn) }

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

func (ns *NetNS) ip(args ...string) (string, error) { return ns.ns.IP(args...) }

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
