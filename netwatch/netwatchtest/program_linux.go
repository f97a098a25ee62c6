//go:build linux

package netwatchtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// StartProgram runs a program until the test ends, then checks that it
// stopped with status 0; name is the program's, for messages. run is the
// program as its main runs it, in the namespace the test chose, a fake
// kernel's or a real one's (program.Program's Run with its NetNS set),
// writing its log to logs until ctx ends. StartProgram returns the log.
func StartProgram(t testing.TB, name string, run func(ctx context.Context, logs io.Writer) int) *SyncBuffer {
	t.Helper()
	logs := new(SyncBuffer)
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- run(ctx, logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("%s exited with %d\n%s", name, c, logs)
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("%s did not stop within 2 min of its context ending", name)
		}
		if t.Failed() {
			t.Logf("%s's log:\n%s", name, logs)
		}
	})
	return logs
}

// BuildProgram builds the main package in the test's directory into a
// binary called name in a temporary directory and returns its path; it
// fails the test when go is not in PATH.
func BuildProgram(t testing.TB, name string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("netwatchtest: go not in PATH: cannot build %s", name)
	}
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Process is a binary that StartBinary runs in a namespace.
type Process struct {
	cmd    *exec.Cmd
	exited chan error
	logs   *SyncBuffer
}

// StartBinary runs bin with args in ns under nsenter(1), its standard
// error going to the returned log, and kills it when the test ends if it
// is still running.
func (ns *NetNS) StartBinary(t testing.TB, bin string, args ...string) (*Process, *SyncBuffer) {
	t.Helper()
	logs := new(SyncBuffer)
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.Path(), bin}, args...)...)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{cmd: cmd, exited: make(chan error, 1), logs: logs}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.exited
		}
	})
	return p, logs
}

// Stop sends sig to the process and fails the test unless it exits with
// status 0 within 5 seconds.
func (p *Process) Stop(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	name := unix.SignalName(sig)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("after %s: %v\n%s", name, err, p.logs)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("still running 2 min after %s\n%s", name, p.logs)
	}
}

// WaitLog waits until logs holds s at least n times, or fails the test
// after a deadline.
func WaitLog(t testing.TB, logs fmt.Stringer, s string, n int) {
	t.Helper()
	if !Poll(func() bool { return strings.Count(logs.String(), s) >= n }) {
		t.Fatalf("log does not hold %q %d times:\n%s", s, n, logs)
	}
}

// Poll calls cond until it is true or 2 minutes have passed, and reports
// whether it became true: a deadline that only a hang reaches, so that a
// test waiting on a busy machine waits rather than fails.
func Poll(cond func() bool) bool {
	deadline := time.NewTimer(pollDeadline)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-deadline.C:
			return cond()
		case <-tick.C:
		}
	}
}

// SyncBuffer is a bytes.Buffer that a program and its test share: the
// program writes its log while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what has been written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// pollDeadline is how long Poll waits.
const pollDeadline = 2 * time.Minute
