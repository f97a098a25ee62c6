package tunnel

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
)

// CacheDir is $MARKSPLIT_CACHE, or /var/cache/marksplit.
func CacheDir() string {
	if d := os.Getenv("MARKSPLIT_CACHE"); d != "" {
		return d
	}
	return "/var/cache/marksplit"
}

// BuildWireGuardGo returns the wireguard-go binary built from the module
// in dir (../wireguard-go: a go.mod with a tool line that pins
// golang.zx2c4.com/wireguard, and its go.sum), building it first when the
// cache has none for that go.mod and go.sum. The binary is cached as
// wireguard-go-VERSION-HASH in CacheDir; a build writes beside that name
// and renames, so a killed build leaves nothing a later run would take.
// It writes one line to progress when it builds.
func BuildWireGuardGo(dir string, progress io.Writer) (string, error) {
	h := sha256.New()
	var gomod []byte
	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("tunnel: wireguard-go: %w", err)
		}
		if name == "go.mod" {
			gomod = b
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	version := requiredVersion(gomod, wireguardModule)
	if version == "" {
		return "", fmt.Errorf("tunnel: wireguard-go: %s/go.mod requires no %s", dir, wireguardModule)
	}
	bin := filepath.Join(CacheDir(), "wireguard-go-"+version+"-"+hex.EncodeToString(h.Sum(nil))[:12])
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(CacheDir(), 0o755); err != nil {
		return "", fmt.Errorf("tunnel: wireguard-go: %w", err)
	}
	removeStale(CacheDir())
	tmp := fmt.Sprintf("%s.tmp%d", bin, os.Getpid())
	defer os.Remove(tmp)
	fmt.Fprintf(progress, "building wireguard-go %s from the Go module proxy into %s (once)\n", version, bin)
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, wireguardModule)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false", "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("tunnel: build wireguard-go %s: %w\n%s", version, err, out.Bytes())
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("tunnel: wireguard-go: %w", err)
	}
	return bin, nil
}

// removeStale removes the partial wireguard-go builds in dir whose build
// process is gone.
func removeStale(dir string) {
	partial, _ := filepath.Glob(filepath.Join(dir, "wireguard-go-*.tmp*"))
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
