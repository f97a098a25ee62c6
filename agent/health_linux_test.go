//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// listenHealth refuses a place another user could have prepared: a
// directory of another owner, a link in place of the directory, and
// anything but a socket at the path.
func TestListenHealthRefuses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give a directory to another user")
	}
	base := t.TempDir()
	theirs := filepath.Join(base, "theirs")
	must(t, os.Mkdir(theirs, 0o755))
	must(t, os.Chown(theirs, 65534, 65534))
	link := filepath.Join(base, "link")
	must(t, os.Symlink(theirs, link))
	file := filepath.Join(base, "file")
	must(t, os.Mkdir(file, 0o700))
	must(t, os.WriteFile(filepath.Join(file, "health.sock"), nil, 0o600))
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(theirs, "health.sock"), "is not the agent's own (uid 65534)"},
		{filepath.Join(link, "health.sock"), "is not a directory"},
		{filepath.Join(file, "health.sock"), "not a socket"},
	} {
		ln, err := listenHealth(tc.path)
		if err == nil {
			ln.Close()
			t.Errorf("listenHealth(%s): no error, want %q", tc.path, tc.want)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("listenHealth(%s): %v, want %q", tc.path, err, tc.want)
		}
	}
	// Its own directory, made 0700, and a socket of 0600.
	p := filepath.Join(base, "run", "health.sock")
	ln, err := listenHealth(p)
	must(t, err)
	defer ln.Close()
	for path, want := range map[string]os.FileMode{filepath.Dir(p): 0o700, p: 0o600} {
		fi, err := os.Stat(path)
		must(t, err)
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
}
