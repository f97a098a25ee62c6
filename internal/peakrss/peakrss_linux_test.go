package peakrss

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// childMiB is what the child process touches, beside its runtime.
const childMiB = 40

func TestMain(m *testing.M) {
	if os.Getenv("PEAKRSS_CHILD") == "1" {
		b := make([]byte, childMiB<<20)
		for i := 0; i < len(b); i += 4096 { // a byte a page makes it resident
			b[i] = 1
		}
		// Exit at the peak, at once: a sampler would have to read
		// VmHWM in the last moment of the program.
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

// TestRunAtExit: a program that exits at its peak, at once, is measured
// at that peak, however late the machine runs this process: Run reads
// VmHWM as the program exits, where a sampler every 2 ms read dd at 31 of
// its 40 MiB beside two CPU hogs.
func TestRunAtExit(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), "PEAKRSS_CHILD=1")
		kib, err := Run(cmd, self)
		if err != nil || kib < childMiB<<10 {
			t.Fatalf("run %d: %d KiB, %v; want at least %d MiB", i, kib, err, childMiB)
		}
	}
}

// TestRunSignals: a signal the program receives while traced reaches it,
// and its end by a signal is cmd.Wait's error.
func TestRunSignals(t *testing.T) {
	cmd := exec.Command("sh", "-c", `trap 'exit 7' TERM; kill -TERM $$; sleep 10`)
	_, err := Run(cmd, "sh")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Errorf("sh that sends itself SIGTERM under a trap: %v; want exit status 7", err)
	}
	cmd = exec.Command("sh", "-c", `kill -KILL $$`)
	if _, err := Run(cmd, "sh"); !errors.As(err, &ee) || !strings.Contains(err.Error(), "killed") {
		t.Errorf("sh that sends itself SIGKILL: %v; want killed", err)
	}
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
