package wireguard

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/pathprobe"
	"github.com/marksplit/marksplit/test/wireguard/tunnel"
	"golang.org/x/sys/unix"
)

// pathWorld is the worker and three peer nodes on a real WireGuard tunnel,
// each peer behind a path of its own through one router (see the package
// doc): the worker's agent runs with --peers=auto against the stand-in
// API server, which lists the four nodes.
type pathWorld struct {
	*world
	peers  []*pathPeer
	apiEnv []string // the environment of a pod that reaches the API server
}

// pathPeer is one peer node and the underlay path to it.
type pathPeer struct {
	kind string     // full, hole (drops silently) or icmp (says so)
	ns   string     // its namespace
	addr netip.Addr // its node address (InternalIP), 10.0.N.9
	path int        // the largest packet its path carries
	resp *pathprobe.Responder
}

// inner4 is WireGuard's inner MTU over an IPv4 path of p bytes:
// floor16(p − 60).
func inner4(p int) int { return (p - 60) / 16 * 16 }

// The three underlay paths from the router to the peers. The silent
// hole's far end is a veth of 1300 bytes behind a router end of 1450:
// frames up to 1304 bytes pass and larger ones vanish without an ICMP
// message (KERNEL-NOTES); the ICMP path's router end is 1368 bytes
// itself, so the router answers a larger DF packet with frag-needed.
var pathKinds = []struct {
	kind                  string
	routerMTU, farMTU, at int // the router's and the peer's ends; the path's size
}{
	{"full", 1450, 1450, 1450},
	{"hole", 1450, 1300, 1304},
	{"icmp", 1368, 1368, 1368},
}

// newPathWorld builds the topology, WireGuard and the API server; t.Cleanup
// removes it all.
func newPathWorld(t *testing.T) *pathWorld {
	t.Helper()
	p := need(t)
	seq.Lock()
	seq.n++
	n := seq.n
	seq.Unlock()
	base := fmt.Sprintf("mswg-%d-%d-", os.Getpid(), n)
	pw := &pathWorld{world: &world{t: t, p: p, gw: base + "gw", worker: base + "w", wgPID: map[string]int{}}}
	t.Logf("WireGuard: %s", p.which)
	for i, k := range pathKinds {
		pw.peers = append(pw.peers, &pathPeer{kind: k.kind, ns: fmt.Sprintf("%sp%d", base, i+1),
			addr: netip.AddrFrom4([4]byte{10, 0, byte(i + 1), 9}), path: k.at})
	}
	nss := []string{pw.gw, pw.worker}
	for _, pp := range pw.peers {
		nss = append(nss, pp.ns)
	}
	for _, ns := range nss {
		pw.must("ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		pw.ip(ns, "link set lo up")
		pw.must("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
	}
	pw.must("ip", "netns", "exec", pw.gw, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// The worker: 10.0.0.5 on enp7s0, the node network through the router.
	pw.ip(pw.worker, "link add enp7s0 mtu 1450 type veth peer name r0 mtu 1450 netns "+pw.gw)
	pw.ip(pw.gw, "addr add 10.0.0.1/24 dev r0")
	pw.ip(pw.gw, "link set r0 up")
	pw.ip(pw.worker, "addr add 10.0.0.5/24 dev enp7s0")
	pw.ip(pw.worker, "link set enp7s0 up")
	pw.ip(pw.worker, "route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5")
	// A GSO packet crosses a veth whatever its size (is_skb_forwardable)
	// and is cut into segments only beyond the hole: the worker sends
	// single segments, as a NIC without TSO would (wireguard-go batches its
	// UDP with GSO).
	pw.ip(pw.worker, "link set dev enp7s0 gso_max_segs 1")
	for i, k := range pathKinds {
		pp := pw.peers[i]
		r := fmt.Sprintf("r%d", i+1)
		pw.ip(pw.gw, fmt.Sprintf("link add %s mtu %d type veth peer name enp7s0 mtu %d netns %s", r, k.routerMTU, k.farMTU, pp.ns))
		pw.ip(pw.gw, fmt.Sprintf("addr add 10.0.%d.1/24 dev %s", i+1, r))
		pw.ip(pw.gw, "link set "+r+" up")
		pw.ip(pp.ns, fmt.Sprintf("addr add %v/24 dev enp7s0", pp.addr))
		pw.ip(pp.ns, "link set enp7s0 up")
		pw.ip(pp.ns, fmt.Sprintf("route add default via 10.0.%d.1 dev enp7s0", i+1))
	}

	// WireGuard: the worker knows the three peers, each peer the worker.
	// As Cilium's node encryption does, allowed IPs hold the node
	// addresses too, for host traffic redirected into the tunnel.
	wPriv, wPub := pw.keypair()
	var peerArgs []string
	for i, pp := range pw.peers {
		priv, pub := pw.keypair()
		peerArgs = append(peerArgs, "peer", pub, "endpoint", pp.addr.String()+":51871",
			"allowed-ips", fmt.Sprintf("10.244.%d.0/24,%v/32", 11+i, pp.addr))
		pw.cilium(pp.ns, priv, fmt.Sprintf("10.244.%d.1/16", 11+i),
			[]string{"peer", wPub, "endpoint", "10.0.0.5:51871", "allowed-ips", "10.244.5.0/24,10.0.0.5/32"})
	}
	pw.cilium(pw.worker, wPriv, "10.244.5.1/16", peerArgs)
	for _, pp := range pw.peers {
		pw.redirectTo(pp.addr)
	}

	// The API server, in the worker's namespace, lists the four nodes.
	var ln net.Listener
	if err := tunnel.In(pw.worker, func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	srv := apitest.New(t, apitest.Options{Listener: ln})
	nodes := []apitest.Node{{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255}}
	for _, pp := range pw.peers {
		nodes = append(nodes, apitest.Node{Name: "peer-" + pp.kind, InternalIPs: []string{pp.addr.String()}, Key: 255})
	}
	srv.MustPut(t, nodes...)
	dir := t.TempDir()
	if err := srv.WriteServiceAccount(dir); err != nil {
		t.Fatal(err)
	}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBERNETES_") && !strings.HasPrefix(e, "NODE_NAME=") && !strings.HasPrefix(e, "MARKSPLIT_SERVICEACCOUNT_DIR=") {
			pw.apiEnv = append(pw.apiEnv, e)
		}
	}
	pw.apiEnv = append(append(pw.apiEnv, srv.Env()...), "MARKSPLIT_SERVICEACCOUNT_DIR="+dir)

	// Each peer answers the worker's probes, as its own agent would.
	for _, pp := range pw.peers {
		pp.resp = pw.respond(pp.ns)
	}
	return pw
}

// keypair returns a new WireGuard private and public key.
func (w *world) keypair() (priv, pub string) {
	w.t.Helper()
	priv = strings.TrimSpace(w.must("wg", "genkey"))
	cmd := exec.Command("wg", "pubkey")
	cmd.Stdin = strings.NewReader(priv + "\n")
	out, err := cmd.Output()
	if err != nil {
		w.t.Fatalf("wg pubkey: %v", err)
	}
	return priv, strings.TrimSpace(string(out))
}

// redirectTo sends the worker's host TCP to dst into cilium_wg0, as
// Cilium's BPF program does (see redirect).
func (w *world) redirectTo(dst netip.Addr) {
	w.t.Helper()
	for _, args := range [][]string{
		{"qdisc", "replace", "dev", "enp7s0", "clsact"},
		{"filter", "add", "dev", "enp7s0", "egress", "prio", "1", "protocol", "ip", "u32",
			"match", "ip", "dst", dst.String() + "/32", "match", "ip", "protocol", "6", "0xff",
			"action", "mirred", "egress", "redirect", "dev", "cilium_wg0"},
	} {
		out, err := exec.Command("tc", append([]string{"-n", w.worker}, args...)...).CombinedOutput()
		if err != nil {
			skipOrFail(w.t, fmt.Sprintf("this kernel cannot redirect with tc (clsact, u32, mirred): tc %s: %v: %s",
				strings.Join(args, " "), err, strings.TrimSpace(string(out))))
		}
	}
}

// respond serves a path-MTU probe responder in ns for the worker's
// address until the test ends.
func (w *world) respond(ns string) *pathprobe.Responder {
	w.t.Helper()
	var c *net.UDPConn
	if err := tunnel.In(ns, func() (err error) {
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: pathprobe.DefaultPort})
		return err
	}); err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	r := &pathprobe.Responder{Allow: func(a netip.Addr) bool { return a == netip.MustParseAddr("10.0.0.5") }}
	go func() { defer close(served); r.ServeConn(ctx, c) }()
	w.t.Cleanup(func() { cancel(); <-served })
	return r
}

// startPeersAgent runs `marksplit run --peers=auto` in the worker with
// args, its metrics on 127.0.0.1:9184 there.
func (pw *pathWorld) startPeersAgent(args ...string) *agent {
	pw.t.Helper()
	a := &agent{done: make(chan struct{}), out: &syncBuffer{}}
	argv := append([]string{"netns", "exec", pw.worker, pw.p.agent, "run", "--peers=auto", "--encryption=auto",
		"--node-name=node-self", "--metrics-addr=127.0.0.1:9184", "--health-socket="}, args...)
	a.cmd = exec.Command("ip", argv...)
	a.cmd.Env = pw.apiEnv
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		pw.t.Fatalf("start the agent: %v", err)
	}
	go func() { a.cmd.Wait(); close(a.done) }()
	pw.t.Cleanup(func() {
		stop(a.cmd, a.done, 5*time.Second)
		if pw.t.Failed() {
			pw.t.Logf("agent output (%s):\n%s", strings.Join(args, " "), a.out.String())
		}
	})
	return a
}

// stopAgent stops a and waits for it.
func (a *agent) stopAgent() { stop(a.cmd, a.done, 5*time.Second) }

// table900 returns the worker's table 900 as destination → "dev mtu".
func (w *world) table900() map[string]string {
	return (&meshWorld{world: w}).table()
}

// expectTable waits until the worker's table 900 has want for each peer.
func (pw *pathWorld) expectTable(step string, want map[string]int) {
	pw.t.Helper()
	var got map[string]string
	ok := poll(scaled(time.Minute), func() bool {
		got = pw.table900()
		for dst, mtu := range want {
			if got[dst] != fmt.Sprintf("enp7s0 %d", mtu) {
				return false
			}
		}
		return len(got) == len(want)
	})
	if !ok {
		pw.t.Fatalf("%s: table 900 is %v, want %v (dev enp7s0)", step, got, want)
	}
}

// metric returns the value of the worker agent's sample named series
// (name{labels} as /metrics prints it), or -1 when there is none.
func (pw *pathWorld) metric(series string) float64 {
	pw.t.Helper()
	var c net.Conn
	if err := tunnel.In(pw.worker, func() (err error) { c, err = net.Dial("tcp", "127.0.0.1:9184"); return err }); err != nil {
		pw.t.Fatalf("metrics: %v", err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				pw.t.Fatalf("metrics: %s: %v", sc.Text(), err)
			}
			return f
		}
	}
	return -1
}

// sendMarkedDF sends one UDP datagram of size bytes (IP header included)
// from ns to a, with DF set and WireGuard's mark, as WireGuard's own
// packets take the main route.
func sendMarkedDF(ns string, a netip.Addr, size int) error {
	return tunnel.In(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, 0xe00); err != nil {
			return err
		}
		err = unix.Sendto(fd, make([]byte, size-28), 0, &unix.SockaddrInet4{Port: 9, Addr: a.As4()})
		if err != nil && err != unix.EMSGSIZE {
			return fmt.Errorf("send: %w", err)
		}
		return nil
	})
}

// transferResult is what hostTransfer measured.
type transferResult struct {
	total, acked uint64
	retrans      uint8 // consecutive retransmissions of the unacknowledged head
	mss          uint32
	took         time.Duration // measured, never asserted
}

func (r transferResult) String() string {
	if r.acked >= r.total {
		return fmt.Sprintf("%d of %d bytes acknowledged in %v (MSS %d)", r.acked, r.total, r.took.Round(time.Millisecond), r.mss)
	}
	return fmt.Sprintf("%d of %d bytes acknowledged, stalled after %v: %d retransmissions in a row without an acknowledgement (MSS %d)",
		r.acked, r.total, r.took.Round(time.Millisecond), r.retrans, r.mss)
}

// hostTransfer sends total bytes of host TCP from the worker to dst:5001
// (a receiver in ns discards them), through the tunnel (redirectTo). It
// returns once every byte is acknowledged, or once the kernel has
// retransmitted 3 times in a row without an acknowledgement (a stall,
// bounded by attempts, not by time), or, a hang, after minutes.
func (pw *pathWorld) hostTransfer(ns string, dst netip.Addr, total int) transferResult {
	pw.t.Helper()
	var ln net.Listener
	if err := tunnel.In(ns, func() (err error) { ln, err = net.Listen("tcp4", dst.String()+":5001"); return err }); err != nil {
		pw.t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, c)
		c.Close()
	}()
	var fd int
	if err := tunnel.In(pw.worker, func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		return unix.Connect(fd, &unix.SockaddrInet4{Port: 5001, Addr: dst.As4()})
	}); err != nil {
		pw.t.Fatal(err)
	}
	defer func() {
		unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1}) // reset: nothing left retransmitting
		unix.Close(fd)
	}()
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, total); err != nil {
		pw.t.Fatal(err)
	}
	go func() {
		buf := make([]byte, total)
		for off := 0; off < total; {
			n, err := unix.Write(fd, buf[off:])
			if err != nil {
				return
			}
			off += n
		}
	}()
	r := transferResult{total: uint64(total)}
	start := time.Now()
	poll(scaled(time.Minute), func() bool {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			return true
		}
		// bytes_acked counts the SYN.
		r.acked, r.retrans, r.mss = max(info.Bytes_acked, 1)-1, info.Retransmits, info.Snd_mss
		return r.acked >= r.total || r.retrans >= 3
	})
	r.took = time.Since(start)
	return r
}

// TestKernelWireGuardPathMTU is issue 35's proof on real paths: the worker
// and three peers over a real WireGuard tunnel, behind a full path, a
// silent black hole of 1304 bytes and a hop of 1368 bytes that sends ICMP.
//
// With the agent learning from ICMP only (--path-mtu-probe off, the
// feature that finds black holes off), the ICMP peer's route gets
// floor16(1368 − 60) = 1296 from the PMTU exception alone, no probe sent
// to it at all (its responder answered none; the agent counts a learned
// change), while host TCP to the black-holed peer through the tunnel
// stalls. With probing on, the black-holed peer's route gets
// floor16(1304 − 60) = 1232 and the same transfer completes. The full-path
// peer keeps the tunnel MTU throughout.
func TestKernelWireGuardPathMTU(t *testing.T) {
	pw := newPathWorld(t)
	full, hole, icmp := pw.peers[0], pw.peers[1], pw.peers[2]
	const total = 1 << 20
	want := map[string]int{full.addr.String(): 1355, hole.addr.String(): 1355, icmp.addr.String(): 1355}

	a := pw.startPeersAgent("--path-mtu-probe=false")
	pw.expectTable("the peers split at the tunnel MTU", want)

	// WireGuard's own packets to the ICMP peer: full-size, DF set (as
	// wireguard-go sends what fits its route; the kernel's WireGuard sends
	// without DF, and the router fragments those), with its mark.
	want[icmp.addr.String()] = inner4(icmp.path)
	if !poll(scaled(time.Minute), func() bool {
		if err := sendMarkedDF(pw.worker, icmp.addr, 1415); err != nil {
			t.Fatal(err)
		}
		return pw.table900()[icmp.addr.String()] == fmt.Sprintf("enp7s0 %d", inner4(icmp.path))
	}) {
		t.Fatalf("the ICMP peer's route did not get the learned %d: table 900 is %v", inner4(icmp.path), pw.table900())
	}
	pw.expectTable("the ICMP peer learned", want)
	line := fmt.Sprintf("path MTU of peer %v: %d bytes (inner MTU %d, reduced), learned", icmp.addr, icmp.path, inner4(icmp.path))
	if !strings.Contains(a.out.String(), line) {
		t.Errorf("no log line %q", line)
	}
	if got := pw.metric(`marksplit_path_mtu_changes_total{direction="lower",source="learned"}`); got != 1 {
		t.Errorf("marksplit_path_mtu_changes_total{direction=lower,source=learned} = %v, want 1", got)
	}
	if got := pw.metric("marksplit_path_mtu_probes_total"); got != -1 {
		t.Errorf("marksplit_path_mtu_probes_total = %v with --path-mtu-probe=false: want no prober", got)
	}
	if n := icmp.resp.Stats().Answered; n != 0 {
		t.Errorf("the ICMP peer's responder answered %d probes, want 0", n)
	}

	before := pw.hostTransfer(hole.ns, hole.addr, total)
	t.Logf("host TCP to the black-holed peer (path %d bytes) without the path MTU: %v", hole.path, before)
	if before.acked >= before.total {
		t.Errorf("without the path MTU the transfer to the black-holed peer completed: %v", before)
	}
	a.stopAgent()

	a = pw.startPeersAgent("--path-mtu-probe=true")
	want[hole.addr.String()] = inner4(hole.path)
	pw.expectTable("the black hole found", want)
	after := pw.hostTransfer(hole.ns, hole.addr, total)
	t.Logf("host TCP to the black-holed peer (path %d bytes) with the path MTU:    %v", hole.path, after)
	if after.acked < after.total {
		t.Errorf("with the path MTU the transfer to the black-holed peer did not complete: %v", after)
	}
	line = fmt.Sprintf("path MTU of peer %v: ", hole.addr)
	for l := range strings.Lines(a.out.String()) {
		if strings.Contains(l, line) {
			t.Logf("agent: %s", strings.TrimSpace(l))
		}
	}
	if probes := pw.metric("marksplit_path_mtu_probes_total"); probes <= 0 {
		t.Errorf("marksplit_path_mtu_probes_total = %v, want some", probes)
	}
	if hole.resp.Stats().Answered == 0 {
		t.Errorf("the black-holed peer's responder answered no probe")
	}
	pw.expectTable("at the end", want)
}
