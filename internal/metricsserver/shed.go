package metricsserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ShedListener accepts at most max connections at a time; when all are taken,
// Accept makes room by closing an idle one (see the package doc) instead of
// leaving the next client to wait behind them. Only when every connection is
// serving a request does Accept wait for one to end.
//
// A connection is serving from the moment its request reaches the handler
// that Handler wraps until http.Server reports it idle (ConnState): give the
// server ConnState, ConnContext and Handler's handler, as Serve does.
type ShedListener struct {
	net.Listener
	max int

	mu      sync.Mutex // guards conns and pending
	conns   map[*shedConn]struct{}
	pending int // Accepts under way with a slot taken

	wake      chan struct{} // a slot may have freed (capacity 1)
	closed    chan struct{}
	closeOnce sync.Once
	shed      atomic.Uint64
	owners    owners // Accept's goroutine alone
}

// shedConn is an accepted connection and what the listener knows of it.
type shedConn struct {
	net.Conn
	l     *ShedListener
	key   client
	since time.Time // accepted, or last idle
	// serving: a request reached the handler and its answer is not written
	// yet; answered: one was answered (the connection idles in keep-alive).
	serving, answered bool // guarded by l.mu
	once              sync.Once
}

// NewShedListener wraps ln, holding at most n connections (at least 1).
func NewShedListener(ln net.Listener, n int) *ShedListener {
	return &ShedListener{
		Listener: ln,
		max:      max(n, 1),
		conns:    make(map[*shedConn]struct{}),
		wake:     make(chan struct{}, 1),
		closed:   make(chan struct{}),
	}
}

// Accept waits for a slot, shedding an idle connection when all are taken,
// then for the next connection.
func (l *ShedListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if len(l.conns)+l.pending < l.max {
			l.pending++
			l.mu.Unlock()
			break
		}
		v, retry := l.victim(time.Now())
		if v != nil {
			delete(l.conns, v)
		}
		l.mu.Unlock()
		if v != nil {
			l.shed.Add(1)
			v.Conn.Close() // its server goroutine sees the error and ends
			continue
		}
		var timer <-chan time.Time
		if retry > 0 {
			t := time.NewTimer(retry)
			timer = t.C
			defer t.Stop()
		}
		select {
		case <-l.wake:
		case <-timer:
		case <-l.closed:
			l.owners.close()
			return nil, net.ErrClosed
		}
	}
	c, err := l.Listener.Accept()
	var key client
	if err == nil {
		key = l.client(c)
	}
	l.mu.Lock()
	l.pending--
	var sc *shedConn
	if err == nil {
		sc = &shedConn{Conn: c, l: l, key: key, since: time.Now()}
		l.conns[sc] = struct{}{}
	}
	l.mu.Unlock()
	if err != nil {
		select {
		case <-l.closed:
			l.owners.close()
		default:
		}
		l.signal()
		return nil, err
	}
	return sc, nil
}

// Grace is how long a new connection may take to send its request before it
// counts as idle, unless its client holds half the connections or more: a
// client sends its request at once, but the kernel hands the connection over
// before the client's first write.
const Grace = 250 * time.Millisecond

// victim picks the connection to shed, or nil when none is idle: of the
// client holding the most connections, one that was answered before one that
// was not, then the one idle longest. A connection that has not reached the
// handler is idle when no request waits to be read, and it is Grace old or
// its client holds half the connections or more (a flood: it cannot make the
// others wait by opening connections faster than they age). With no victim,
// retry says when one of the connections now held may become one (0: only
// when one is closed or answered). l.mu is held.
func (l *ShedListener) victim(now time.Time) (v *shedConn, retry time.Duration) {
	held := make(map[client]int, 8)
	cands := make([]*shedConn, 0, len(l.conns))
	for c := range l.conns {
		held[c.key]++
		if !c.serving {
			cands = append(cands, c)
		}
	}
	slices.SortFunc(cands, func(a, b *shedConn) int {
		if n := cmp.Compare(held[b.key], held[a.key]); n != 0 {
			return n
		}
		if a.answered != b.answered {
			if a.answered {
				return -1
			}
			return 1
		}
		return a.since.Compare(b.since)
	})
	for _, c := range cands {
		switch age := now.Sub(c.since); {
		case c.answered:
			return c, 0
		case age < Grace && 2*held[c.key] < l.max:
			if r := Grace - age; retry == 0 || r < retry {
				retry = r
			}
		case !waiting(c.Conn):
			return c, 0
		}
	}
	return nil, retry
}

// client names who holds a connection: an IPv4 address or an IPv6 /64 (one
// host's share of a network), and on loopback the user who owns the other
// end (the kubelet is root; another local user is not).
type client struct {
	net netip.Prefix
	uid uint32
	// local: uid is known.
	local bool
}

// client returns c's client. Only Accept's goroutine calls it.
func (l *ShedListener) client(c net.Conn) client {
	var k client
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		ip = ip.Unmap()
		bits := 32
		if ip.Is6() {
			bits = 64
		}
		k.net, _ = ip.Prefix(bits)
	}
	k.uid, k.local = l.owners.uid(c.LocalAddr(), c.RemoteAddr())
	return k
}

func (l *ShedListener) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Close closes the listener and ends an Accept waiting for a slot.
func (l *ShedListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Shed returns how many connections were shed.
func (l *ShedListener) Shed() uint64 { return l.shed.Load() }

// Close closes the connection and gives its slot back.
func (c *shedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		c.l.signal()
	})
	return err
}

type connKey struct{}

// ConnContext is http.Server.ConnContext: it makes the connection known to
// Handler.
func (l *ShedListener) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if sc := unwrap(c); sc != nil {
		return context.WithValue(ctx, connKey{}, sc)
	}
	return ctx
}

// ConnState is http.Server.ConnState: a connection that is idle again can be
// shed.
func (l *ShedListener) ConnState(c net.Conn, s http.ConnState) {
	if s != http.StateIdle {
		return
	}
	if sc := unwrap(c); sc != nil {
		l.mu.Lock()
		sc.serving, sc.answered, sc.since = false, true, time.Now()
		l.mu.Unlock()
		l.signal()
	}
}

// Handler wraps h so that a connection whose request reached it is serving
// (not to be shed) until its answer is written.
func (l *ShedListener) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sc, ok := r.Context().Value(connKey{}).(*shedConn); ok {
			l.mu.Lock()
			sc.serving = true
			l.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// unwrap finds the shedConn under c (a *tls.Conn wraps it).
func unwrap(c net.Conn) *shedConn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, _ := c.(*shedConn)
	return sc
}
