//go:build linux

package pathprobe

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/kerneltest"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// world is node – router – peer, in three namespaces: the node at
// 10.1.0.1 (n0) behind the router (r0 10.1.0.2, r1 10.2.0.2), the peer at
// 10.2.0.1 (p0). Every link starts at MTU 1500.
type world struct {
	node, router, peer *netwatchtest.NetNS
}

var worldPeer = netip.MustParseAddr("10.2.0.1")

func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{node: kerneltest.NewNetNS(t), router: kerneltest.NewNetNS(t), peer: kerneltest.NewNetNS(t)}
	w.node.AddVeth(t, "n0", w.router, "r0")
	w.router.AddVeth(t, "r1", w.peer, "p0")
	for _, ns := range []*netwatchtest.NetNS{w.node, w.router, w.peer} {
		ns.LoUp(t)
		sysctl(t, ns, "net/ipv4/ip_forward", "1")
	}
	w.node.IP(t, "addr", "add", "10.1.0.1/24", "dev", "n0")
	w.node.IP(t, "link", "set", "n0", "up")
	w.node.IP(t, "route", "add", "default", "via", "10.1.0.2")
	w.router.IP(t, "addr", "add", "10.1.0.2/24", "dev", "r0")
	w.router.IP(t, "addr", "add", "10.2.0.2/24", "dev", "r1")
	w.router.IP(t, "link", "set", "r0", "up")
	w.router.IP(t, "link", "set", "r1", "up")
	w.peer.IP(t, "addr", "add", "10.2.0.1/24", "dev", "p0")
	w.peer.IP(t, "link", "set", "p0", "up")
	w.peer.IP(t, "route", "add", "default", "via", "10.2.0.2")
	return w
}

// sysctl writes value to /proc/sys/key inside ns.
func sysctl(t *testing.T, ns *netwatchtest.NetNS, key, value string) {
	t.Helper()
	err := ns.Do(func() error {
		return writeFile("/proc/sys/"+key, value)
	})
	if err != nil {
		t.Fatalf("sysctl %s=%s: %v", key, value, err)
	}
}

func writeFile(path, value string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(value))
	return err
}

// listen opens a UDP socket on port in ns.
func listen(t *testing.T, ns *netwatchtest.NetNS, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := ns.Do(func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// serve runs a Responder in the peer namespace that accepts allow.
func (w *world) serve(t *testing.T, allow func(netip.Addr) bool) *Responder {
	t.Helper()
	c := listen(t, w.peer, DefaultPort)
	r := &Responder{Allow: allow}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.ServeConn(ctx, c) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("responder: %v", err)
		}
	})
	return r
}

func (w *world) prober(t *testing.T, cfg Config) *Prober {
	t.Helper()
	var p *Prober
	err := w.node.Do(func() (err error) {
		p, err = NewProber(cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// passes measures independently the largest IP packet from the node to the
// peer, between lo and hi, that arrives: DF datagrams of exact sizes, each
// followed by a small marker on the same flow, to a sink on the peer; a
// size that has not arrived when its marker does is lost.
func (w *world) passes(t *testing.T, srcPort, lo, hi int) int {
	t.Helper()
	return w.passesTo(t, netip.AddrPortFrom(worldPeer, 9999), srcPort, lo, hi)
}

func (w *world) passesTo(t *testing.T, dst netip.AddrPort, srcPort, lo, hi int) int {
	t.Helper()
	sink := listen(t, w.peer, int(dst.Port()))
	var src *net.UDPConn
	err := w.node.Do(func() error {
		var lc net.ListenConfig
		lc.Control = func(_, _ string, rc syscallRawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = setProbeOptions(int(fd), unix.AF_INET, 0xe00)
			})
			if err != nil {
				return err
			}
			return serr
		}
		pc, err := lc.ListenPacket(context.Background(), "udp4", net.JoinHostPort("0.0.0.0", itoa(srcPort)))
		if err != nil {
			return err
		}
		src = pc.(*net.UDPConn)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	sizes := make(chan int, 16)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, err := sink.Read(buf)
			if err != nil {
				close(sizes)
				return
			}
			sizes <- n + 28
		}
	}()
	arrives := func(size int) bool {
		if _, err := src.WriteToUDPAddrPort(make([]byte, size-28), dst); err != nil && !lost(err) {
			t.Fatal(err)
		}
		if _, err := src.WriteToUDPAddrPort([]byte{1}, dst); err != nil {
			t.Fatal(err)
		}
		got := false
		for {
			select {
			case n, ok := <-sizes:
				if !ok {
					t.Fatal("sink closed")
				}
				if n == 29 {
					return got
				}
				got = got || n == size
			case <-time.After(5 * time.Minute):
				t.Fatal("the marker never arrived")
			}
		}
	}
	if !arrives(lo) {
		t.Fatalf("oracle: %d bytes do not pass", lo)
	}
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if arrives(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	sink.Close()
	return lo
}

// checkFound asserts that found is what the path passes at the search's
// resolution: it passes, and it gives the inner MTU the true size gives.
func checkFound(t *testing.T, res Result, truth int) {
	t.Helper()
	if res.Unreachable || res.PathMTU == 0 {
		t.Fatalf("got %+v, want the path's size (%d passes)", res, truth)
	}
	if res.PathMTU > truth || floor16(res.PathMTU-60) != floor16(truth-60) {
		t.Errorf("found %d (inner %d); %d passes (inner %d)", res.PathMTU, floor16(res.PathMTU-60), truth, floor16(truth-60))
	}
}

const worldMax = 1500

func TestKernelSearch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, w *world)
	}{
		{"full path", func(t *testing.T, w *world) {
			// The split table sends unmarked packets at 1300: marked probes
			// must not see it.
			w.node.IP(t, "route", "add", "10.2.0.0/24", "via", "10.1.0.2", "mtu", "1300", "table", "900")
			w.node.IP(t, "rule", "add", "not", "fwmark", "0xe00/0xf00", "lookup", "900", "pref", "900")
		}},
		{"silent black hole", func(t *testing.T, w *world) {
			w.peer.IP(t, "link", "set", "p0", "mtu", "1300")
		}},
		{"a hop that sends ICMP", func(t *testing.T, w *world) {
			w.router.IP(t, "link", "set", "r1", "mtu", "1300")
			w.peer.IP(t, "link", "set", "p0", "mtu", "1300")
		}},
		{"ICMP rate-limited in the router", func(t *testing.T, w *world) {
			sysctl(t, w.router, "net/ipv4/icmp_msgs_per_sec", "1")
			sysctl(t, w.router, "net/ipv4/icmp_msgs_burst", "1")
			sysctl(t, w.router, "net/ipv4/icmp_ratelimit", "100000")
			w.router.IP(t, "link", "set", "r1", "mtu", "1340")
			w.peer.IP(t, "link", "set", "p0", "mtu", "1340")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			tc.setup(t, w)
			w.serve(t, func(a netip.Addr) bool { return a == netip.MustParseAddr("10.1.0.1") })
			p := w.prober(t, Config{Mark: 0xe00})
			res, err := p.Search(t.Context(), worldPeer, worldMax)
			if err != nil {
				t.Fatal(err)
			}
			truth := w.passes(t, 40000, 1200, worldMax)
			t.Logf("found %+v; %d passes", res, truth)
			checkFound(t, res, truth)
			if res.Via != ViaResponder {
				t.Errorf("via %q", res.Via)
			}
		})
	}
}

// TestKernelAsymmetricReturn: the peer answers through another, smaller
// path (a black hole at 1300), from another address but for IP_PKTINFO;
// the short answers cross it, so the forward path's size is found.
func TestKernelAsymmetricReturn(t *testing.T) {
	w := newWorld(t)
	w.peer.AddVeth(t, "p1", w.router, "r2")
	w.router.IP(t, "addr", "add", "10.3.0.2/24", "dev", "r2")
	w.router.IP(t, "link", "set", "r2", "mtu", "1300", "up")
	w.peer.IP(t, "addr", "add", "10.3.0.1/24", "dev", "p1")
	w.peer.IP(t, "link", "set", "p1", "up")
	w.peer.IP(t, "route", "add", "10.1.0.0/24", "via", "10.3.0.2", "dev", "p1")
	for _, ifc := range []string{"all", "r0", "r1", "r2"} {
		sysctl(t, w.router, "net/ipv4/conf/"+ifc+"/rp_filter", "0")
	}
	// The answers really take the small path: none leave through p0.
	before := txPackets(t, w.peer, "p0")
	w.serve(t, func(netip.Addr) bool { return true })
	p := w.prober(t, Config{Mark: 0xe00})
	res, err := p.Search(t.Context(), worldPeer, worldMax)
	if err != nil {
		t.Fatal(err)
	}
	truth := w.passes(t, 40000, 1200, worldMax)
	t.Logf("found %+v; %d passes forward", res, truth)
	checkFound(t, res, truth)
	if after := txPackets(t, w.peer, "p0"); after-before > 4 {
		t.Errorf("p0 sent %d packets: the answers did not take the return path", after-before)
	}
}

// txPackets is the packets link dev in ns has sent.
func txPackets(t *testing.T, ns *netwatchtest.NetNS, dev string) int {
	t.Helper()
	var links []struct {
		Stats struct {
			TX struct {
				Packets int `json:"packets"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	ns.IPJSON(t, &links, "-s", "link", "show", "dev", dev)
	if len(links) != 1 {
		t.Fatalf("ip -s link show dev %s: %d links", dev, len(links))
	}
	return links[0].Stats.TX.Packets
}

// TestKernelUnreachable: a peer without a responder, and one whose
// responder refuses the node, are unreachable (the caller changes nothing);
// with ICMPEcho the first is found through ping.
func TestKernelUnreachable(t *testing.T) {
	t.Run("no responder", func(t *testing.T) {
		w := newWorld(t)
		p := w.prober(t, Config{Mark: 0xe00, Timeout: 200 * time.Millisecond})
		res, err := p.Search(t.Context(), worldPeer, worldMax)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Unreachable || res.PathMTU != 0 || res.Probes == 0 {
			t.Errorf("got %+v, want unreachable", res)
		}
	})
	t.Run("refused", func(t *testing.T) {
		w := newWorld(t)
		r := w.serve(t, func(a netip.Addr) bool { return a == netip.MustParseAddr("10.9.9.9") })
		p := w.prober(t, Config{Mark: 0xe00, Timeout: 200 * time.Millisecond})
		res, err := p.Search(t.Context(), worldPeer, worldMax)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Unreachable || res.PathMTU != 0 {
			t.Errorf("got %+v, want unreachable", res)
		}
		if s := r.Stats(); s.Refused != uint64(res.Probes) || s.Answered != 0 {
			t.Errorf("responder %+v after %d probes, want all refused", s, res.Probes)
		}
	})
	t.Run("ICMP echo", func(t *testing.T) {
		w := newWorld(t)
		sysctl(t, w.node, "net/ipv4/ping_group_range", "0 0")
		w.peer.IP(t, "link", "set", "p0", "mtu", "1300")
		p := w.prober(t, Config{Mark: 0xe00, ICMPEcho: true, Timeout: 200 * time.Millisecond})
		res, err := p.Search(t.Context(), worldPeer, worldMax)
		if err != nil {
			t.Fatal(err)
		}
		truth := w.passes(t, 40000, 1200, worldMax)
		t.Logf("found %+v; %d passes", res, truth)
		checkFound(t, res, truth)
		if res.Via != ViaICMPEcho {
			t.Errorf("via %q, want %q", res.Via, ViaICMPEcho)
		}
	})
}

// TestKernelECMP: the router spreads flows (hashed on ports) over two
// legs to the peer, one a silent black hole at 1300. The search, from
// source ports on both legs, finds the small leg's size.
func TestKernelECMP(t *testing.T) {
	w := newWorld(t)
	target := netip.MustParseAddr("10.9.0.1")
	w.peer.IP(t, "addr", "add", "10.9.0.1/32", "dev", "lo")
	w.peer.AddVeth(t, "p1", w.router, "r2")
	w.router.IP(t, "addr", "add", "10.3.0.2/24", "dev", "r2")
	w.router.IP(t, "link", "set", "r2", "up")
	w.peer.IP(t, "addr", "add", "10.3.0.1/24", "dev", "p1")
	w.peer.IP(t, "link", "set", "p1", "mtu", "1300", "up")
	for _, ifc := range []string{"all", "default", "p0", "p1"} {
		sysctl(t, w.peer, "net/ipv4/conf/"+ifc+"/rp_filter", "0")
	}
	sysctl(t, w.router, "net/ipv4/fib_multipath_hash_policy", "1")
	w.router.IP(t, "route", "add", "10.9.0.1/32", "nexthop", "via", "10.2.0.1", "dev", "r1", "nexthop", "via", "10.3.0.1", "dev", "r2")

	// Which leg does each source port take? The peer's socket on the
	// probes' port says on which link each datagram came in (IP_PKTINFO),
	// before the responder takes the port.
	small, big := legsByPort(t, w, target, 41000, 41032)
	if len(small) < 2 || len(big) < 2 {
		t.Fatalf("32 ports: %d on the small leg, %d on the other: the router does not hash on ports", len(small), len(big))
	}
	t.Logf("ports on the small leg %v, on the full one %v", small, big)

	// The flows the probes will be (to the responder's port), before the
	// responder takes it.
	truth := w.passesTo(t, netip.AddrPortFrom(target, DefaultPort), int(small[0]), 1200, worldMax)
	full := w.passesTo(t, netip.AddrPortFrom(target, DefaultPort), int(big[0]), 1200, worldMax)
	w.serve(t, func(netip.Addr) bool { return true })
	if truth >= full {
		t.Fatalf("the legs pass %d and %d: not an ECMP pair with a small leg", truth, full)
	}
	p := w.prober(t, Config{Mark: 0xe00, SourcePorts: []uint16{big[0], small[0], big[1], small[1]}})
	res, err := p.Search(t.Context(), target, worldMax)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("found %+v; the small leg passes %d, the other %d", res, truth, full)
	checkFound(t, res, truth)
}

// legsByPort sends one datagram from each node port in [from, to), until
// two have reached the peer by each leg, to target's probe port and
// returns the ports whose datagram reached it on p1 (the small leg) and on
// p0. The peer reads them on a socket
// that reports each datagram's incoming link: no count of a link's
// packets, which a late packet of an earlier send (or an ARP) would skew.
func legsByPort(t *testing.T, w *world, target netip.Addr, from, to int) (small, big []uint16) {
	t.Helper()
	var rc *net.UDPConn
	if err := w.peer.Do(func() (err error) {
		rc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: target.AsSlice(), Port: DefaultPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	raw, err := rc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	p1 := int(w.peer.LinkIndex(t, "p1"))
	rc.SetReadDeadline(time.Now().Add(2 * time.Minute)) // only a hang reaches it
	buf, oob := make([]byte, 16), make([]byte, 256)
	for port := from; port < to && (len(small) < 2 || len(big) < 2); port++ {
		err := w.node.Do(func() error {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: port})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.WriteToUDPAddrPort([]byte{1}, netip.AddrPortFrom(target, DefaultPort))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		// Its datagram (an ARP's delay may hold it; a lost one is sent
		// again by no one: the links are lossless veths).
		for {
			_, oobn, _, src, err := rc.ReadMsgUDPAddrPort(buf, oob)
			if err != nil {
				t.Fatalf("port %d: %v", port, err)
			}
			if int(src.Port()) != port {
				continue // a datagram of an earlier port, read already
			}
			idx, ok := pktinfoIndex(oob[:oobn])
			if !ok {
				t.Fatalf("port %d: no IP_PKTINFO", port)
			}
			if idx == p1 {
				small = append(small, uint16(port))
			} else {
				big = append(big, uint16(port))
			}
			break
		}
	}
	return small, big
}

// pktinfoIndex is the incoming link of a datagram's IP_PKTINFO.
func pktinfoIndex(oob []byte) (int, bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo {
			return int(int32(binary.NativeEndian.Uint32(m.Data[:4]))), true
		}
	}
	return 0, false
}

// TestKernelResponderHostile floods the responder with garbage from an
// accepted node and from a local process it does not accept: each costs
// one read, nothing is answered, and a search still finds the path.
func TestKernelResponderHostile(t *testing.T) {
	w := newWorld(t)
	node := netip.MustParseAddr("10.1.0.1")
	r := w.serve(t, func(a netip.Addr) bool { return a == node })
	flood := func(ns *netwatchtest.NetNS, dst netip.Addr, n int) {
		err := ns.Do(func() error {
			c, err := net.ListenUDP("udp4", nil)
			if err != nil {
				return err
			}
			defer c.Close()
			junk := make([]byte, 1400)
			for i := range junk {
				junk[i] = byte(i)
			}
			for range n {
				if _, err := c.WriteToUDPAddrPort(junk, netip.AddrPortFrom(dst, DefaultPort)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Each flood until the responder has read some of it: a burst the
	// socket's queue, still full of the last, dropped whole on a busy
	// machine (0 malformed).
	floodUntil := func(ns *netwatchtest.NetNS, dst netip.Addr, what string, read func(ResponderStats) uint64) {
		deadline := time.Now().Add(2 * time.Minute) // only a hang reaches it
		for sent := 0; read(r.Stats()) == 0; sent += 100 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: none of %d datagrams read: %+v", what, sent, r.Stats())
			}
			flood(ns, dst, 100)
		}
	}
	floodUntil(w.peer, netip.MustParseAddr("127.0.0.1"), "a local process", func(s ResponderStats) uint64 { return s.Refused })
	floodUntil(w.node, worldPeer, "an accepted node", func(s ResponderStats) uint64 { return s.Malformed })
	p := w.prober(t, Config{Mark: 0xe00})
	res, err := p.Search(t.Context(), worldPeer, worldMax)
	if err != nil {
		t.Fatal(err)
	}
	if res.PathMTU != worldMax {
		t.Errorf("after the flood: %+v, want %d", res, worldMax)
	}
	// The socket reads in order: the search's answers came after the flood
	// (less what the queues dropped of a burst) was read. A probe can be
	// lost to a queue still full of the flood on a busy machine (the search
	// repeats it), so the answers are at most the probes, and some.
	st := r.Stats()
	t.Logf("after the flood and a search of %d probes: %+v", res.Probes, st)
	if st.Answered == 0 || st.Answered > uint64(res.Probes) || st.Refused == 0 || st.Malformed == 0 || st.Refused > 500 || st.Malformed > 500 {
		t.Errorf("after the flood and a search of %d probes: %+v", res.Probes, st)
	}
}
