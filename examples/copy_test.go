// Package examples holds the programs that show how to embed netwatch; this
// test checks that each one builds, with its tests, copied out of the
// repository, as someone starting their own tool from it would.
package examples

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCopiedOut copies each example to a directory of its own outside the
// repository, with a go.mod that requires this module by a replace to the
// checkout (and this module's other requirements, at their versions), and
// runs go build and go vet offline (every module comes from the module
// cache this test's own build filled); vet compiles its tests too. An example that imports an internal package of
// this module, or a file of another example, fails here.
func TestCopiedOut(t *testing.T) {
	if testing.Short() {
		t.Skip("builds each example in a module of its own (-short)")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	gosum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	// The copy requires what this module requires, at the same versions,
	// plus this module itself.
	_, requires, ok := strings.Cut(string(gomod), "\n")
	if !ok {
		t.Fatal("go.mod has one line")
	}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		n++
		name := e.Name()
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.CopyFS(dir, os.DirFS(name)); err != nil {
				t.Fatal(err)
			}
			mod := "module example.com/" + name + "\n" + requires +
				"\nrequire github.com/marksplit/marksplit v0.0.0\n\n" +
				"replace github.com/marksplit/marksplit => " + root + "\n"
			if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "go.sum"), gosum, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"build", "./..."}, {"vet", "./..."}} {
				cmd := exec.Command("go", args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("go %s in a copy of examples/%s: %v\n%s", strings.Join(args, " "), name, err, out)
				}
			}
		})
	}
	if n == 0 {
		t.Fatal("no examples found")
	}
}
