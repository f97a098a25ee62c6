// Package depbuild builds the programs the Kubernetes tests run — etcd and
// kube-apiserver, each from a throwaway module of its own beside this one —
// once, into a cache keyed by their pinned version.
//
// A program's module directory (../etcd, ../kube-apiserver) holds a main.go
// and a go.mod/go.sum that pin the upstream module. Its binary is cached as
// NAME-VERSION-HASH in ${MARKSPLIT_CACHE:-/var/cache/marksplit}, where
// VERSION is the pinned upstream version and HASH covers go.mod, go.sum and
// main.go, so a change to any of them builds anew and an unchanged one never
// does. A build writes beside the final name and renames, so a killed build
// never leaves a partial binary where the next run would take it.
//
// Both the tests (TestMain) and `make test` (through ../cmd/k8sdeps, before
// the tests start, so that a first build shows its progress) call Build.
package depbuild

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Program is one upstream program built from a module of its own.
type Program struct {
	Name     string        // binary name: "etcd", "kube-apiserver"
	Dir      string        // the module directory (main.go, go.mod, go.sum)
	Upstream string        // the module path whose required version names the cache entry
	Expect   time.Duration // a first build's rough duration on a new 2-core machine, for the progress line
	// LDFlags, when set, gives the -ldflags of the build for the pinned
	// version (part of the cache key).
	LDFlags func(version string) string
}

// kubeVersionFlags stamp kube-apiserver with its release, as Kubernetes'
// own build does: without them it reports v0.0.0-master, and clients that
// check the server's version (helm's kubeVersion) refuse it.
func kubeVersionFlags(v string) string {
	major, rest, _ := strings.Cut(strings.TrimPrefix(v, "v"), ".")
	minor, _, _ := strings.Cut(rest, ".")
	const pkg = "k8s.io/component-base/version."
	return fmt.Sprintf("-X %sgitVersion=%s -X %sgitMajor=%s -X %sgitMinor=%s -X %sgitTreeState=clean", pkg, v, pkg, major, pkg, minor, pkg)
}

// Programs returns the programs the tests need, with their module
// directories under k8sDir (the test/k8s directory).
func Programs(k8sDir string) []Program {
	return []Program{
		{Name: "etcd", Dir: filepath.Join(k8sDir, "etcd"), Upstream: "go.etcd.io/etcd/server/v3", Expect: 1 * time.Minute},
		{Name: "kube-apiserver", Dir: filepath.Join(k8sDir, "kube-apiserver"), Upstream: "k8s.io/kubernetes", Expect: 9 * time.Minute, LDFlags: kubeVersionFlags},
		// The Helm client, for the docs test's helm commands.
		{Name: "helm", Dir: filepath.Join(k8sDir, "helm"), Upstream: "helm.sh/helm/v4", Expect: 4 * time.Minute},
	}
}

// CacheDir is $MARKSPLIT_CACHE, or /var/cache/marksplit.
func CacheDir() string {
	if d := os.Getenv("MARKSPLIT_CACHE"); d != "" {
		return d
	}
	return "/var/cache/marksplit"
}

// Path returns where p's binary is cached for its module's current files,
// and the upstream version it pins.
func (p Program) Path() (path, version string, err error) {
	h := sha256.New()
	var gomod []byte
	for _, name := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(p.Dir, name))
		if err != nil {
			return "", "", fmt.Errorf("depbuild: %s: %w", p.Name, err)
		}
		if name == "go.mod" {
			gomod = b
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	version, err = requiredVersion(gomod, p.Upstream)
	if err != nil {
		return "", "", fmt.Errorf("depbuild: %s/go.mod: %w", p.Name, err)
	}
	if p.LDFlags != nil {
		fmt.Fprintf(h, "ldflags %s\n", p.LDFlags(version))
	}
	key := hex.EncodeToString(h.Sum(nil))[:12]
	return filepath.Join(CacheDir(), p.Name+"-"+version+"-"+key), version, nil
}

// requiredVersion returns the version go.mod requires of module.
func requiredVersion(gomod []byte, module string) (string, error) {
	for line := range strings.SplitSeq(string(gomod), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == module {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("no require line for %s", module)
}

// Build returns p's cached binary, building it first when it is not cached.
// While it builds it writes a line to progress when it starts, every
// interval after that, and when it is done, so that a first build of
// several minutes does not look like a hang.
func (p Program) Build(progress io.Writer, interval time.Duration) (string, error) {
	bin, version, err := p.Path()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", fmt.Errorf("depbuild: %w", err)
	}
	RemoveStale(filepath.Dir(bin))
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	defer os.Remove(tmp)

	fmt.Fprintf(progress, "building %s %s from the Go module proxy into %s (once; about %d min on a new 2-core machine)\n",
		p.Name, version, bin, int(p.Expect.Minutes()))
	start := time.Now()
	args := []string{"build", "-trimpath", "-o", tmp}
	if p.LDFlags != nil {
		args = append(args, "-ldflags="+p.LDFlags(version))
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Dir = p.Dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A caller killed (a test binary's -timeout) takes the build with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("depbuild: build %s: %w", p.Name, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return "", fmt.Errorf("depbuild: build %s %s: %w\n%s", p.Name, version, err, out.Bytes())
			}
			fmt.Fprintf(progress, "built %s %s in %s\n", p.Name, version, time.Since(start).Round(time.Second))
			if err := os.Rename(tmp, bin); err != nil {
				return "", fmt.Errorf("depbuild: %w", err)
			}
			return bin, nil
		case <-tick.C:
			fmt.Fprintf(progress, "  still building %s (%s so far)\n", p.Name, time.Since(start).Round(time.Second))
		}
	}
}

// RemoveStale removes the partial binaries (NAME.tmpPID) in dir whose
// build process is gone: what a killed build leaves.
func RemoveStale(dir string) {
	partial, _ := filepath.Glob(filepath.Join(dir, "*.tmp*"))
	for _, p := range partial {
		_, pid, ok := strings.Cut(filepath.Base(p), ".tmp")
		if !ok {
			continue
		}
		if _, err := os.Stat(filepath.Join("/proc", pid)); errors.Is(err, os.ErrNotExist) {
			os.Remove(p)
		}
	}
}
