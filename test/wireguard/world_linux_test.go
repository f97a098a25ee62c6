package wireguard

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/test/wireguard/tunnel"
)

// prereqs is what every test needs once: the binaries, and whether the
// kernel has WireGuard. Built on first use.
type prereqs struct {
	once        sync.Once
	skip        string // why the tests cannot run here, or ""
	err         error  // a failure to build what they run
	dir         string // scratch directory for the test binary's life
	agent       string // the marksplit binary
	wireguardGo string // "" where the kernel has WireGuard
	which       string // the WireGuard the tests use, for their logs
}

// Environment variables for runs that prepare the binaries elsewhere, as
// `make test-kernels` does for its guests: a prebuilt agent, and
// MARKSPLIT_WIREGUARD=kernel to fail rather than fall back to wireguard-go
// when the kernel has no WireGuard.
const (
	agentEnv     = "MARKSPLIT_AGENT"
	wireguardEnv = "MARKSPLIT_WIREGUARD"
)

var the prereqs

// need returns the prerequisites, skipping t (or failing it under
// MARKSPLIT_KERNEL_TESTS=1) when this machine cannot run the tests.
func need(t *testing.T) *prereqs {
	t.Helper()
	if testing.Short() {
		t.Skip("runs WireGuard and the agent in network namespaces; skipped with -short")
	}
	p := &the
	p.once.Do(p.check)
	if p.skip != "" {
		skipOrFail(t, p.skip)
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return p
}

// skipOrFail skips t for why, or fails it under MARKSPLIT_KERNEL_TESTS=1.
func skipOrFail(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("MARKSPLIT_KERNEL_TESTS") == "1" {
		t.Fatalf("MARKSPLIT_KERNEL_TESTS=1, but %s", why)
	}
	t.Skip(why)
}

func (p *prereqs) check() {
	if os.Geteuid() != 0 {
		p.skip = "not root: the WireGuard tests need network namespaces (sudo)"
		return
	}
	for _, c := range []string{"ip", "tc", "unshare", "nsenter", "wg"} {
		if _, err := exec.LookPath(c); err != nil {
			p.skip = c + " not found in PATH (wg: apt-get install --no-install-recommends wireguard-tools; `make test` installs it)"
			return
		}
	}
	probe := fmt.Sprintf("mswg-%d-probe", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		p.skip = fmt.Sprintf("network namespaces not permitted here (ip netns add: %v: %s)", err, bytes.TrimSpace(out))
		return
	}
	kernelWG := exec.Command("ip", "-n", probe, "link", "add", "wgprobe", "type", "wireguard").Run() == nil
	exec.Command("ip", "netns", "del", probe).Run()
	if !kernelWG && os.Getenv(wireguardEnv) == "kernel" {
		p.err = fmt.Errorf("%s=kernel, but this kernel has no WireGuard (ip link add type wireguard fails)", wireguardEnv)
		return
	}
	p.which = "kernel"
	if v, err := os.ReadFile("/sys/module/wireguard/version"); err == nil {
		p.which = "kernel (module " + strings.TrimSpace(string(v)) + ")"
	}
	if !kernelWG {
		p.which = "wireguard-go"
		if _, err := os.Stat("/dev/net/tun"); err != nil {
			p.skip = "no WireGuard in the kernel and no /dev/net/tun for wireguard-go"
			return
		}
		if p.wireguardGo, p.err = tunnel.BuildWireGuardGo("wireguard-go", os.Stderr); p.err != nil {
			return
		}
	}
	if p.dir, p.err = os.MkdirTemp("", fmt.Sprintf("marksplit-wg-%d-", os.Getpid())); p.err != nil {
		return
	}
	if p.agent = os.Getenv(agentEnv); p.agent != "" {
		return
	}
	p.agent = filepath.Join(p.dir, "marksplit")
	cmd := exec.Command("go", "build", "-o", p.agent, "./agent")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.CombinedOutput(); err != nil {
		p.err = fmt.Errorf("go build ./agent: %v\n%s", err, out)
	}
}

// removeStale removes the namespaces of earlier runs whose process is gone.
func removeStale() {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), "mswg-")
		if !ok {
			continue
		}
		pid, _, _ := strings.Cut(rest, "-")
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); errors.Is(err, os.ErrNotExist) {
			exec.Command("ip", "netns", "del", e.Name()).Run()
		}
	}
}

var seq struct {
	sync.Mutex
	n int
}

// world is one test's gateway, worker and peer, with WireGuard between the
// two nodes; see the package doc.
type world struct {
	t                *testing.T
	p                *prereqs
	gw, worker, peer string // namespace names
	wgPID            map[string]int
}

// newWorld builds the topology and WireGuard; t.Cleanup removes it all.
func newWorld(t *testing.T) *world {
	t.Helper()
	p := need(t)
	seq.Lock()
	seq.n++
	n := seq.n
	seq.Unlock()
	base := fmt.Sprintf("mswg-%d-%d-", os.Getpid(), n)
	w := &world{t: t, p: p, gw: base + "gw", worker: base + "w", peer: base + "p", wgPID: map[string]int{}}
	t.Logf("WireGuard: %s", p.which)
	for _, ns := range []string{w.gw, w.worker, w.peer} {
		w.must("ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		w.ip(ns, "link set lo up")
	}
	w.ip(w.gw, "link add br0 mtu 1450 type bridge")
	w.ip(w.gw, "addr add 10.0.0.1/16 dev br0")
	w.ip(w.gw, "link set br0 up")
	w.must("ip", "netns", "exec", w.gw, "sysctl", "-qw", "net.ipv4.ip_forward=1",
		"net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.br0.send_redirects=0")
	keys := map[string][2]string{}
	for _, n := range []struct{ ns, addr, port string }{{w.worker, "10.0.0.5", "gw-w"}, {w.peer, "10.0.0.9", "gw-p"}} {
		w.ip(n.ns, "link add enp7s0 mtu 1450 type veth peer name "+n.port+" mtu 1450 netns "+w.gw)
		w.ip(w.gw, "link set "+n.port+" master br0 up")
		w.ip(n.ns, "addr add "+n.addr+"/16 dev enp7s0 noprefixroute")
		w.ip(n.ns, "link set enp7s0 up")
		w.ip(n.ns, "route add 10.0.0.1 dev enp7s0 proto dhcp scope link src "+n.addr)
		priv := strings.TrimSpace(w.must("wg", "genkey"))
		cmd := exec.Command("wg", "pubkey")
		cmd.Stdin = strings.NewReader(priv + "\n")
		pub, err := cmd.Output()
		if err != nil {
			t.Fatalf("wg pubkey: %v", err)
		}
		keys[n.ns] = [2]string{priv, strings.TrimSpace(string(pub))}
	}
	// The old shell loop has lowered the worker's route to the tunnel MTU.
	w.ip(w.worker, "route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5 mtu 1355")
	w.ip(w.peer, "route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.9")

	// As Cilium's node encryption does, each peer's allowed IPs hold its
	// node address too, for host traffic redirected into the tunnel
	// (redirect). The peer accepts it on cilium_wg0 and answers on enp7s0.
	for _, ns := range []string{w.worker, w.peer} {
		w.must("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
	}
	w.wireguard(w.worker, keys[w.worker][0], keys[w.peer][1], "10.244.5.1/16", "10.0.0.9:51871", "10.244.9.0/24,10.0.0.9/32")
	w.wireguard(w.peer, keys[w.peer][0], keys[w.worker][1], "10.244.9.1/16", "10.0.0.5:51871", "10.244.5.0/24,10.0.0.5/32")
	return w
}

// redirect emulates what Cilium's BPF program on the underlay's egress
// does: host packets to the peer's node address leave through cilium_wg0
// instead. They were built for the route the kernel chose, so the route's
// MTU decides whether they fit the tunnel. Only TCP is redirected: Cilium
// tells WireGuard's own packets by their mark, but u32's mark match needs
// CONFIG_CLS_U32_MARK (not on this kind of machine), and a port match would
// miss their non-first fragments; WireGuard's packets, UDP, never match.
func (w *world) redirect() {
	w.t.Helper()
	for _, args := range [][]string{
		{"qdisc", "add", "dev", "enp7s0", "clsact"},
		{"filter", "add", "dev", "enp7s0", "egress", "prio", "1", "protocol", "ip", "u32",
			"match", "ip", "dst", "10.0.0.9/32", "match", "ip", "protocol", "6", "0xff",
			"action", "mirred", "egress", "redirect", "dev", "cilium_wg0"},
	} {
		out, err := exec.Command("tc", append([]string{"-n", w.worker}, args...)...).CombinedOutput()
		if err != nil {
			skipOrFail(w.t, fmt.Sprintf("this kernel cannot redirect with tc (clsact, u32, mirred): tc %s: %v: %s",
				strings.Join(args, " "), err, bytes.TrimSpace(out)))
		}
	}
}

// tunnelTxBytes returns the bytes the worker has sent into cilium_wg0.
func (w *world) tunnelTxBytes() uint64 {
	w.t.Helper()
	out := w.must("ip", "netns", "exec", w.worker, "cat", "/sys/class/net/cilium_wg0/statistics/tx_bytes")
	n, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if err != nil {
		w.t.Fatalf("cilium_wg0 tx_bytes: %v", err)
	}
	return n
}

// wireguard gives the node ns its cilium_wg0 as Cilium configures it
// (MTU 1450 − 95, fwmark 0xe00), with one peer.
func (w *world) wireguard(ns, priv, peerPub, addr, endpoint, allowed string) {
	w.t.Helper()
	w.cilium(ns, priv, addr, []string{"peer", peerPub, "endpoint", endpoint, "allowed-ips", allowed})
}

// cilium gives the node ns its cilium_wg0 as Cilium configures it, with
// the peers of peerArgs (wg set's "peer KEY endpoint … allowed-ips …").
func (w *world) cilium(ns, priv, addr string, peerArgs []string) {
	w.t.Helper()
	keyFile := filepath.Join(w.t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(priv+"\n"), 0o600); err != nil {
		w.t.Fatal(err)
	}
	wgset := append([]string{"wg", "set", "cilium_wg0", "listen-port", "51871", "fwmark", "0xe00", "private-key", keyFile}, peerArgs...)
	if w.p.wireguardGo == "" {
		w.ip(ns, "link add cilium_wg0 type wireguard")
		w.must(append([]string{"ip", "netns", "exec", ns}, wgset...)...)
	} else {
		pid := w.startWireGuardGo(ns)
		w.wgPID[ns] = pid
		w.must(append([]string{"nsenter", "-m", "-n", "-t", strconv.Itoa(pid)}, wgset...)...)
	}
	w.ip(ns, "addr add "+addr+" dev cilium_wg0")
	w.ip(ns, "link set cilium_wg0 mtu 1355 up")
}

// startWireGuardGo runs wireguard-go in ns, in a mount namespace of its own
// with a private /run, and returns its process ID once its control socket
// answers. t.Cleanup stops it.
func (w *world) startWireGuardGo(ns string) int {
	w.t.Helper()
	// ip netns exec, unshare and sh each exec the next: the process
	// started is wireguard-go.
	cmd := exec.Command("ip", "netns", "exec", ns, "unshare", "-m", "--propagation", "private",
		"sh", "-c", `mount -t tmpfs wireguard /run && exec "$0" -f cilium_wg0`, w.p.wireguardGo)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		w.t.Fatalf("wireguard-go in %s: %v", ns, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	w.t.Cleanup(func() { stop(cmd, done, 3*time.Second) })
	pid := strconv.Itoa(cmd.Process.Pid)
	ok := poll(scaled(10*time.Second), func() bool {
		select {
		case <-done:
			return true
		default:
		}
		return exec.Command("nsenter", "-m", "-t", pid, "test", "-S", "/run/wireguard/cilium_wg0.sock").Run() == nil
	})
	select {
	case <-done:
		w.t.Fatalf("wireguard-go in %s exited: %s", ns, out.String())
	default:
	}
	if !ok {
		w.t.Fatalf("wireguard-go in %s: no control socket after 10s: %s", ns, out.String())
	}
	return cmd.Process.Pid
}

// agent is a running `marksplit run` in the worker.
type agent struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  *syncBuffer
}

// startAgent runs the agent in the worker with the given mark and waits
// until the kernel has its rule and its table route for the peer.
func (w *world) startAgent(mark string) *agent {
	w.t.Helper()
	a := &agent{done: make(chan struct{}), out: &syncBuffer{}}
	a.cmd = exec.Command("ip", "netns", "exec", w.worker, w.p.agent, "run", "--prefix=10.0.0.0/16",
		"--encryption=on", "--metrics-addr=", "--mark="+mark)
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		w.t.Fatalf("start the agent: %v", err)
	}
	go func() { a.cmd.Wait(); close(a.done) }()
	w.t.Cleanup(func() {
		stop(a.cmd, a.done, 5*time.Second)
		if w.t.Failed() {
			w.t.Logf("agent output:\n%s", a.out.String())
		}
	})
	if !poll(scaled(10*time.Second), func() bool { return w.ruleThere() && w.unmarkedSplit() }) {
		w.t.Fatalf("the agent did not install its rule and table route in 10s:\n%s\n%s", w.ipOut(w.worker, "rule"), a.out.String())
	}
	return a
}

// ruleThere reports whether the worker has a rule at priority 900.
func (w *world) ruleThere() bool {
	out, _ := exec.Command("ip", "-n", w.worker, "rule", "show", "pref", "900").Output()
	return len(bytes.TrimSpace(out)) > 0
}

// unmarkedSplit reports whether host traffic to the peer (no mark) uses
// table 900 at the tunnel MTU.
func (w *world) unmarkedSplit() bool {
	out, err := exec.Command("ip", "-n", w.worker, "route", "get", "10.0.0.9").Output()
	return err == nil && strings.Contains(string(out), "table 900") && strings.Contains(string(out), "mtu 1355")
}

// markedMain reports whether WireGuard's packets to the peer (mark 0xe00)
// use the main route at the link's MTU.
func (w *world) markedMain() bool {
	out, err := exec.Command("ip", "-n", w.worker, "route", "get", "10.0.0.9", "mark", "0xe00").Output()
	return err == nil && !strings.Contains(string(out), "table 900") && !strings.Contains(string(out), "mtu 1355")
}

// ip runs `ip -n ns ARGS` and fails the test on an error.
func (w *world) ip(ns, args string) {
	w.t.Helper()
	w.must(append([]string{"ip", "-n", ns}, strings.Fields(args)...)...)
}

// ipOut returns the output of `ip -n ns ARGS`, or the error.
func (w *world) ipOut(ns, args string) string {
	out, err := exec.Command("ip", append([]string{"-n", ns}, strings.Fields(args)...)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("ip -n %s %s: %v: %s", ns, args, err, out)
	}
	return string(out)
}

// must runs a command and returns its output, failing the test on an error.
func (w *world) must(argv ...string) string {
	w.t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		w.t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return string(out)
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the process.
func stop(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		cmd.Process.Kill()
		<-done
	}
}

// poll reports whether cond became true, checking it every 2 ms. d is how
// long that takes on a quiet machine; poll gives up only after 2 minutes
// (or d, if longer), which only a hang reaches: how fast is the
// benchmarks' to measure, and a busy machine must not fail a test.
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(max(d, 2*time.Minute))
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
}

// syncBuffer is a bytes.Buffer safe for a process's two output streams.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
