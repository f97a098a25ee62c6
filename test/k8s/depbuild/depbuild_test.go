package depbuild

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRequiredVersion(t *testing.T) {
	gomod := []byte("module x\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 v3.7.3\n\nrequire (\n\tk8s.io/kubernetes v1.37.2\n\tk8s.io/api v0.37.2 // indirect\n)\n")
	for module, want := range map[string]string{
		"go.etcd.io/etcd/server/v3": "v3.7.3",
		"k8s.io/kubernetes":         "v1.37.2",
		"k8s.io/api":                "v0.37.2",
	} {
		got, err := requiredVersion(gomod, module)
		if err != nil || got != want {
			t.Errorf("requiredVersion(%s) = %q, %v; want %q", module, got, err, want)
		}
	}
	if _, err := requiredVersion(gomod, "k8s.io"); err == nil {
		t.Error("requiredVersion of a module go.mod does not require: no error")
	}
}

// TestPrograms checks that the shipped modules pin what their cache names
// say, and that each file of a module is part of its key.
func TestPrograms(t *testing.T) {
	t.Setenv("MARKSPLIT_CACHE", t.TempDir())
	for _, p := range Programs("..") {
		path, version, err := p.Path()
		if err != nil {
			t.Fatal(err)
		}
		if want := p.Name + "-" + version + "-"; !strings.HasPrefix(filepath.Base(path), want) {
			t.Errorf("%s: cached as %s, want a name starting %s", p.Name, path, want)
		}
		// A copy with one byte more in any file is cached elsewhere.
		for _, name := range []string{"go.mod", "go.sum", "main.go"} {
			dir := t.TempDir()
			for _, n := range []string{"go.mod", "go.sum", "main.go"} {
				b, err := os.ReadFile(filepath.Join(p.Dir, n))
				if err != nil {
					t.Fatal(err)
				}
				if n == name {
					b = append(b, '\n')
				}
				if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			q := p
			q.Dir = dir
			other, _, err := q.Path()
			if err != nil {
				t.Fatal(err)
			}
			if other == path {
				t.Errorf("%s: a change to %s keeps the cache name %s", p.Name, name, path)
			}
		}
	}
}
