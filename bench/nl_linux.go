//go:build linux

package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// nlSock is a NETLINK_ROUTE socket driven with plain syscalls: the loader,
// the churn writers and the floor (a dump or a subscription that decodes
// nothing but message headers) use it.
type nlSock struct {
	fd  int
	seq uint32
	buf []byte
}

// dialNL opens a NETLINK_ROUTE socket in the calling thread's namespace
// and joins groups (RTNLGRP_* numbers).
func dialNL(groups ...uint32) (*nlSock, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	for _, g := range groups {
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, int(g)); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("join group %d: %w", g, err)
		}
	}
	return &nlSock{fd: fd, seq: uint32(time.Now().UnixNano()), buf: make([]byte, 64<<10)}, nil
}

// dialNL opens a socket in the namespace.
func (ns *netNS) dialNL(groups ...uint32) (*nlSock, error) {
	var s *nlSock
	err := ns.Do(func() (err error) {
		s, err = dialNL(groups...)
		return err
	})
	return s, err
}

func (s *nlSock) Close() error { return unix.Close(s.fd) }

// setRcvBuf sets the receive buffer, forcing past net.core.rmem_max as
// root; the kernel doubles the value for its bookkeeping.
func (s *nlSock) setRcvBuf(n int) error {
	if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n); err == nil {
		return nil
	}
	return unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, n)
}

// rcvBuf returns the receive buffer the kernel grants.
func (s *nlSock) rcvBuf() int {
	n, _ := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	return n
}

// setRecvTimeout makes recv return EAGAIN after d without data.
func (s *nlSock) setRecvTimeout(d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	return unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
}

func (s *nlSock) nextSeq() uint32 {
	s.seq++
	return s.seq
}

// nlAttr appends a netlink attribute.
func nlAttr(b []byte, typ uint16, data []byte) []byte {
	l := unix.SizeofRtAttr + len(data)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// beginMsg appends a netlink header whose length endMsg fills in.
func beginMsg(b []byte, typ, flags uint16, seq uint32) (_ []byte, start int) {
	start = len(b)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return b, start
}

func endMsg(b []byte, start int) []byte {
	binary.NativeEndian.PutUint32(b[start:], uint32(len(b)-start))
	return b
}

// routeSpec is an IPv4 unicast route in the main table via a gateway.
type routeSpec struct {
	gw    netip.Addr
	oif   uint32
	proto uint8
}

// appendRoute appends an RTM_NEWROUTE or RTM_DELROUTE for dst.
func appendRoute(b []byte, typ, flags uint16, seq uint32, dst netip.Prefix, r routeSpec) []byte {
	b, start := beginMsg(b, typ, flags, seq)
	scope := uint8(unix.RT_SCOPE_UNIVERSE)
	if typ == unix.RTM_DELROUTE {
		scope = unix.RT_SCOPE_NOWHERE // the wildcard
	}
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope,
	// type, flags.
	b = append(b, unix.AF_INET, uint8(dst.Bits()), 0, 0, unix.RT_TABLE_MAIN, r.proto, scope, unix.RTN_UNICAST)
	b = binary.NativeEndian.AppendUint32(b, 0)
	a4 := dst.Addr().As4()
	b = nlAttr(b, unix.RTA_DST, a4[:])
	if typ == unix.RTM_NEWROUTE {
		g4 := r.gw.As4()
		b = nlAttr(b, unix.RTA_GATEWAY, g4[:])
		b = nlAttr(b, unix.RTA_OIF, u32(r.oif))
	}
	return endMsg(b, start)
}

// routeBatch sends one RTM_NEWROUTE (or RTM_DELROUTE) per prefix in a
// single sendmsg and waits for the acknowledgement of the last one: only
// the last asks for an ACK, and a failing message is always answered with
// its error, so one reply per batch is the rule.
func (s *nlSock) routeBatch(typ uint16, dsts []netip.Prefix, r routeSpec) error {
	b := s.buf[:0]
	flags := uint16(unix.NLM_F_REQUEST)
	if typ == unix.RTM_NEWROUTE {
		flags |= unix.NLM_F_CREATE | unix.NLM_F_EXCL
	}
	var last uint32
	for i, d := range dsts {
		f := flags
		if i == len(dsts)-1 {
			f |= unix.NLM_F_ACK
		}
		last = s.nextSeq()
		b = appendRoute(b, typ, f, last, d, r)
	}
	s.buf = b[:0]
	if _, err := unix.Write(s.fd, b); err != nil {
		return fmt.Errorf("netlink send: %w", err)
	}
	return s.waitAck(last)
}

// waitAck reads replies until the acknowledgement of seq; it returns the
// first error any message of the batch got.
func (s *nlSock) waitAck(seq uint32) error {
	var first error
	rb := make([]byte, 64<<10)
	for {
		n, err := unix.Read(s.fd, rb)
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		for m := rb[:n]; len(m) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(m))
			if l < unix.NLMSG_HDRLEN || l > len(m) {
				return errors.New("netlink: malformed reply")
			}
			typ := binary.NativeEndian.Uint16(m[4:])
			mseq := binary.NativeEndian.Uint32(m[8:])
			if typ == unix.NLMSG_ERROR && l >= unix.NLMSG_HDRLEN+4 {
				if e := int32(binary.NativeEndian.Uint32(m[16:])); e != 0 && first == nil {
					first = fmt.Errorf("netlink: message %d: %w", mseq, unix.Errno(-e))
				}
				if mseq == seq {
					return first
				}
			}
			m = m[align4(l):]
		}
	}
}

func align4(n int) int { return (n + 3) &^ 3 }

// routeKey identifies an IPv4 route for comparing a consumer's copy with
// the kernel's.
type routeKey struct {
	Table    uint32
	Dst      netip.Prefix
	TOS      uint8
	Priority uint32
}

// parseRoute reads the key of an IPv4 route message (the rtmsg and its
// attributes); ok is false for other families.
func parseRoute(data []byte) (k routeKey, ok bool) {
	if len(data) < unix.SizeofRtMsg || data[0] != unix.AF_INET {
		return k, false
	}
	k.Table = uint32(data[4])
	k.TOS = data[3]
	bits := int(data[1])
	var dst [4]byte
	for a := data[unix.SizeofRtMsg:]; len(a) >= 4; {
		l := int(binary.NativeEndian.Uint16(a))
		typ := binary.NativeEndian.Uint16(a[2:])
		if l < 4 || l > len(a) {
			break
		}
		v := a[4:l]
		switch {
		case typ == unix.RTA_DST && len(v) == 4:
			copy(dst[:], v)
		case typ == unix.RTA_TABLE && len(v) == 4:
			k.Table = binary.NativeEndian.Uint32(v)
		case typ == unix.RTA_PRIORITY && len(v) == 4:
			k.Priority = binary.NativeEndian.Uint32(v)
		}
		a = a[min(align4(l), len(a)):]
	}
	k.Dst = netip.PrefixFrom(netip.AddrFrom4(dst), bits).Masked()
	return k, true
}

// dump requests a route dump of family and calls fn with each
// RTM_NEWROUTE's payload, decoding nothing else. It returns the number of
// routes.
func (s *nlSock) dump(family uint8, fn func(data []byte)) (int, error) {
	b, start := beginMsg(s.buf[:0], unix.RTM_GETROUTE, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, s.nextSeq())
	b = append(b, family)
	b = append(b, make([]byte, unix.SizeofRtMsg-1)...)
	b = endMsg(b, start)
	if _, err := unix.Write(s.fd, b); err != nil {
		return 0, fmt.Errorf("netlink send: %w", err)
	}
	count := 0
	for {
		n, err := unix.Read(s.fd, s.buf[:cap(s.buf)])
		if err != nil {
			return count, fmt.Errorf("netlink dump: %w", err)
		}
		for m := s.buf[:n]; len(m) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(m))
			if l < unix.NLMSG_HDRLEN || l > len(m) {
				return count, errors.New("netlink: malformed dump")
			}
			switch binary.NativeEndian.Uint16(m[4:]) {
			case unix.NLMSG_DONE:
				return count, nil
			case unix.NLMSG_ERROR:
				if e := int32(binary.NativeEndian.Uint32(m[16:])); e != 0 {
					return count, fmt.Errorf("netlink dump: %w", unix.Errno(-e))
				}
			case unix.RTM_NEWROUTE:
				count++
				if fn != nil {
					fn(m[unix.NLMSG_HDRLEN:l])
				}
			}
			m = m[align4(l):]
		}
	}
}

// kernelRoutes4 returns the keys of every IPv4 route, by a dump.
func (s *nlSock) kernelRoutes4() (map[routeKey]struct{}, error) {
	set := make(map[routeKey]struct{})
	_, err := s.dump(unix.AF_INET, func(data []byte) {
		if k, ok := parseRoute(data); ok {
			set[k] = struct{}{}
		}
	})
	return set, err
}

// bulkPrefix is the i-th /24 of the loaded table: 11.0.0.0/24 upwards,
// 2^20 of them before 27.0.0.0.
func bulkPrefix(i int) netip.Prefix {
	v := uint32(11)<<24 + uint32(i)<<8
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), 0}), 24)
}

// churnPrefix is writer w's i-th /24: 27.0.0.0/24 upwards for writer 0,
// 28.0.0.0/24 for writer 1, and so on; 65536 per writer.
func churnPrefix(w, i int) netip.Prefix {
	v := uint32(27+w)<<24 + uint32(i)<<8
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), 0}), 24)
}

// symDiff is the number of keys in exactly one of a and b.
func symDiff(a, b map[routeKey]struct{}) int {
	n := 0
	for k := range a {
		if _, ok := b[k]; !ok {
			n++
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			n++
		}
	}
	return n
}
