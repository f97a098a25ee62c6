package metricsserver

import (
	"net"
	"syscall"

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
