//go:build linux

package program

import (
	"fmt"
	"net"
	"os"
	"testing"
)

func TestParseLockName(t *testing.T) {
	for _, tc := range []struct {
		name        string
		table, prio uint64
		hasPrio, ok bool
	}{
		{"@marksplit/agent/table=900/priority=901/00ff", 900, 901, true, true},
		{"@marksplit/table/900", 900, 0, false, true},
		{"@marksplit/agent/table=x/priority=901/00ff", 0, 901, true, false},
		{"@marksplit/other", 0, 0, false, false},
		{"@netwatch/owner/table=900/priority=901/00ff", 900, 901, true, true},
		{"@netwatch/other/table=900/priority=901/00ff", 0, 0, false, false},
	} {
		table, prio, hasPrio, ok := parseLockName(tc.name)
		if table != tc.table || prio != tc.prio || hasPrio != tc.hasPrio || ok != tc.ok {
			t.Errorf("parseLockName(%q) = %d, %d, %v, %v; want %d, %d, %v, %v", tc.name, table, prio, hasPrio, ok, tc.table, tc.prio, tc.hasPrio, tc.ok)
		}
	}
}

// Both ways of listing the lock sockets find one, the kernel's socket
// diagnostics with its owner.
func TestListLockSockets(t *testing.T) {
	name := fmt.Sprintf("@netwatch/owner/table=4000000000/priority=4000000000/test%d", os.Getpid())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	find := func(socks []lockSocket) (lockSocket, bool) {
		for _, s := range socks {
			if s.name == name {
				return s, true
			}
		}
		return lockSocket{}, false
	}
	socks, err := diagLockSockets()
	if err != nil {
		t.Fatalf("NETLINK_SOCK_DIAG: %v", err)
	}
	if s, ok := find(socks); !ok || !s.uidKnown || s.uid != uint32(os.Geteuid()) {
		t.Errorf("NETLINK_SOCK_DIAG: %+v, %v; want %s owned by uid %d", s, ok, name, os.Geteuid())
	}
	socks, err = procLockSockets()
	if err != nil {
		t.Fatalf("/proc/net/unix: %v", err)
	}
	if _, ok := find(socks); !ok {
		t.Errorf("/proc/net/unix: no %s in %+v", name, socks)
	}
}
