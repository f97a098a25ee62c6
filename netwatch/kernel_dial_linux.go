//go:build linux

package netwatch

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// kernelDialer dials the kernel's rtnetlink, in the network namespace
// netns (a file descriptor of /proc/.../ns/net) or, when it is 0, in the
// calling thread's namespace.
type kernelDialer struct {
	netns int
}

// dialerOf is the dialer of ns: the kernel in that namespace, or a fake
// kernel's.
func dialerOf(ns *NetNS) rtnl.Dialer {
	fd, d := rtnl.Target((*rtnl.NetNS)(ns))
	if d != nil {
		return d
	}
	return kernelDialer{netns: fd}
}

// Dial opens a NETLINK_ROUTE socket with strict dump checking, joins
// cfg.Groups and sets the receive buffer.
func (d kernelDialer) Dial(cfg rtnl.DialConfig) (rtnl.Conn, error) {
	// A fixed receive buffer spares a MSG_PEEK per datagram, which is one
	// of the two syscalls per event (bench: 57k → 72k events/s ingested, a
	// 1M-route sync 2.5 → 1.8 s). Dump datagrams are at most 32 KiB; a
	// link message of a NIC with many VFs can be larger, hence 1 MiB: a
	// truncated message would be an error, never a silent loss.
	size := 1 << 20
	if cfg.MessageBuffer > 0 {
		size = cfg.MessageBuffer
	}
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: d.netns, Strict: true, MessageBufferSize: size})
	if err != nil {
		return nil, fmt.Errorf("netwatch: dial rtnetlink: %w", err)
	}
	if err := c.SetOption(netlink.ExtendedAcknowledge, true); err != nil {
		c.Close()
		return nil, fmt.Errorf("netwatch: enable extended acks: %w", err)
	}
	for _, g := range cfg.Groups {
		if err := c.JoinGroup(g); err != nil {
			c.Close()
			return nil, fmt.Errorf("netwatch: join rtnetlink group %d: %w", g, err)
		}
	}
	if cfg.ReadBuffer > 0 {
		if err := c.SetReadBuffer(cfg.ReadBuffer); err != nil {
			c.Close()
			return nil, fmt.Errorf("netwatch: set receive buffer to %d bytes: %w", cfg.ReadBuffer, err)
		}
	}
	kc := &kernelConn{Conn: c}
	if kc.nonblock, err = nonBlocking(c); err != nil {
		c.Close()
		return nil, fmt.Errorf("netwatch: rtnetlink socket flags: %w", err)
	}
	return kc, nil
}

// nonBlocking reports whether c's socket has O_NONBLOCK, as
// mdlayher/socket opens every socket for the runtime's poller.
func nonBlocking(c *netlink.Conn) (bool, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return false, err
	}
	var flags int
	var ferr error
	if err := rc.Control(func(fd uintptr) { flags, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil {
		return false, err
	}
	return flags&unix.O_NONBLOCK != 0, ferr
}

// owners finds the processes behind the ports of notifications in the
// dialer's namespace.
func (d kernelDialer) owners() ownerFinder { return newPortOwners(d.netns) }

// kernelConn is a *netlink.Conn that can also read a whole datagram, and
// every queued one at once.
type kernelConn struct {
	*netlink.Conn
	rb       *recvBuf // ReceiveBatch's, from its first call; only the reading goroutine uses it
	nonblock bool     // the socket has O_NONBLOCK: ReceiveDatagram may use recvNow
}

// Close closes the socket and releases ReceiveBatch's buffer. Like
// ReceiveBatch, it belongs to the goroutine that reads.
func (c *kernelConn) Close() error {
	err := c.Conn.Close()
	if c.rb != nil {
		unix.Munmap(c.rb.mem)
		c.rb = nil
	}
	return err
}

func (c *kernelConn) ReceiveDatagram(b []byte) ([]byte, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var (
		n       int
		recvErr error
	)
	// The socket is non-blocking: Read waits for data, a deadline or Close
	// while the function reports EAGAIN.
	err = rc.Read(func(fd uintptr) bool {
		// The length first, copying nothing: a datagram longer than b
		// (a link with many VFs) gets a buffer of its own.
		n, recvErr = c.recv(fd, nil, unix.MSG_PEEK|unix.MSG_TRUNC)
		if recvErr == unix.EAGAIN {
			return false
		}
		if recvErr == nil {
			if n > len(b) {
				b = make([]byte, n)
			}
			n, recvErr = c.recv(fd, b, 0)
		}
		return true
	})
	switch {
	case err != nil:
		return nil, err
	case recvErr != nil:
		return nil, os.NewSyscallError("recvfrom", recvErr)
	}
	return b[:n], nil
}

// recv is recvfrom(2) on the socket: recvNow when it cannot block.
func (c *kernelConn) recv(fd uintptr, b []byte, flags int) (int, error) {
	if c.nonblock {
		return recvNow(fd, b, flags)
	}
	n, _, err := unix.Recvfrom(int(fd), b, flags)
	return n, err
}

// recvNow is recvfrom(2) on a non-blocking socket without telling the
// scheduler, as a raw syscall: it returns data or EAGAIN at once, after at
// most the kernel's work for one datagram (a dump's next 32 KiB, ~50–100
// µs), which the goroutine spends holding its P like any run of Go code.
// A notified syscall gives the P up: when the goroutine that caches the
// dump was just woken, the P went to it, and the reader, back from the
// kernel, waited for a P while the dump stood still (a 1,000,000-route
// sync in a fresh process, 10 alternated runs: 1.16× the raw floor with
// notified syscalls, 1.02× with raw ones; 1.33× and 1.15× in a program
// whose main goroutine waits in a select with a timer, as the agent's
// does).
func recvNow(fd uintptr, b []byte, flags int) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(p), uintptr(len(b)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// batchFree is the room ReceiveBatch gives each datagram: more than any
// notification the kernel sends (a link with many VFs is tens of KiB). A
// longer one would be cut short: ReceiveBatch says so rather than lose it
// silently. It is also about how much one round reads.
const batchFree = 256 << 10

// recvSlots is how many datagrams one recvmmsg of ReceiveBatch takes.
const recvSlots = 32

// errTruncated is ReceiveBatch's error for a datagram longer than the room
// it had: events were lost, as with an overflow.
var errTruncated = errors.New("netwatch: rtnetlink datagram longer than the receive buffer")

// recvBuf is what ReceiveBatch's recvmmsg reads into: recvSlots slots of
// batchFree bytes each, mapped rather than allocated, so that only the
// pages the kernel writes ever take memory (a few KiB for ordinary
// events, whatever the size of the slots).
type recvBuf struct {
	mem  []byte
	iov  [recvSlots]unix.Iovec
	hdrs [recvSlots]unix.Mmsghdr
}

func newRecvBuf() (*recvBuf, error) {
	mem, err := unix.Mmap(-1, 0, recvSlots*batchFree, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	rb := &recvBuf{mem: mem}
	for i := range rb.hdrs {
		rb.iov[i].Base = &mem[i*batchFree]
		rb.iov[i].SetLen(batchFree)
		rb.hdrs[i].Hdr.Iov = &rb.iov[i]
		rb.hdrs[i].Hdr.SetIovlen(1)
	}
	return rb, nil
}

// ReceiveBatch reads the queued datagrams with one wake-up of the
// goroutine and one recvmmsg per recvSlots of them: a burst of events
// costs a system call per 32, and a lone event one (and the one that
// found the queue empty), not one more to learn that nothing follows.
func (c *kernelConn) ReceiveBatch(b []byte) ([]byte, error) {
	if c.rb == nil {
		rb, err := newRecvBuf()
		if err != nil {
			return b, err
		}
		c.rb = rb
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return b, err
	}
	rb := c.rb
	var recvErr error
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&rb.hdrs[0])), recvSlots,
				unix.MSG_DONTWAIT|unix.MSG_TRUNC, 0, 0)
			switch {
			case e == unix.EAGAIN:
				return len(b) > 0 // with nothing read yet, wait
			case e == unix.EINTR:
				continue
			case e != 0:
				recvErr = os.NewSyscallError("recvmmsg", e)
				return true
			}
			for i := range int(n) {
				l := int(rb.hdrs[i].Len)
				if l > batchFree {
					recvErr = errTruncated
					return true
				}
				b = append(b, rb.mem[i*batchFree:i*batchFree+l]...)
			}
			if n < recvSlots || len(b) >= batchFree {
				// The queue is empty, or this is enough for one round.
				return true
			}
		}
	})
	if err != nil {
		return b, err
	}
	return b, recvErr
}
