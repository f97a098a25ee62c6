//go:build linux

package netwatch

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"golang.org/x/sys/unix"
)

// TestOpenNetNS: a network namespace opens; other namespaces, files and
// missing paths fail at once with a clear error.
func TestOpenNetNS(t *testing.T) {
	ns, err := OpenNetNS("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("OpenNetNS(/proc/self/ns/net): %v", err)
	}
	if !isOwn(ns) {
		t.Errorf("the process's own namespace is not recognized as its own: sockets would setns, which needs CAP_SYS_ADMIN")
	}
	if fd := (*rtnl.NetNS)(ns).FD(); fd < 0 || ns.Close() != nil || ns.Close() != nil {
		t.Errorf("fd %d, or Close failed", fd)
	}
	dir := t.TempDir()
	f, err := os.CreateTemp(dir, "notns")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A FIFO with no writer blocks an open for reading forever; so does a
	// symlink to one.
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	fifoLink := filepath.Join(dir, "fifo-link")
	if err := os.Symlink(fifo, fifoLink); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		"/proc/self/ns/mnt": "is a namespace, but not a network namespace",
		f.Name():            "is not a namespace (a regular file)",
		dir:                 "is not a namespace (a directory)",
		fifo:                "is not a namespace (a FIFO)",
		fifoLink:            "is not a namespace (a FIFO)",
		"/nonexistent/ns":   "no such file or directory",
	} {
		done := make(chan error, 1)
		go func() {
			ns, err := OpenNetNS(path)
			if err == nil {
				ns.Close()
			}
			done <- err
		}()
		timer := time.NewTimer(2 * time.Minute)
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("OpenNetNS(%s): %v, want an error saying %q", path, err, want)
			}
		case <-timer.C:
			t.Errorf("OpenNetNS(%s) still blocks after 2 min; want an error saying %q at once", path, want)
			// Unblock the open (a writer ends a FIFO's wait for one).
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				<-done
				w.Close()
			}
		}
		timer.Stop()
	}
}

// TestKernelOpenNetNSOther: another namespace is entered, and a watcher in
// it sees its links, not ours.
func TestKernelOpenNetNSOther(t *testing.T) {
	tns := newTestNS(t)
	tns.ip(t, "link", "add", "only-there", "type", "veth", "peer", "name", "only-there-p")
	ns, err := OpenNetNS("/run/netns/" + tns.name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if isOwn(ns) {
		t.Fatalf("another namespace taken for the process's own")
	}
	w := New(Options{NetNS: ns})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	w.Read(func(v View) {
		if _, ok := v.LinkByName("only-there"); !ok {
			t.Errorf("the watcher does not see the namespace's link")
		}
	})
	cancel()
	<-done
}

// isOwn reports whether ns is taken for the process's own namespace, whose
// sockets need no setns.
func isOwn(ns *NetNS) bool {
	fd, _ := rtnl.Target((*rtnl.NetNS)(ns))
	return fd == 0
}
