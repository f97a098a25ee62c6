//go:build linux

package pathprobe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Serve listens on UDP port Port (both families where IPv6 is enabled), in
// the network namespace of the calling thread, and answers probes until
// ctx ends; then it returns nil.
func (r *Responder) Serve(ctx context.Context) error {
	r.init()
	c, err := net.ListenUDP("udp", &net.UDPAddr{Port: int(r.Port)})
	if err != nil {
		return fmt.Errorf("pathprobe: responder: %w", err)
	}
	return r.ServeConn(ctx, c)
}

// ServeConn answers probes that arrive on c until ctx ends (then it closes
// c and returns nil) or c fails. c is a UDP socket the caller opened (in
// another network namespace, say).
func (r *Responder) ServeConn(ctx context.Context, c *net.UDPConn) error {
	r.init()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("pathprobe: responder: %w", err)
	}
	// Answer from the address a probe was sent to, whatever the route back
	// chooses (IP_PKTINFO): the prober matches answers by that address.
	if err := rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
	}); err != nil {
		return fmt.Errorf("pathprobe: responder: %w", err)
	}
	var (
		buf  [64]byte
		oob  [128]byte
		out  [headerLen]byte
		n    int
		oobn int
		from unix.Sockaddr
		rerr error
	)
	recv := func(fd uintptr) bool {
		// MSG_TRUNC: n is the datagram's size, however little of it fits.
		n, oobn, _, from, rerr = unix.Recvmsg(int(fd), buf[:], oob[:], unix.MSG_TRUNC)
		return rerr != unix.EAGAIN
	}
	for {
		err := rc.Read(recv)
		if err == nil {
			err = rerr
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("pathprobe: responder: %w", err)
			}
			continue // a queued ICMP error, ENOMEM: the next datagram
		}
		src, port := sockaddrAddr(from)
		if !src.IsValid() {
			continue
		}
		if !r.answer(time.Now(), src, buf[:min(n, len(buf))], n, &out) {
			continue
		}
		if _, _, err := c.WriteMsgUDPAddrPort(out[:], replyInfo(oob[:oobn]), netip.AddrPortFrom(src, port)); err != nil {
			r.sendErrors.Add(1)
		}
	}
}

// sockaddrAddr returns sa's address (unmapped) and port.
func sockaddrAddr(sa unix.Sockaddr) (netip.Addr, uint16) {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(sa.Addr), uint16(sa.Port)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port)
	}
	return netip.Addr{}, 0
}

// replyInfo is the control message that sends an answer from the address
// the probe was sent to, from the probe's control messages (nil: none).
func replyInfo(oob []byte) []byte {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			var info unix.Inet4Pktinfo
			copy(info.Spec_dst[:], m.Data[8:12]) // ipi_addr: the header's destination
			return unix.PktInfo4(&info)
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			var info unix.Inet6Pktinfo
			copy(info.Addr[:], m.Data[:16])
			return unix.PktInfo6(&info)
		}
	}
	return nil
}
