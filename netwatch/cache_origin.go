package netwatch

import "strconv"

// OriginKind says who made a change to the cache.
type OriginKind uint8

// Who made a change.
const (
	// OriginUnknown is the zero value: an object read from a dump, which
	// says nothing about who made it.
	OriginUnknown OriginKind = iota
	// OriginKernel: the kernel sent the notification on its own behalf
	// (port 0). It does so for its own changes (an IPv6 route expiring, a
	// duplicate address detected) and for every link change and new IPv6
	// address, even when a program asked for them.
	OriginKernel
	// OriginSelf: a request of this process's own sockets.
	OriginSelf
	// OriginProgram: a request of another program's socket, named by its
	// port and, where /proc shows it, its process.
	OriginProgram
	// OriginResync: a difference a re-dump found: a change the kernel made
	// without telling (the IPv4 routes it flushes when a link goes down or
	// an address goes away), or one whose event was lost to an overflow.
	OriginResync
)

var originNames = [...]string{"unknown", "kernel", "self", "program", "resync"}

// String returns the kind's name as the JSON dump prints it: kernel, self,
// program or resync.
func (k OriginKind) String() string {
	if int(k) < len(originNames) {
		return originNames[k]
	}
	return "unknown(" + strconv.Itoa(int(k)) + ")"
}

// Origin says who made a change: the kind, and for a request of a socket
// (OriginSelf, OriginProgram) its netlink port and, where /proc of this PID
// namespace shows the socket's owner, the owner's process ID and command
// name. On Linux a process's first netlink socket takes the process ID as
// its port.
//
// Finding the process never delays the event: a socket that is its
// process's first, or this process's, is named from its first event; one
// that only a scan of /proc finds is looked up beside the events and named
// from its next ones. An answer is reused for a second and renewed in the
// background meanwhile.
type Origin struct {
	Kind OriginKind
	Port uint32
	PID  int    // 0 when /proc does not show the owner
	Comm string // the owner's command name (/proc/PID/comm)
}

// String names the origin for a log line: "ip[31968]" when the process is
// known, "netlink port 31968" when only the port is, else the kind.
func (o Origin) String() string {
	switch {
	case o.Kind != OriginProgram && o.Kind != OriginSelf:
		return o.Kind.String()
	case o.PID != 0 && o.Comm != "":
		return o.Comm + "[" + strconv.Itoa(o.PID) + "]"
	case o.PID != 0:
		return "pid " + strconv.Itoa(o.PID)
	}
	return "netlink port " + strconv.FormatUint(uint64(o.Port), 10)
}

// ownerFinder finds the process that owns a netlink port of the dialer's
// namespace (see portOwners); an rtnl.Dialer may offer one with a method
// owners() ownerFinder. find must not wait for slow look-ups: a finder
// with a method run(ctx) does those there, and the Watcher runs it while
// it runs.
type ownerFinder interface {
	find(port uint32) (pid int, comm string, ok bool)
}
