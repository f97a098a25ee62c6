//go:build linux

package netwatch

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/marksplit/marksplit/internal/sockdiag"
)

// A notification names the requester only by its socket's netlink port.
// portOwners finds the process behind a port: sock_diag (NETLINK_SOCK_DIAG
// for AF_NETLINK, what ss -f netlink uses) lists the namespace's rtnetlink
// sockets with their inodes, and /proc/PID/fd shows which process holds
// the inode. A process's first netlink socket takes its process ID as its
// port, so that process and this one are looked at first; a full scan of
// /proc is the fallback, at most once a second.
//
// The look-up must not delay the event it names, nor the repair that
// event calls for: a full scan of /proc takes milliseconds on a busy node.
// So a port seen before is answered from the cache at once, and looked up
// again in the background (run) once its answer is ownerTTL old; a new
// port gets the quick look-up in line (a listing and two processes' fds)
// and, when that finds no owner, the full scan in the background, for the
// port's next events. Not finding an owner (the socket's owner runs in
// another PID namespace, as a container's daemon does) is an answer too:
// a busy foreign program costs a look-up a second, not one per event.
type portOwners struct {
	netns int // the sockets' namespace, as kernelDialer.netns
	self  int // this process's ID

	// ask takes the ports to look up in the background; run reads it.
	ask chan uint32

	mu      sync.Mutex
	inodes  map[uint32]uint64 // port → socket inode, from the last listing
	listed  time.Time
	known   map[uint32]portOwner
	missed  map[uint32]time.Time // ports not in a listing, and when
	asked   map[uint32]bool      // ports in ask
	scanned time.Time            // of the last full scan of /proc
}

type portOwner struct {
	inode uint64
	pid   int // 0: not found
	comm  string
	seen  time.Time
}

const (
	ownerTTL     = time.Second
	listInterval = 100 * time.Millisecond
	scanInterval = time.Second
)

func newPortOwners(netns int) *portOwners {
	return &portOwners{netns: netns, self: os.Getpid(), ask: make(chan uint32, 64),
		known: make(map[uint32]portOwner), missed: make(map[uint32]time.Time), asked: make(map[uint32]bool)}
}

// find returns the process that owns port, or false when /proc does not
// show one (the socket is gone, or its owner is in another PID namespace).
// A socket closed since it was last seen keeps its last known owner: the
// notification being read was sent while it was open.
func (p *portOwners) find(port uint32) (pid int, comm string, ok bool) {
	now := time.Now()
	p.mu.Lock()
	o, had := p.known[port]
	p.mu.Unlock()
	if !had {
		o = p.lookup(port, now, false)
	}
	if !had && o.pid == 0 || had && now.Sub(o.seen) >= ownerTTL {
		p.later(port)
	}
	return o.pid, o.comm, o.pid != 0
}

// later asks run to look port up; a port already asked for is not asked
// again, and when run is behind, the port's next event asks again.
func (p *portOwners) later(port uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.asked[port] {
		return
	}
	select {
	case p.ask <- port:
		p.asked[port] = true
	default:
	}
}

// run looks up the ports find asks for until ctx ends, scanning /proc
// when it must.
func (p *portOwners) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case port := <-p.ask:
			p.lookup(port, time.Now(), true)
			p.mu.Lock()
			delete(p.asked, port)
			p.mu.Unlock()
		}
	}
}

// lookup finds the owner of port and remembers it; with scan it may scan
// all of /proc (at most once per scanInterval). The slow parts run
// without p.mu.
func (p *portOwners) lookup(port uint32, now time.Time, scan bool) portOwner {
	p.mu.Lock()
	o, had := p.known[port]
	// List the sockets again when the listing is old, or lacks the port
	// (a new socket) unless that port was just looked for in vain (a
	// closed one).
	relist := now.Sub(p.listed) >= listInterval || p.inodes[port] == 0 && now.Sub(p.missed[port]) >= listInterval
	p.mu.Unlock()
	if relist {
		if inodes, err := listNetlinkSockets(p.netns); err == nil {
			p.mu.Lock()
			p.inodes, p.listed = inodes, now
			p.forget(now)
			p.mu.Unlock()
		}
	}
	p.mu.Lock()
	ino := p.inodes[port]
	if ino == 0 {
		p.missed[port] = now
	}
	p.mu.Unlock()
	switch {
	case ino == 0:
		// Gone: what was known of it stands, for its last events.
		return o
	case had && o.inode == ino && o.pid != 0:
		o.seen = now // the same socket: its owner cannot have changed
	default:
		o = portOwner{inode: ino, pid: p.ownerOf(ino, port, now, scan), seen: now}
		if o.pid != 0 {
			o.comm = readComm(o.pid)
		}
	}
	p.mu.Lock()
	p.known[port] = o
	p.mu.Unlock()
	return o
}

// forget drops what is a minute old; called with p.mu held.
func (p *portOwners) forget(now time.Time) {
	for k, v := range p.known {
		if now.Sub(v.seen) > time.Minute {
			delete(p.known, k)
		}
	}
	for k, t := range p.missed {
		if now.Sub(t) > time.Minute {
			delete(p.missed, k)
		}
	}
}

// ownerOf returns the process holding socket inode ino, or 0. Only with
// scan, and at most once per scanInterval, does it look beyond this
// process and the one whose ID is the port.
func (p *portOwners) ownerOf(ino uint64, port uint32, now time.Time, scan bool) int {
	for _, pid := range []int{p.self, int(port)} {
		if pid > 0 && holds(pid, ino) {
			return pid
		}
	}
	if !scan || now.Sub(p.scanned) < scanInterval {
		return 0
	}
	p.scanned = now
	d, err := os.Open("/proc")
	if err != nil {
		return 0
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err == nil && pid != p.self && pid != int(port) && holds(pid, ino) {
			return pid
		}
	}
	return 0
}

// holds reports whether process pid has socket inode ino open.
func holds(pid int, ino uint64) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	d, err := os.Open(dir)
	if err != nil {
		return false
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	want := "socket:[" + strconv.FormatUint(ino, 10) + "]"
	for _, n := range names {
		if l, err := os.Readlink(dir + "/" + n); err == nil && l == want {
			return true
		}
	}
	return false
}

func readComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// listNetlinkSockets returns the NETLINK_ROUTE sockets of the namespace
// netns (0: the calling thread's) by port, with their inodes.
func listNetlinkSockets(netns int) (map[uint32]uint64, error) {
	c, err := sockdiag.Dial(netns)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.NetlinkPorts(unix.NETLINK_ROUTE)
}
