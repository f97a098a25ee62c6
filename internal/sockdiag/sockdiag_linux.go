//go:build linux

package sockdiag

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Conn is a NETLINK_SOCK_DIAG socket.
type Conn struct{ c *netlink.Conn }

// Dial opens a socket diagnostics socket in the network namespace whose
// handle is netns, or in the calling thread's when netns is 0.
func Dial(netns int) (*Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: netns})
	if err != nil {
		return nil, fmt.Errorf("sockdiag: dial: %w", err)
	}
	return &Conn{c}, nil
}

// Close closes the socket.
func (c *Conn) Close() error { return c.c.Close() }

// ask sends one SOCK_DIAG_BY_FAMILY request and returns the answers.
func (c *Conn) ask(what string, req []byte, flags netlink.HeaderFlags) ([]netlink.Message, error) {
	msgs, err := c.c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.SOCK_DIAG_BY_FAMILY, Flags: netlink.Request | flags},
		Data:   req,
	})
	if err != nil {
		return nil, fmt.Errorf("sockdiag: %s: %w", what, err)
	}
	return msgs, nil
}

// NetlinkPorts returns the netlink sockets of protocol (unix.NETLINK_ROUTE,
// …) by port, each with its inode; a socket without a port is left out.
func (c *Conn) NetlinkPorts(protocol int) (map[uint32]uint64, error) {
	// struct netlink_diag_req: family, protocol, pad, ino, show, cookie.
	req := make([]byte, 20)
	req[0] = unix.AF_NETLINK
	req[1] = byte(protocol)
	msgs, err := c.ask("list netlink sockets", req, netlink.Dump)
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]uint64, len(msgs))
	for _, m := range msgs {
		// struct netlink_diag_msg: family, type, protocol, state, portid,
		// dst_portid, dst_group, ino, cookie.
		if len(m.Data) < 20 {
			continue
		}
		if port := binary.NativeEndian.Uint32(m.Data[4:8]); port != 0 {
			out[port] = uint64(binary.NativeEndian.Uint32(m.Data[16:20]))
		}
	}
	return out, nil
}

// UnixSocket is a listening unix socket: its abstract name, with a
// leading "@" ("" for a socket bound to a path), and, where the kernel
// says (since Linux 5.3), its owner's uid.
type UnixSocket struct {
	Name     string
	UID      uint32
	UIDKnown bool
}

// unix_diag (linux/unix_diag.h), which x/sys/unix lacks.
const (
	udiagShowName = 0x01
	udiagShowUID  = 0x40
	unixDiagName  = 0
	unixDiagUID   = 7
	tcpListen     = 10
)

// UnixListeners returns the listening unix sockets.
func (c *Conn) UnixListeners() ([]UnixSocket, error) {
	req := make([]byte, 24) // struct unix_diag_req
	req[0] = unix.AF_UNIX
	binary.NativeEndian.PutUint32(req[4:], 1<<tcpListen)
	binary.NativeEndian.PutUint32(req[12:], udiagShowName|udiagShowUID)
	msgs, err := c.ask("list unix sockets", req, netlink.Dump)
	if err != nil {
		return nil, err
	}
	socks := make([]UnixSocket, 0, len(msgs))
	for _, m := range msgs {
		if len(m.Data) < 16 { // struct unix_diag_msg
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[16:])
		if err != nil {
			continue
		}
		var s UnixSocket
		for ad.Next() {
			switch ad.Type() {
			case unixDiagName:
				if b := ad.Bytes(); len(b) > 0 && b[0] == 0 {
					s.Name = "@" + string(b[1:])
				}
			case unixDiagUID:
				s.UID, s.UIDKnown = ad.Uint32(), true
			}
		}
		socks = append(socks, s)
	}
	return socks, nil
}

// TCPOwner returns the uid that owns the local TCP socket whose own end
// is src and whose peer is dst (both of one family).
func (c *Conn) TCPOwner(src, dst *net.TCPAddr) (uint32, error) {
	// struct inet_diag_req_v2: family, protocol, ext, pad, states, then
	// struct inet_diag_sockid: sport, dport, src, dst, if, cookie.
	req := make([]byte, 56)
	req[0], req[1] = unix.AF_INET, unix.IPPROTO_TCP
	s, d := src.IP.To4(), dst.IP.To4()
	if s == nil || d == nil {
		req[0], s, d = unix.AF_INET6, src.IP.To16(), dst.IP.To16()
	}
	binary.NativeEndian.PutUint32(req[4:], 0xffffffff) // every state
	binary.BigEndian.PutUint16(req[8:], uint16(src.Port))
	binary.BigEndian.PutUint16(req[10:], uint16(dst.Port))
	copy(req[12:28], s)
	copy(req[28:44], d)
	binary.NativeEndian.PutUint32(req[48:], 0xffffffff) // INET_DIAG_NOCOOKIE
	binary.NativeEndian.PutUint32(req[52:], 0xffffffff)
	msgs, err := c.ask("find a TCP socket", req, 0)
	if err != nil {
		return 0, err
	}
	// struct inet_diag_msg: idiag_uid at 64.
	if len(msgs) != 1 || len(msgs[0].Data) < 68 {
		return 0, fmt.Errorf("sockdiag: find a TCP socket: %d answers", len(msgs))
	}
	return binary.NativeEndian.Uint32(msgs[0].Data[64:]), nil
}
