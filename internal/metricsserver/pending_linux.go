package metricsserver

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/sockdiag"
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
	c      *sockdiag.Conn
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
		c, err := sockdiag.Dial(0)
		if err != nil {
			o.failed = true
			return 0, false
		}
		o.c = c
	}
	// The client's socket: its own end is our remote, its peer our local.
	uid, err := o.c.TCPOwner(ra, la)
	return uid, err == nil
}

func (o *owners) close() {
	if o.c != nil {
		o.c.Close()
		o.c, o.failed = nil, true
	}
}
