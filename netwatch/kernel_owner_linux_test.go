//go:build linux

package netwatch

import (
	"testing"
	"time"
)

// TestPortOwnersRemembersNotFound: a socket whose owner /proc does not show
// (a program in another PID namespace) is looked for once per ownerTTL,
// not once per event: each look-up reads /proc/PID/fd of two processes,
// and may scan all of /proc.
func TestPortOwnersRemembersNotFound(t *testing.T) {
	p := newPortOwners(0)
	const port, ino = 4242, 1 << 40 // an inode no process holds
	p.inodes = map[uint32]uint64{port: ino}
	p.listed = time.Now()
	if _, _, ok := p.find(port); ok {
		t.Fatalf("an owner found for a socket nobody holds")
	}
	if o, ok := p.known[port]; !ok || o.pid != 0 || o.inode != ino {
		t.Fatalf("the finding is not remembered: %+v, %v", o, ok)
	}
	p.scan = time.Time{} // a look-up now would scan /proc, and say so here
	for range 100 {
		if _, _, ok := p.find(port); ok {
			t.Fatalf("an owner found for a socket nobody holds")
		}
	}
	if !p.scan.IsZero() {
		t.Errorf("the owner was looked for again within ownerTTL")
	}
}
