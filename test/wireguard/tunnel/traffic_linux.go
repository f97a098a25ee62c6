package tunnel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// IPv4 and UDP headers: a datagram of payload n is an IP packet of n+28.
const udpOverhead = 20 + 8

// FullSizeResult is what FullSize measured.
type FullSizeResult struct {
	Size     int           // IP packet size sent into the tunnel
	Sent     int           // datagrams sent
	Answered int           // datagrams echoed back in time
	Frag     Frag          // the sending namespace's counters: after − before
	Elapsed  time.Duration // the whole exchange
}

// Lost is how many datagrams got no answer.
func (r FullSizeResult) Lost() int { return r.Sent - r.Answered }

func (r FullSizeResult) String() string {
	return fmt.Sprintf("%d packets of %d bytes: %d answered, %d lost; FragOKs +%d, FragCreates +%d",
		r.Sent, r.Size, r.Answered, r.Lost(), r.Frag.OKs, r.Frag.Creates)
}

// FullSize sends count UDP datagrams that make IP packets of size bytes
// from the namespace from to dst, which an echo server FullSize runs in
// the namespace to answers, one at a time, each waiting up to echoWait for
// its echo; it stops early after giveUp missed in a row. It reads from's
// fragmentation counters before and after: with dst a tunnel address and
// size the tunnel's MTU, the packets fill the tunnel exactly and what
// fragments is the tunnel's own, encrypted, packets on the underlay.
func FullSize(ctx context.Context, from, to string, dst netip.AddrPort, size, count int) (FullSizeResult, error) {
	res := FullSizeResult{Size: size}
	if size < udpOverhead+4 {
		return res, fmt.Errorf("tunnel: full-size: %d bytes is too small", size)
	}
	var srv *net.UDPConn
	err := In(to, func() error {
		var err error
		srv, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return res, fmt.Errorf("tunnel: echo server in %s: %w", to, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer srv.Close()
	wg.Go(func() { echo(srv) })

	var c *net.UDPConn
	if err := In(from, func() error {
		var err error
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
		return err
	}); err != nil {
		return res, fmt.Errorf("tunnel: dial %s from %s: %w", dst, from, err)
	}
	defer c.Close()

	before, err := ReadFrag(from)
	if err != nil {
		return res, err
	}
	start := time.Now()
	out := make([]byte, size-udpOverhead)
	in := make([]byte, len(out)+1)
	silent := 0 // echoes missed in a row
	for seq := range count {
		if ctx.Err() != nil {
			break
		}
		binary.BigEndian.PutUint32(out, uint32(seq))
		if _, err := c.Write(out); err != nil {
			return res, fmt.Errorf("tunnel: send %d bytes to %s: %w", size, dst, err)
		}
		res.Sent++
		if answered(c, in, uint32(seq), len(out)) {
			res.Answered++
			silent = 0
		} else if silent++; silent == giveUp {
			break
		}
	}
	res.Elapsed = time.Since(start)
	after, err := ReadFrag(from)
	if err != nil {
		return res, err
	}
	res.Frag = after.Sub(before)
	return res, nil
}

// giveUp is how many echoes missed in a row end FullSize early: the tunnel
// is down, and the rest would only take echoWait each to say so.
const giveUp = 10

// echoWait is how long FullSize waits for each echo: round trips between
// two namespaces take well under a millisecond, a handshake a few.
const echoWait = 500 * time.Millisecond

// answered reports whether the echo of datagram seq came back whole
// within echoWait, skipping late echoes of earlier ones.
func answered(c *net.UDPConn, buf []byte, seq uint32, size int) bool {
	c.SetReadDeadline(time.Now().Add(echoWait))
	for {
		n, err := c.Read(buf)
		if err != nil {
			// A timeout, or an ICMP error the socket reports: lost.
			return false
		}
		if n == size && binary.BigEndian.Uint32(buf) == seq {
			return true
		}
	}
}

// echo sends every datagram back to where it came from until c is closed.
func echo(c *net.UDPConn) {
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		c.WriteToUDPAddrPort(buf[:n], from)
	}
}

// BulkResult is what Bulk measured.
type BulkResult struct {
	Want     int64         // bytes to send
	Received int64         // bytes that arrived
	MSS      int           // the sender's maximum segment size (TCP_MAXSEG) once connected
	Elapsed  time.Duration // until the last byte arrived, or the time limit
}

// Complete reports whether every byte arrived.
func (r BulkResult) Complete() bool { return r.Received == r.Want }

// MBps is the throughput in MB (10⁶ bytes) per second.
func (r BulkResult) MBps() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Received) / 1e6 / r.Elapsed.Seconds()
}

func (r BulkResult) String() string {
	if r.Complete() {
		return fmt.Sprintf("%.1f MB in %.2f s: %.1f MB/s", float64(r.Want)/1e6, r.Elapsed.Seconds(), r.MBps())
	}
	return fmt.Sprintf("%.2f of %.1f MB arrived in %.1f s: %.2f MB/s",
		float64(r.Received)/1e6, float64(r.Want)/1e6, r.Elapsed.Seconds(), r.MBps())
}

// maxSeg returns c's TCP_MAXSEG, or 0 when it cannot be read.
func maxSeg(c *net.TCPConn) int {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	mss := 0
	rc.Control(func(fd uintptr) {
		mss, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	})
	return mss
}

// Bulk sends want bytes over one TCP connection from the namespace from to
// dst, where a receiver in the namespace to counts them, and stops at
// limit whether or not they all arrived. The connection is reset at the
// end, so nothing of it is left retransmitting.
func Bulk(ctx context.Context, from, to string, dst netip.AddrPort, want int64, limit time.Duration) (BulkResult, error) {
	res := BulkResult{Want: want}
	var ln *net.TCPListener
	if err := In(to, func() error {
		var err error
		ln, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(dst))
		return err
	}); err != nil {
		return res, fmt.Errorf("tunnel: bulk receiver in %s: %w", to, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()

	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	deadline, _ := ctx.Deadline()

	var got atomic.Int64
	var last atomic.Int64 // UnixNano of the last byte
	all := make(chan struct{})
	var rconn atomic.Pointer[net.TCPConn]
	wg.Go(func() {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		rconn.Store(c)
		c.SetReadDeadline(deadline) // ends the receiver even if it was not yet stored when the sender closed
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 && got.Add(int64(n)) == want {
				last.Store(time.Now().UnixNano())
				close(all)
			}
			if err != nil {
				return
			}
		}
	})

	var c *net.TCPConn
	if err := In(from, func() error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp4", dst.String())
		if err == nil {
			c = conn.(*net.TCPConn)
		}
		return err
	}); err != nil {
		return res, fmt.Errorf("tunnel: dial %s from %s: %w", dst, from, err)
	}
	res.MSS = maxSeg(c)
	start := time.Now()
	c.SetWriteDeadline(deadline)
	buf := make([]byte, 64<<10)
	for sent := int64(0); sent < want; {
		n := min(int64(len(buf)), want-sent)
		if _, err := c.Write(buf[:n]); err != nil {
			break // the time limit
		}
		sent += n
	}
	select {
	case <-all:
		res.Elapsed = time.Unix(0, last.Load()).Sub(start)
	case <-ctx.Done():
		res.Elapsed = time.Since(start)
	}
	res.Received = got.Load()
	c.SetLinger(0)
	c.Close()
	if r := rconn.Load(); r != nil {
		r.SetLinger(0)
		r.Close()
	}
	ln.Close()
	if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return res, err
	}
	return res, nil
}
