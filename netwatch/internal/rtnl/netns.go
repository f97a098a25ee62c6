package rtnl

import "golang.org/x/sys/unix"

// NetNS is netwatch.NetNS, defined here so that the test kit can make one
// for its fake kernel: where a watcher's and an applier's sockets are
// opened. It is a network namespace's file descriptor, or a Dialer that
// stands in for the kernel.
type NetNS struct {
	fd     int
	own    bool   // the process's own namespace: sockets need no setns
	dialer Dialer // a fake kernel's; fd is -1
}

// OpenedNetNS wraps an open namespace descriptor, which the NetNS owns
// from then on; own says it is the process's own namespace.
func OpenedNetNS(fd int, own bool) *NetNS { return &NetNS{fd: fd, own: own} }

// FakeNetNS returns a NetNS whose sockets d opens.
func FakeNetNS(d Dialer) *NetNS { return &NetNS{fd: -1, dialer: d} }

// Target says where n's sockets go: a Dialer for a fake kernel, else the
// namespace's descriptor, or 0 for the calling thread's (n nil or the
// process's own namespace).
func Target(n *NetNS) (fd int, d Dialer) {
	switch {
	case n == nil || n.own:
		return 0, nil
	case n.dialer != nil:
		return -1, n.dialer
	}
	return n.fd, nil
}

// FD returns the namespace's file descriptor, owned by n; -1 once closed
// and for a fake kernel.
func (n *NetNS) FD() int { return n.fd }

// Close closes the namespace's file descriptor. It is safe to call twice.
func (n *NetNS) Close() error {
	if n.fd < 0 {
		return nil
	}
	err := unix.Close(n.fd)
	n.fd = -1
	return err
}
