package wireguard

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// meshWorld is a WireGuard mesh without Cilium: a gateway bridge, the
// worker (10.0.0.5, wg0 10.244.5.1/16 with fwmark 0x1e00, MTU 1380) and
// three peers (10.0.0.11–13, each wg0 10.244.N.1/16), each peer knowing the
// worker. The worker's device starts with peers 1 and 2.
type meshWorld struct {
	*world
	peers []string // namespaces of the three peers
	pubs  []string // their public keys
	wgPID map[string]int
	exec  []string // the prefix that runs a command where the worker's device is seen
}

func newMeshWorld(t *testing.T) *meshWorld {
	t.Helper()
	p := need(t)
	seq.Lock()
	seq.n++
	n := seq.n
	seq.Unlock()
	base := fmt.Sprintf("mswg-%d-%d-", os.Getpid(), n)
	m := &meshWorld{world: &world{t: t, p: p, gw: base + "gw", worker: base + "w"}, wgPID: map[string]int{}}
	t.Logf("WireGuard: %s", p.which)
	for i := 1; i <= 3; i++ {
		m.peers = append(m.peers, fmt.Sprintf("%sp%d", base, i))
	}
	for _, ns := range append([]string{m.gw, m.worker}, m.peers...) {
		m.must("ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		m.ip(ns, "link set lo up")
	}
	m.ip(m.gw, "link add br0 mtu 1450 type bridge")
	m.ip(m.gw, "addr add 10.0.0.1/16 dev br0")
	m.ip(m.gw, "link set br0 up")
	keys := map[string][2]string{}
	nodes := []struct{ ns, addr, tun string }{{m.worker, "10.0.0.5", "10.244.5.1/16"}}
	for i, ns := range m.peers {
		nodes = append(nodes, struct{ ns, addr, tun string }{ns, fmt.Sprintf("10.0.0.%d", 11+i), fmt.Sprintf("10.244.%d.1/16", 11+i)})
	}
	for i, nd := range nodes {
		port := fmt.Sprintf("gw-%d", i)
		m.ip(nd.ns, "link add enp7s0 mtu 1450 type veth peer name "+port+" mtu 1450 netns "+m.gw)
		m.ip(m.gw, "link set "+port+" master br0 up")
		m.ip(nd.ns, "addr add "+nd.addr+"/16 dev enp7s0")
		m.ip(nd.ns, "link set enp7s0 up")
		priv := strings.TrimSpace(m.must("wg", "genkey"))
		cmd := exec.Command("wg", "pubkey")
		cmd.Stdin = strings.NewReader(priv + "\n")
		pub, err := cmd.Output()
		if err != nil {
			t.Fatalf("wg pubkey: %v", err)
		}
		keys[nd.ns] = [2]string{priv, strings.TrimSpace(string(pub))}
	}
	for _, ns := range m.peers {
		m.pubs = append(m.pubs, keys[ns][1])
	}
	// The peers know the worker; the worker knows peers 1 and 2.
	for i, nd := range nodes {
		var peerArgs []string
		if i == 0 {
			for j := range 2 {
				peerArgs = append(peerArgs, "peer", m.pubs[j], "endpoint", fmt.Sprintf("10.0.0.%d:51871", 11+j),
					"allowed-ips", fmt.Sprintf("10.244.%d.0/24", 11+j))
			}
		} else {
			peerArgs = []string{"peer", keys[m.worker][1], "endpoint", "10.0.0.5:51871", "allowed-ips", "10.244.5.0/24"}
		}
		m.device(nd.ns, keys[nd.ns][0], nd.tun, i == 0, peerArgs)
	}
	m.exec = []string{"ip", "netns", "exec", m.worker}
	if pid, ok := m.wgPID[m.worker]; ok {
		m.exec = []string{"nsenter", "-m", "-n", "-t", strconv.Itoa(pid)}
	}
	return m
}

// device gives ns its wg0, the kernel's or wireguard-go's.
func (m *meshWorld) device(ns, priv, addr string, worker bool, peerArgs []string) {
	m.t.Helper()
	keyFile := filepath.Join(m.t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(priv+"\n"), 0o600); err != nil {
		m.t.Fatal(err)
	}
	wgset := []string{"wg", "set", "wg0", "listen-port", "51871", "private-key", keyFile}
	if worker {
		wgset = append(wgset, "fwmark", "0x1e00")
	}
	wgset = append(wgset, peerArgs...)
	if m.p.wireguardGo == "" {
		m.ip(ns, "link add wg0 type wireguard")
		m.must(append([]string{"ip", "netns", "exec", ns}, wgset...)...)
	} else {
		pid := m.startWireGuardGoDev(ns, "wg0")
		m.wgPID[ns] = pid
		m.must(append([]string{"nsenter", "-m", "-n", "-t", strconv.Itoa(pid)}, wgset...)...)
	}
	m.ip(ns, "addr add "+addr+" dev wg0")
	m.ip(ns, "link set wg0 mtu 1380 up")
}

// startWireGuardGoDev runs wireguard-go for dev in ns, as startWireGuardGo
// does for cilium_wg0.
func (m *meshWorld) startWireGuardGoDev(ns, dev string) int {
	m.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "unshare", "-m", "--propagation", "private",
		"sh", "-c", `mount -t tmpfs wireguard /run && exec "$0" -f "$1"`, m.p.wireguardGo, dev)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("wireguard-go in %s: %v", ns, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	m.t.Cleanup(func() { stop(cmd, done, 3*time.Second) })
	pid := strconv.Itoa(cmd.Process.Pid)
	if !poll(scaled(time.Minute), func() bool {
		select {
		case <-done:
			return true
		default:
		}
		return exec.Command("nsenter", "-m", "-t", pid, "test", "-S", "/run/wireguard/"+dev+".sock").Run() == nil
	}) {
		m.t.Fatalf("wireguard-go in %s: no control socket: %s", ns, out.String())
	}
	select {
	case <-done:
		m.t.Fatalf("wireguard-go in %s exited: %s", ns, out.String())
	default:
	}
	return cmd.Process.Pid
}

// wg runs `wg ARGS` on the worker's device.
func (m *meshWorld) wg(args ...string) {
	m.t.Helper()
	m.must(append(append(slices.Clone(m.exec), "wg"), args...)...)
}

// table returns the worker's table 900 as destination → "dev mtu".
func (m *meshWorld) table() map[string]string {
	out, err := exec.Command("ip", "-n", m.worker, "-j", "route", "show", "table", "900").Output()
	if err != nil {
		return map[string]string{"error": err.Error()}
	}
	var rs []struct {
		Dst     string           `json:"dst"`
		Dev     string           `json:"dev"`
		Metrics []map[string]int `json:"metrics"`
	}
	if err := json.Unmarshal(out, &rs); err != nil {
		return map[string]string{"error": err.Error()}
	}
	got := map[string]string{}
	for _, r := range rs {
		mtu := 0
		for _, mt := range r.Metrics {
			if v, ok := mt["mtu"]; ok {
				mtu = v
			}
		}
		got[r.Dst] = fmt.Sprintf("%s %d", r.Dev, mtu)
	}
	return got
}

// TestKernelWireGuardMesh runs the agent with --wireguard-link on the
// worker and changes the device under it: a peer added, one removed, an
// endpoint that roams into a prefix with a declared smaller path MTU, and
// allowed IPs that grow and shrink. After each change table 900 holds
// exactly each peer's allowed IPs at its MTU, and the rule skips the
// device's fwmark.
func TestKernelWireGuardMesh(t *testing.T) {
	m := newMeshWorld(t)
	a := &agent{done: make(chan struct{}), out: &syncBuffer{}}
	// 10.0.1.0/24 carries 1368-byte packets: inner floor16(1368-60) = 1296.
	a.cmd = exec.Command(m.exec[0], append(slices.Clone(m.exec[1:]), m.p.agent, "run", "--wireguard-link=wg0",
		"--wireguard-poll=100ms", "--metrics-addr=", "--health-socket=", "--path-mtu=10.0.1.0/24=1368")...)
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("start the agent: %v", err)
	}
	go func() { a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		stop(a.cmd, a.done, 5*time.Second)
		if t.Failed() {
			t.Logf("agent output:\n%s", a.out.String())
		}
	})
	expect := func(step string, want map[string]string) {
		t.Helper()
		var got map[string]string
		if !poll(scaled(2*time.Minute), func() bool { got = m.table(); return reflect.DeepEqual(want, got) }) {
			t.Fatalf("%s: table 900 is %v, want %v", step, got, want)
		}
	}
	expect("start", map[string]string{"10.244.11.0/24": "wg0 1380", "10.244.12.0/24": "wg0 1380"})
	if rule := m.ipOut(m.worker, "rule show pref 900"); !strings.Contains(rule, "not from all fwmark 0x1e00 lookup 900") {
		t.Fatalf("the rule does not skip the device's fwmark: %s", rule)
	}
	m.wg("set", "wg0", "peer", m.pubs[2], "endpoint", "10.0.0.13:51871", "allowed-ips", "10.244.13.0/24")
	expect("peer 3 added", map[string]string{"10.244.11.0/24": "wg0 1380", "10.244.12.0/24": "wg0 1380", "10.244.13.0/24": "wg0 1380"})
	m.wg("set", "wg0", "peer", m.pubs[1], "remove")
	expect("peer 2 removed", map[string]string{"10.244.11.0/24": "wg0 1380", "10.244.13.0/24": "wg0 1380"})
	m.wg("set", "wg0", "peer", m.pubs[2], "endpoint", "10.0.1.13:51871")
	expect("peer 3 roamed behind a smaller path", map[string]string{"10.244.11.0/24": "wg0 1380", "10.244.13.0/24": "wg0 1296"})
	m.wg("set", "wg0", "peer", m.pubs[0], "allowed-ips", "10.244.11.0/24,10.244.21.0/24")
	expect("peer 1's allowed IPs grow", map[string]string{"10.244.11.0/24": "wg0 1380", "10.244.21.0/24": "wg0 1380", "10.244.13.0/24": "wg0 1296"})
	m.wg("set", "wg0", "peer", m.pubs[0], "allowed-ips", "10.244.21.0/24")
	expect("peer 1's allowed IPs shrink", map[string]string{"10.244.21.0/24": "wg0 1380", "10.244.13.0/24": "wg0 1296"})
	// The worker's packets to a peer's tunnel address take the table at the
	// peer's MTU; the device's own (fwmark) take the main table.
	if out := m.ipOut(m.worker, "route get 10.244.13.1"); !strings.Contains(out, "table 900") || !strings.Contains(out, "mtu 1296") {
		t.Errorf("ip route get 10.244.13.1: %s", out)
	}
	if out := m.ipOut(m.worker, "route get 10.244.13.1 mark 0x1e00"); strings.Contains(out, "table 900") {
		t.Errorf("ip route get 10.244.13.1 mark 0x1e00: %s", out)
	}
}
