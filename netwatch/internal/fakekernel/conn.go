//go:build linux

package fakekernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"os"
	"sync"
	"time"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Receive-queue accounting, after the kernel: a socket's buffer is
// SO_RCVBUF doubled (rmem_default when unset), and each datagram costs its
// bytes plus the sk_buff around them.
const (
	defaultRcvbuf = 212992
	minRcvbuf     = 4608
	skbOverhead   = 768
)

// FakeConn is a NETLINK_ROUTE socket on a Kernel. It has the methods of
// rtnl.Conn; requests go through a real *netlink.Conn, so sequence
// numbers, validation of replies and error decoding are the library's own.
type FakeConn struct {
	nl   *netlink.Conn
	sock *socket
}

// DialConn opens a socket on k that has joined the rtnetlink multicast
// groups (RTNLGRP_* numbers) and has a receive buffer of readBuffer bytes
// (0 keeps the kernel's default), like netwatch's dialer.
func (k *Kernel) DialConn(groups []uint32, readBuffer int) (*FakeConn, error) {
	if readBuffer < 0 {
		return nil, fmt.Errorf("netwatchtest: dial: receive buffer %d: %w", readBuffer, unix.EINVAL)
	}
	capacity := defaultRcvbuf
	if readBuffer > 0 {
		capacity = max(2*readBuffer, minRcvbuf)
	}
	s := &socket{k: k, capacity: capacity, groups: map[uint32]bool{}, wake: make(chan struct{})}
	for _, g := range groups {
		if g == 0 || g > rtnlgrpMax {
			return nil, fmt.Errorf("netwatchtest: dial: join group %d: %w", g, unix.EINVAL)
		}
		s.groups[g] = true
	}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return nil, fmt.Errorf("netwatchtest: dial: %w", errKernelClosed)
	}
	k.nextPort++
	s.port = k.nextPort
	c := &FakeConn{sock: s}
	s.conn = c
	k.conns[c] = struct{}{}
	k.mu.Unlock()
	c.nl = netlink.NewConn(s, s.port)
	return c, nil
}

// Execute sends a request and returns its replies (netlink.Conn.Execute).
func (c *FakeConn) Execute(m netlink.Message) ([]netlink.Message, error) { return c.nl.Execute(m) }

// Send sends a request without waiting for its replies (netlink.Conn.Send).
func (c *FakeConn) Send(m netlink.Message) (netlink.Message, error) { return c.nl.Send(m) }

// ReceiveIter yields the messages of one datagram, or of a whole
// multi-part dump (netlink.Conn.ReceiveIter). It blocks until something
// arrives, the read deadline passes or the conn is closed.
func (c *FakeConn) ReceiveIter() iter.Seq2[netlink.Message, error] { return c.nl.ReceiveIter() }

// ReceiveDatagram reads one datagram into b or, when it is longer, into a
// new buffer, and returns it. It blocks as ReceiveIter.
func (c *FakeConn) ReceiveDatagram(b []byte) ([]byte, error) {
	d, err := c.sock.next()
	if err != nil {
		return nil, err
	}
	if len(d) > len(b) {
		b = make([]byte, len(d))
	}
	return b[:copy(b, d)], nil
}

// ReceiveBatch is ReceiveDatagram appending to b: the fake hands out one
// datagram per call, which a batch may be.
func (c *FakeConn) ReceiveBatch(b []byte) ([]byte, error) {
	d, err := c.sock.next()
	if err != nil {
		return b, err
	}
	return append(b, d...), nil
}

// SetReadDeadline sets the deadline of pending and future receives; the
// zero time removes it. A receive past it fails with an error matching
// os.ErrDeadlineExceeded.
func (c *FakeConn) SetReadDeadline(t time.Time) error { return c.nl.SetReadDeadline(t) }

// Close closes the conn and unblocks a pending receive, which then fails
// (EBADF, as a closed socket). It is safe to call more than once.
func (c *FakeConn) Close() error { return c.nl.Close() }

// PID is the conn's netlink port ID: events caused by its own requests
// carry it.
func (c *FakeConn) PID() uint32 { return c.sock.port }

// A datagram is what one recvmsg returns: one or more messages.
type datagram struct {
	b    []byte
	cost int
}

// socket is the netlink.Socket under a FakeConn's *netlink.Conn.
type socket struct {
	k      *Kernel
	conn   *FakeConn
	port   uint32
	groups map[uint32]bool // immutable after DialConn

	mu       sync.Mutex
	queue    []datagram
	used     int
	capacity int
	overrun  bool // the next receive fails with ENOBUFS
	// congested: multicast is dropped, silently after the first ENOBUFS,
	// until the queue has been read empty (the kernel's
	// NETLINK_S_CONGESTED).
	congested bool
	closed    bool
	deadline  time.Time
	wake      chan struct{} // closed and replaced when any of the above changes
}

func (s *socket) signal() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// enqueue adds a datagram. A multicast datagram that does not fit, or
// comes while the socket is congested, is dropped; the first drop of a
// congestion marks the socket overrun. Replies always go in.
func (s *socket) enqueue(b []byte, multicast bool) {
	cost := len(b) + skbOverhead
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if multicast && (s.congested || s.used > s.capacity) {
		if !s.congested {
			s.congested, s.overrun = true, true
			s.signal()
		}
		return
	}
	s.queue = append(s.queue, datagram{b, cost})
	s.used += cost
	s.signal()
}

func (s *socket) injectOverrun() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.overrun, s.congested = true, true
		s.signal()
	}
}

// Send hands a request to the kernel, which queues its replies.
func (s *socket) Send(m netlink.Message) error {
	return s.SendMessages([]netlink.Message{m})
}

// SendMessages hands requests to the kernel in order.
func (s *socket) SendMessages(msgs []netlink.Message) error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return os.NewSyscallError("sendmsg", unix.EBADF)
	}
	for _, m := range msgs {
		b, err := m.MarshalBinary()
		if err != nil {
			return os.NewSyscallError("sendmsg", unix.EINVAL)
		}
		s.k.receive(s, b)
	}
	return nil
}

// Receive returns the messages of one datagram.
func (s *socket) Receive() ([]netlink.Message, error) {
	var msgs []netlink.Message
	for m, err := range s.ReceiveIter() {
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

// ReceiveIter waits for one datagram and yields its messages.
func (s *socket) ReceiveIter() iter.Seq2[netlink.Message, error] {
	return func(yield func(netlink.Message, error) bool) {
		b, err := s.next()
		if err != nil {
			yield(netlink.Message{}, err)
			return
		}
		msgs, err := parseDatagram(b)
		if err != nil {
			yield(netlink.Message{}, err)
			return
		}
		for _, m := range msgs {
			if !yield(m, nil) {
				return
			}
		}
	}
}

// next blocks until a datagram, an error, the deadline or Close. As with
// a real socket, a deadline that has passed fails the receive even when
// data is queued, and a pending ENOBUFS comes before queued data.
func (s *socket) next() ([]byte, error) {
	for {
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			return nil, os.NewSyscallError("recvmsg", unix.EBADF)
		case !s.deadline.IsZero() && !time.Now().Before(s.deadline):
			s.mu.Unlock()
			return nil, os.ErrDeadlineExceeded
		case s.overrun:
			// As the kernel: the socket error comes before queued data,
			// and a receive that finds the queue empty ends congestion.
			s.overrun = false
			if len(s.queue) == 0 {
				s.congested = false
			}
			s.mu.Unlock()
			return nil, os.NewSyscallError("recvmsg", unix.ENOBUFS)
		case len(s.queue) > 0:
			d := s.queue[0]
			s.queue[0] = datagram{}
			s.queue = s.queue[1:]
			s.used -= d.cost
			if len(s.queue) == 0 {
				s.congested = false
			}
			s.mu.Unlock()
			return d.b, nil
		}
		deadline, wake := s.deadline, s.wake
		s.mu.Unlock()
		if deadline.IsZero() {
			<-wake
			continue
		}
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// Close closes the socket: pending and later receives fail, and the
// kernel forgets it.
func (s *socket) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.queue = nil
	s.used = 0
	s.signal()
	s.mu.Unlock()
	s.k.forget(s.conn)
	return nil
}

// SetDeadline sets the read deadline (writes never block).
func (s *socket) SetDeadline(t time.Time) error { return s.SetReadDeadline(t) }

// SetReadDeadline sets the read deadline and wakes a pending receive to
// look at it.
func (s *socket) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return os.NewSyscallError("setsockopt", unix.EBADF)
	}
	s.deadline = t
	s.signal()
	return nil
}

// SetWriteDeadline is accepted and ignored: sends never block.
func (s *socket) SetWriteDeadline(time.Time) error { return nil }

// parseDatagram splits a datagram into messages, as a netlink socket does.
func parseDatagram(b []byte) ([]netlink.Message, error) {
	var msgs []netlink.Message
	for len(b) > 0 {
		if len(b) < 16 {
			return nil, errors.New("netwatchtest: short netlink message in datagram")
		}
		l := int(binary.NativeEndian.Uint32(b))
		al := align(l)
		if l < 16 || al > len(b) {
			return nil, fmt.Errorf("netwatchtest: bad netlink message length %d in datagram of %d bytes", l, len(b))
		}
		var m netlink.Message
		if err := m.UnmarshalBinary(b[:al]); err != nil {
			return nil, fmt.Errorf("netwatchtest: %w", err)
		}
		msgs = append(msgs, m)
		b = b[al:]
	}
	return msgs, nil
}

func align(n int) int { return (n + 3) &^ 3 }

// NetNS returns the netwatch.NetNS of k: given to netwatch.Options.NetNS or
// netwatch.DialApplier, it puts a Watcher or an Applier on the fake kernel.
// It needs no closing.
func (k *Kernel) NetNS() *rtnl.NetNS { return rtnl.FakeNetNS(dialer{k}) }

type dialer struct{ k *Kernel }

func (d dialer) Dial(cfg rtnl.DialConfig) (rtnl.Conn, error) {
	return d.k.DialConn(cfg.Groups, cfg.ReadBuffer)
}

// Of returns the fake kernel that handed ns out (NetNS), or false for a
// namespace of the real kernel.
func Of(ns *rtnl.NetNS) (*Kernel, bool) {
	_, d := rtnl.Target(ns)
	fd, ok := d.(dialer)
	return fd.k, ok
}
