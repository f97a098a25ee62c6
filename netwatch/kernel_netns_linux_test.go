//go:build linux

package netwatch

import (
	"os"
	"strings"
	"testing"
)

// TestOpenNetNS: a network namespace opens; other namespaces, files and
// missing paths fail at once with a clear error.
func TestOpenNetNS(t *testing.T) {
	ns, err := OpenNetNS("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("OpenNetNS(/proc/self/ns/net): %v", err)
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
