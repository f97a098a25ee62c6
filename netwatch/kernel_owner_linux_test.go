//go:build linux

package netwatch

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitLookedUp waits until the background look-up of port is done.
func waitLookedUp(t *testing.T, p *portOwners, port uint32) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		p.mu.Lock()
		asked := p.asked[port]
		p.mu.Unlock()
		if !asked {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %d: the background look-up did not end", port)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPortOwnersRemembersNotFound: a socket whose owner /proc does not show
// (a program in another PID namespace) is looked for once per ownerTTL,
// not once per event, and never by find itself: a full scan of /proc takes
// milliseconds, and the event waits for find.
func TestPortOwnersRemembersNotFound(t *testing.T) {
	p := newPortOwners(0)
	const port, ino = 4242, 1 << 40 // an inode no process holds
	before := time.Now()
	p.inodes = map[uint32]uint64{port: ino}
	p.listed = before
	if _, _, ok := p.find(port); ok {
		t.Fatalf("an owner found for a socket nobody holds")
	}
	if !p.scanned.IsZero() {
		t.Fatalf("find scanned /proc itself")
	}
	if len(p.ask) != 1 {
		t.Fatalf("the port was not asked for in the background (%d asked)", len(p.ask))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()
	defer func() { cancel(); <-done }()
	waitLookedUp(t, p, port)
	if o := p.known[port]; o.pid != 0 || o.inode != ino || !o.seen.After(before) {
		t.Fatalf("the finding is not remembered: %+v", o)
	}
	scanned := p.scanned
	if scanned.IsZero() {
		t.Fatalf("the background look-up did not scan /proc")
	}
	for range 100 {
		if _, _, ok := p.find(port); ok {
			t.Fatalf("an owner found for a socket nobody holds")
		}
	}
	if len(p.ask) != 0 || p.scanned != scanned {
		t.Errorf("the owner was looked for again within ownerTTL")
	}
}

// TestPortOwnersStale: an answer older than ownerTTL is given at once and
// renewed in the background.
func TestPortOwnersStale(t *testing.T) {
	p := newPortOwners(0)
	const port = 4243
	p.known[port] = portOwner{inode: 1 << 40, pid: 7, comm: "old", seen: time.Now().Add(-2 * ownerTTL)}
	p.listed = time.Now()
	if pid, comm, ok := p.find(port); !ok || pid != 7 || comm != "old" {
		t.Fatalf("find = %d %q %v, want the stale answer", pid, comm, ok)
	}
	if !p.listed.Before(time.Now()) || len(p.ask) != 1 {
		t.Fatalf("a stale answer was not renewed in the background (%d asked)", len(p.ask))
	}
	p.find(port)
	if len(p.ask) != 1 {
		t.Errorf("a port already asked for was asked again (%d asked)", len(p.ask))
	}
}

// TestPortOwnersBackgroundScan: the owner of a socket that is neither this
// process's nor its port's process (a program's second socket) is found by
// the background scan of /proc, for the socket's next events.
func TestPortOwnersBackgroundScan(t *testing.T) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "netlink")
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*unix.SockaddrNetlink).Pid
	cmd := exec.Command("sleep", "30")
	cmd.ExtraFiles = []*os.File{f} // the child holds the socket ...
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	f.Close() // ... and this process no longer does
	if int(port) == cmd.Process.Pid {
		t.Fatalf("the socket's port is the child's PID")
	}

	p := newPortOwners(0)
	if _, _, ok := p.find(port); ok {
		t.Fatalf("find found the owner in line, which needs a scan of /proc")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()
	defer func() { cancel(); <-done }()
	waitLookedUp(t, p, port)
	pid, comm, ok := p.find(port)
	if !ok || pid != cmd.Process.Pid || comm != "sleep" {
		t.Errorf("after the background scan: %d %q %v, want %d sleep", pid, comm, ok, cmd.Process.Pid)
	}
}
