package peakrss

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// childMiB is what the child process touches, beside its runtime.
const childMiB = 40

func TestMain(m *testing.M) {
	if os.Getenv("PEAKRSS_CHILD") == "1" {
		b := make([]byte, childMiB<<20)
		for i := range b {
			b[i] = 1
		}
		time.Sleep(50 * time.Millisecond)
		runtime.KeepAlive(b)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRunNotTheParents: dd with a 40 MiB buffer, started by a process
// holding 160 MiB, peaks at about 40 MiB in Run's figure, where ru_maxrss
// reports the parent's 160 with it. (dd, not this test binary: built with
// -race, the binary's own 40 MiB cost three times that.)
func TestRunNotTheParents(t *testing.T) {
	held := make([]byte, 160<<20)
	for i := range held {
		held[i] = 1
	}
	cmd := exec.Command("dd", fmt.Sprintf("bs=%dM", childMiB), "count=25", "if=/dev/zero", "of=/dev/null")
	kib, err := Run(cmd, "dd")
	if err != nil {
		t.Fatal(err)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
	t.Logf("Run: %d KiB; ru_maxrss: %d KiB", kib, ru)
	if kib < childMiB<<10 || kib > (childMiB+20)<<10 {
		t.Errorf("Run: %d KiB, want dd's %d MiB buffer and a little more", kib, childMiB)
	}
	if ru < 160<<10 {
		// Not a failure of Run, but the reason for it is gone: say so.
		t.Logf("ru_maxrss %d KiB no longer counts the parent's 160 MiB", ru)
	}
	runtime.KeepAlive(held)
}

// TestRunThroughExec: a program reached through another's exec (nsenter's
// way) is measured once it runs; a command that never runs it is an error.
func TestRunThroughExec(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sh, "-c", `sleep 0.05; exec "$0"`, self)
	cmd.Env = append(os.Environ(), "PEAKRSS_CHILD=1")
	if kib, err := Run(cmd, self); err != nil || kib < childMiB<<10 {
		t.Errorf("Run through sh's exec: %d KiB, %v; want at least %d MiB", kib, err, childMiB)
	}
	if kib, err := Run(exec.Command(sh, "-c", "true"), self); err == nil {
		t.Errorf("Run of a command that never runs the program: %d KiB, no error", kib)
	}
}
