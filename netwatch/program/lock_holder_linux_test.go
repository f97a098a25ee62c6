//go:build linux

package program

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// The test binary, re-executed with one of these variables, is a process
// that holds locks instead of running tests (TestMain): it says "ready"
// and holds them until its standard input closes.
const (
	// holdEnv: "T,P": Claim table T and priority P.
	holdEnv = "MARKSPLIT_LOCK_TEST_HOLD"
	// squatEnv: "PREFIX,N": bind N abstract names PREFIX0 … PREFIX(N-1).
	squatEnv = "MARKSPLIT_LOCK_TEST_SQUAT"
)

func TestMain(m *testing.M) {
	if v := os.Getenv(holdEnv); v != "" {
		os.Exit(hold(v))
	}
	if v := os.Getenv(squatEnv); v != "" {
		os.Exit(squat(v))
	}
	os.Exit(m.Run())
}

func hold(v string) int {
	ts, ps, _ := strings.Cut(v, ",")
	t, _ := strconv.ParseUint(ts, 10, 32)
	p, _ := strconv.ParseUint(ps, 10, 32)
	l, err := Claim(nil, "marksplit", reconcile.OwnTable(t), reconcile.OwnPriority(p))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Release()
	os.Stdout.WriteString("ready\n")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

func squat(v string) int {
	prefix, ns, _ := strings.Cut(v, ",")
	n, _ := strconv.Atoi(ns)
	for i := range n {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: prefix + strconv.Itoa(i), Net: "unix"})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer ln.Close()
	}
	os.Stdout.WriteString("ready\n")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// startChild runs a copy of the test binary named "marksplit" (its comm)
// with env, as cred's user when cred is not nil, until the test ends; it
// returns once the child said "ready".
func startChild(t *testing.T, env string, cred *syscall.Credential) *exec.Cmd {
	t.Helper()
	dir, err := os.MkdirTemp("", "marksplit-lock-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "marksplit")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // for another user
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{env}
	cmd.Stderr = os.Stderr
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		stdin.Close()
		cmd.Wait()
	})
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("child %s: %q, %v", env, line, err)
	}
	return cmd
}

// A stopped agent (SIGSTOP: it cannot answer) still keeps its table and
// priority, and the refusal calls it what it is: a marksplit, stopped.
func TestHeldByStopped(t *testing.T) {
	const table, prio = 4000000002, 4000000002
	child := startChild(t, fmt.Sprintf("%s=%d,%d", holdEnv, table, prio), nil)
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The signal is delivered asynchronously: wait for every thread to stop.
	for deadline := time.Now().Add(2 * time.Minute); !allStopped(child.Process.Pid); {
		if time.Now().After(deadline) {
			t.Fatal("the holder did not stop within 2 min")
		}
		runtime.Gosched()
	}
	l, err := Claim(nil, "marksplit", table, prio)
	if err == nil {
		l.Release()
		t.Fatal("claimed beside a stopped holder")
	}
	var held *HeldError
	want := fmt.Sprintf("table %d and priority %d in this network namespace are kept by another marksplit, stopped (pid %d, marksplit)", table, prio, child.Process.Pid)
	if !errors.As(err, &held) || !strings.Contains(err.Error(), want) {
		t.Errorf("Claim beside a stopped holder: %v; want a HeldError saying %q", err, want)
	}
}

// allStopped reports whether every thread of process pid is stopped.
func allStopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if !stopped(int32(tid)) {
			return false
		}
	}
	return true
}

// An unprivileged user holding 19,000 lock-named sockets gets one warning
// of bounded length: the first few names and a count (issue 31: 1.4 MB).
func TestIgnoredWarningBounded(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a child as the user nobody")
	}
	const table, prio, n = 4000000003, 4000000003, 19000
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Max < n+100 {
		t.Fatalf("RLIMIT_NOFILE %+v, %v: the child needs %d descriptors", lim, err, n+100)
	}
	prefix := fmt.Sprintf("@netwatch/owner/table=%d/priority=%d/", table, prio)
	startChild(t, fmt.Sprintf("%s=%s,%d", squatEnv, prefix, n), &syscall.Credential{Uid: 65534, Gid: 65534})
	l, err := Claim(nil, "marksplit", table, prio)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	w := l.Warning()
	if len(w) > 1024 || !strings.Contains(w, fmt.Sprintf("and %d more", n-maxNamed)) || !strings.Contains(w, "(uid 65534)") {
		t.Errorf("warning of %d bytes (%.200s…); want at most 1024, naming the first %d sockets with their uid and counting the other %d", len(w), w, maxNamed, n-maxNamed)
	}
	t.Logf("%d bytes: %s", len(w), w)
}
