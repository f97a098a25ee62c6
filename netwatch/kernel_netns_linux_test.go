//go:build linux

package netwatch

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
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
	if ns.FD() < 0 || ns.Close() != nil || ns.Close() != nil {
		t.Errorf("fd %d, or Close failed", ns.FD())
	}
	f, err := os.CreateTemp(t.TempDir(), "notns")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	for path, want := range map[string]string{
		"/proc/self/ns/mnt": "is a namespace, but not a network namespace",
		f.Name():            "is not a namespace",
		"/nonexistent/ns":   "no such file or directory",
	} {
		if _, err := OpenNetNS(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("OpenNetNS(%s): %v, want an error saying %q", path, err, want)
		}
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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
	fd, _ := rtnl.Target(ns)
	return fd == 0
}
