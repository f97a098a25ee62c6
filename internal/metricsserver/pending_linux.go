package metricsserver

import (
	"encoding/binary"
	"net"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// waiting reports whether c has bytes the server has not read yet: a
// request sent, not idle.
func waiting(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n > 0
}

// owners finds the user of a local client's socket (NETLINK_SOCK_DIAG, which
// needs no privilege), so that the connections of one local user are told
// from another's: on loopback every client has the same address. It is used
// from Accept's goroutine alone.
type owners struct {
	c      *netlink.Conn
	failed bool // no socket diagnostics here: do not try again
}

// uid returns the owner of the socket at the other end of a loopback TCP
// connection from remote to local.
func (o *owners) uid(local, remote net.Addr) (uint32, bool) {
	la, ok1 := local.(*net.TCPAddr)
	ra, ok2 := remote.(*net.TCPAddr)
	if !ok1 || !ok2 || !ra.IP.IsLoopback() || o.failed {
		return 0, false
	}
	if o.c == nil {
		c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, nil)
		if err != nil {
			o.failed = true
			return 0, false
		}
		o.c = c
	}
	// struct inet_diag_req_v2 for the client's socket: its local end (src)
	// is our remote, its remote end (dst) our local; no cookie.
	req := make([]byte, 56)
	req[0], req[1] = unix.AF_INET, unix.IPPROTO_TCP
	src, dst := ra.IP.To4(), la.IP.To4()
	if src == nil || dst == nil {
		req[0], src, dst = unix.AF_INET6, ra.IP.To16(), la.IP.To16()
	}
	binary.NativeEndian.PutUint32(req[4:], 0xffffffff) // every state
	binary.BigEndian.PutUint16(req[8:], uint16(ra.Port))
	binary.BigEndian.PutUint16(req[10:], uint16(la.Port))
	copy(req[12:28], src)
	copy(req[28:44], dst)
	binary.NativeEndian.PutUint32(req[48:], 0xffffffff) // INET_DIAG_NOCOOKIE
	binary.NativeEndian.PutUint32(req[52:], 0xffffffff)
	msgs, err := o.c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.SOCK_DIAG_BY_FAMILY, Flags: netlink.Request},
		Data:   req,
	})
	// struct inet_diag_msg: idiag_uid at 64.
	if err != nil || len(msgs) != 1 || len(msgs[0].Data) < 68 {
		return 0, false
	}
	return binary.NativeEndian.Uint32(msgs[0].Data[64:]), true
}

func (o *owners) close() {
	if o.c != nil {
		o.c.Close()
		o.c, o.failed = nil, true
	}
}
