//go:build linux

package pathprobe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NewProber opens the Prober's sockets, in the network namespace of the
// calling thread, and returns it: Config.Sources UDP sockets per family,
// each with DF set in probe mode (IP_PMTUDISC_PROBE, IPV6_PMTUDISC_PROBE:
// a path-MTU exception learned a moment earlier does not cut the search
// short) and SO_MARK set to Config.Mark; with Config.ICMPEcho, as many ping
// sockets per family. A family whose sockets cannot be opened (IPv6
// disabled) is left out: Search returns an error for its peers. It fails
// when neither family opens, when Mark cannot be set (CAP_NET_ADMIN), or
// when ICMPEcho is set and ping sockets are not permitted.
func NewProber(cfg Config) (*Prober, error) {
	p, err := newProber(cfg)
	if err != nil {
		return nil, err
	}
	var errs [2]error
	for i, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		x, err := openExchanger(p.cfg, fam, false)
		if err != nil {
			errs[i] = err
			continue
		}
		p.closers = append(p.closers, x.close)
		if fam == unix.AF_INET {
			p.udp = x
		} else {
			p.udp6 = x
		}
		if !p.cfg.ICMPEcho {
			continue
		}
		x, err = openExchanger(p.cfg, fam, true)
		if err != nil {
			p.Close()
			return nil, err
		}
		p.closers = append(p.closers, x.close)
		if fam == unix.AF_INET {
			p.icmp = x
		} else {
			p.icmp6 = x
		}
	}
	if p.udp == nil && p.udp6 == nil {
		return nil, errors.Join(errs[0], errs[1])
	}
	if errors.Is(errs[0], unix.EPERM) || errors.Is(errs[1], unix.EPERM) {
		p.Close()
		return nil, errors.Join(errs[0], errs[1])
	}
	return p, nil
}

// sockExchanger carries rounds over one socket per source: UDP to the
// responders, or ICMP echo over ping sockets.
type sockExchanger struct {
	conns   []*net.UDPConn
	icmp    bool
	v6      bool
	port    uint16 // the responders' port (UDP only)
	timeout time.Duration

	mu      sync.Mutex
	waiting map[uint64]waiter // guarded by mu; by nonce
	wg      sync.WaitGroup
	once    sync.Once
}

// waiter is one probe waiting for its answer.
type waiter struct {
	r      *round
	i      int        // index in the round
	src    int        // the socket it was sent from
	peer   netip.Addr // who must answer
	length uint32     // the payload length the answer must state (UDP)
}

// round is the probes of one exchange, answered or not.
type round struct {
	answered []bool // guarded by the exchanger's mu
	left     int    // guarded by the exchanger's mu
	done     chan struct{}
}

// openExchanger opens cfg.Sources sockets of family fam (ping sockets when
// icmp) and starts a reader on each.
func openExchanger(cfg Config, fam int, icmp bool) (*sockExchanger, error) {
	x := &sockExchanger{icmp: icmp, v6: fam == unix.AF_INET6, port: cfg.Port, timeout: cfg.Timeout, waiting: make(map[uint64]waiter)}
	for i := range cfg.Sources {
		var port uint16
		if i < len(cfg.SourcePorts) && !icmp {
			port = cfg.SourcePorts[i]
		}
		c, err := openSocket(fam, icmp, cfg.Mark, port)
		if err != nil {
			for _, c := range x.conns {
				c.Close()
			}
			return nil, err
		}
		x.conns = append(x.conns, c)
	}
	for i, c := range x.conns {
		x.wg.Add(1)
		go x.read(i, c)
	}
	return x, nil
}

// openSocket opens one probe socket: DF in probe mode, the mark, bound to
// port (0: the kernel's choice).
func openSocket(fam int, icmp bool, mark uint32, port uint16) (*net.UDPConn, error) {
	what := "udp"
	proto := unix.IPPROTO_UDP
	if icmp {
		what = "ping"
		proto = unix.IPPROTO_ICMP
		if fam == unix.AF_INET6 {
			proto = unix.IPPROTO_ICMPV6
		}
	}
	if fam == unix.AF_INET6 {
		what += "6"
	} else {
		what += "4"
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		if icmp && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)) {
			return nil, fmt.Errorf("pathprobe: open %s socket: %w (ping sockets need the process's group in net.ipv4.ping_group_range)", what, err)
		}
		return nil, fmt.Errorf("pathprobe: open %s socket: %w", what, err)
	}
	if err := setProbeOptions(fd, fam, mark); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pathprobe: open %s socket: %w", what, err)
	}
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: int(port)}
	if fam == unix.AF_INET6 {
		sa = &unix.SockaddrInet6{Port: int(port)}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("pathprobe: open %s socket: IPV6_V6ONLY: %w", what, err)
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pathprobe: open %s socket: bind port %d: %w", what, port, err)
	}
	f := os.NewFile(uintptr(fd), what)
	pc, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("pathprobe: open %s socket: %w", what, err)
	}
	c, ok := pc.(*net.UDPConn)
	if !ok {
		pc.Close()
		return nil, fmt.Errorf("pathprobe: open %s socket: got a %T", what, pc)
	}
	return c, nil
}

// setProbeOptions sets DF in probe mode and the mark on fd.
func setProbeOptions(fd, fam int, mark uint32) error {
	if fam == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE); err != nil {
			return fmt.Errorf("IPV6_MTU_DISCOVER: %w", err)
		}
	} else if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE); err != nil {
		return fmt.Errorf("IP_MTU_DISCOVER: %w", err)
	}
	if mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(mark)); err != nil {
			return fmt.Errorf("SO_MARK %#x (needs CAP_NET_ADMIN): %w", mark, err)
		}
	}
	return nil
}

// exchange sends the round's probes, one after the other, and waits until
// all are answered or the timeout passes.
func (x *sockExchanger) exchange(ctx context.Context, peer netip.Addr, probes []probe) ([]bool, error) {
	r := &round{answered: make([]bool, len(probes)), left: len(probes), done: make(chan struct{})}
	nonces := make([]uint64, len(probes))
	largest := 0
	x.mu.Lock()
	for i, pr := range probes {
		n := rand.Uint64()
		for _, taken := x.waiting[n]; taken; _, taken = x.waiting[n] {
			n = rand.Uint64()
		}
		nonces[i] = n
		x.waiting[n] = waiter{r: r, i: i, src: pr.src, peer: peer, length: uint32(x.payload(peer, pr.size))}
		largest = max(largest, pr.size)
	}
	x.mu.Unlock()
	defer func() {
		x.mu.Lock()
		for _, n := range nonces {
			delete(x.waiting, n)
		}
		x.mu.Unlock()
	}()

	buf := make([]byte, x.payload(peer, largest))
	dst := netip.AddrPortFrom(peer, x.port)
	if x.icmp {
		dst = netip.AddrPortFrom(peer, 0)
	}
	for i, pr := range probes {
		b := buf[:x.payload(peer, pr.size)]
		x.encode(b, nonces[i], peer)
		if _, err := x.conns[pr.src].WriteToUDPAddrPort(b, dst); err != nil {
			if !lost(err) {
				return nil, fmt.Errorf("pathprobe: send %d bytes to %s: %w", pr.size, peer, err)
			}
			x.mu.Lock()
			if _, ok := x.waiting[nonces[i]]; ok {
				delete(x.waiting, nonces[i])
				x.settle(r)
			}
			x.mu.Unlock()
		}
	}
	t := time.NewTimer(x.timeout)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]bool(nil), r.answered...), nil
}

// settle counts one probe of r as done (answered or lost); x.mu is held.
func (x *sockExchanger) settle(r *round) {
	r.left--
	if r.left == 0 {
		close(r.done)
	}
}

// payload is the bytes written to the socket for a probe of size bytes of
// IP packet: the UDP payload, or the ICMP header and data.
func (x *sockExchanger) payload(peer netip.Addr, size int) int {
	if x.icmp {
		return size - overhead(peer) + l4Header
	}
	return size - overhead(peer)
}

// encode writes a probe with nonce into b.
func (x *sockExchanger) encode(b []byte, nonce uint64, peer netip.Addr) {
	if !x.icmp {
		message{typ: typeProbe, nonce: nonce, length: uint32(len(b))}.put(b)
		return
	}
	clear(b[:l4Header])
	b[0] = 8 // echo request
	if x.v6 {
		b[0] = 128
	}
	b[6], b[7] = byte(nonce>>8), byte(nonce) // sequence; the kernel sets the identifier and checksum
	message{typ: typeProbe, nonce: nonce, length: uint32(len(b) - l4Header)}.put(b[l4Header:])
}

// decode reads an answer from b: its nonce and the length it states.
func (x *sockExchanger) decode(b []byte, from netip.AddrPort) (nonce uint64, length uint32, ok bool) {
	if !x.icmp {
		m, ok := parse(b)
		if !ok || m.typ != typeAnswer || from.Port() != x.port {
			return 0, 0, false
		}
		return m.nonce, m.length, true
	}
	reply := byte(0)
	if x.v6 {
		reply = 129
	}
	if len(b) < l4Header || b[0] != reply || b[1] != 0 {
		return 0, 0, false
	}
	m, ok := parse(b[l4Header:])
	if !ok || m.typ != typeProbe {
		return 0, 0, false
	}
	return m.nonce, m.length, true
}

// read receives answers on socket src until it is closed.
func (x *sockExchanger) read(src int, c *net.UDPConn) {
	defer x.wg.Done()
	buf := make([]byte, 128)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		nonce, length, ok := x.decode(buf[:n], from)
		if !ok {
			continue
		}
		x.mu.Lock()
		w, ok := x.waiting[nonce]
		if ok && w.src == src && w.peer == from.Addr().Unmap() && (x.icmp || w.length == length) {
			delete(x.waiting, nonce)
			w.r.answered[w.i] = true
			x.settle(w.r)
		}
		x.mu.Unlock()
	}
}

// close closes the sockets and waits for the readers.
func (x *sockExchanger) close() error {
	var errs []error
	x.once.Do(func() {
		for _, c := range x.conns {
			errs = append(errs, c.Close())
		}
		x.wg.Wait()
	})
	return errors.Join(errs...)
}

// lost reports whether a send error means the probe is lost rather than
// that the search cannot go on: too large for the route (a local limit),
// no route, a filter, a full queue.
func lost(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case unix.EMSGSIZE, unix.ENETUNREACH, unix.EHOSTUNREACH, unix.ECONNREFUSED, unix.ENOBUFS,
		unix.EPERM, unix.EACCES, unix.EHOSTDOWN, unix.ENETDOWN, unix.EINVAL:
		return true
	}
	return false
}
