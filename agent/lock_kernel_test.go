//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// squatEnv makes the test binary a squatter instead of running tests
// (TestMain): it binds the abstract unix socket names in the variable
// (comma-separated; tcp:ADDR for a TCP address), says "ready", and holds
// them until its standard input closes.
const squatEnv = "MARKSPLIT_TEST_SQUAT"

func squat(names string) int {
	for name := range strings.SplitSeq(names, ",") {
		if addr, ok := strings.CutPrefix(name, "tcp:"); ok {
			// A TCP port, answering 200 to every request, as the red team's
			// squatter answered the kubelet's /healthz (issue 38).
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer ln.Close()
			go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") }))
			continue
		}
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
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

// startSquatter runs the test binary as the user nobody in the seed's
// namespace, holding the abstract socket names, until the test ends.
func (s *seed) startSquatter(t *testing.T, names ...string) {
	t.Helper()
	s.startNobody(t, squatEnv+"="+strings.Join(names, ","))
}

// startNobody runs the test binary as the user nobody in the seed's
// namespace with the environment variable env (squatEnv or floodEnv), waits
// for its first line, "ready…", and returns it and a func that ends it
// (also called when the test ends).
func (s *seed) startNobody(t *testing.T, env string) (string, func()) {
	t.Helper()
	// nobody must be able to run a copy of the test binary.
	dir, err := os.MkdirTemp("", "marksplit-squatter-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "squatter")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{env}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A child forked on the namespace's thread starts in the namespace.
	if err := s.ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end := func() { once.Do(func() { stdin.Close(); cmd.Wait() }) }
	t.Cleanup(end)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if !strings.HasPrefix(line, "ready") {
		t.Fatalf("%s as nobody: %q, %v", env, line, err)
	}
	return strings.TrimSpace(line), end
}

// waitExit waits at most d for the agent to exit, and returns its exit
// code and output; a still running agent fails the test.
func (a *agentProc) waitExit(t *testing.T, d time.Duration) (int, string) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-a.done:
		return a.cmd.ProcessState.ExitCode(), a.out.String()
	case <-timer.C:
		t.Errorf("still running after %v: want an exit", d)
		return -1, a.out.String()
	}
}

// One agent per table and per priority: a second agent with another
// table and the same priority, or the same table and another priority, is
// refused with one line naming the first and what it keeps.
func TestKernelOneAgentPerPriority(t *testing.T) {
	s := newSeed(t, true)
	a := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--table=901"}, fmt.Sprintf("priority 900 in this network namespace is kept (with table 900) by another marksplit (pid %d, marksplit)", a.cmd.Process.Pid)},
		{[]string{"--priority=901"}, fmt.Sprintf("table 900 in this network namespace is kept (with priority 900) by another marksplit (pid %d, marksplit)", a.cmd.Process.Pid)},
	} {
		b := s.start(t, append(append(seedArgs, "--metrics-addr="), tc.flags...)...)
		code, out := b.waitExit(t, 5*time.Second)
		if code != 1 || strings.Count(out, "\n") != 1 || !strings.Contains(out, tc.want) {
			t.Errorf("a second agent with %s: exit %d, output %q; want exit 1 and one line saying %q", tc.flags, code, out, tc.want)
		}
	}
	if err := s.splitAt(t, 1355); err != nil {
		t.Errorf("the first agent's split: %v", err)
	}
}

// An unprivileged user who binds the lock's names first (the name earlier
// versions used, and one of this version's form) does not keep the agent
// from starting: the agent says whose sockets it ignored. A real second
// marksplit is still refused.
func TestKernelLockSquatterIgnored(t *testing.T) {
	s := newSeed(t, true)
	s.startSquatter(t, "@marksplit/table/900", "@marksplit/agent/table=900/priority=900/0")
	a := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "split despite the squatter", func() error {
		select {
		case <-a.done:
			return fmt.Errorf("the agent exited (%v):\n%s", a.err, a.out)
		default:
		}
		return s.splitAt(t, 1355)
	})
	var warned bool
	for _, m := range a.messages(t) {
		warned = warned || strings.HasPrefix(m, "ignored lock sockets held by unprivileged users") &&
			strings.Contains(m, `"@marksplit/table/900" (uid 65534)`) && strings.Contains(m, `"@marksplit/agent/table=900/priority=900/0" (uid 65534)`)
	}
	if !warned {
		t.Errorf("no warning naming the squatter's sockets:\n%s", a.out)
	}
	b := s.start(t, append(seedArgs, "--metrics-addr=")...)
	code, out := b.waitExit(t, 5*time.Second)
	want := fmt.Sprintf("table 900 and priority 900 in this network namespace are kept by another marksplit (pid %d, marksplit)", a.cmd.Process.Pid)
	if code != 1 || strings.Count(out, "\n") != 1 || !strings.Contains(out, want) {
		t.Errorf("a second agent beside the first and the squatter: exit %d, output %q; want exit 1 and one line saying %q", code, out, want)
	}
}

// Agents started at the same moment: exactly one keeps the table, however
// their claims interleave.
func TestKernelLockRace(t *testing.T) {
	s := newSeed(t, true)
	for i := range 5 {
		var as [3]*agentProc
		for j := range as {
			as[j] = s.start(t, append(seedArgs, "--metrics-addr=")...)
		}
		var running []*agentProc
		for _, a := range as {
			eventually(t, 5*time.Second, "each agent running or refused", func() error {
				select {
				case <-a.done:
					return nil
				default:
				}
				return a.logged(t, "marksplit dev running")
			})
			select {
			case <-a.done:
				if code := a.cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(a.out.String(), "kept by another marksplit") {
					t.Errorf("round %d: a refused agent: exit %d:\n%s", i, code, a.out)
				}
			default:
				running = append(running, a)
			}
		}
		if len(running) != 1 {
			t.Fatalf("round %d: %d agents running, want 1", i, len(running))
		}
		if code, _ := running[0].stop(t, syscall.SIGTERM); code != 0 {
			t.Errorf("round %d: exit %d", i, code)
		}
	}
}

// cleanup beside an agent that has already removed everything (here it
// runs with --encryption=off; test/k8s does it beside one switched off by
// the uninstall ConfigMap) changes nothing and succeeds, with a note
// naming the agent.
func TestKernelCleanupBesideAgentOff(t *testing.T) {
	s := newSeed(t, true)
	a := s.start(t, "--prefix=10.0.0.0/16", "--encryption=off", "--metrics-addr=")
	eventually(t, 5*time.Second, "nothing split", func() error {
		if err := a.logged(t, "marksplit dev running"); err != nil {
			return err
		}
		return s.unsplit(t)
	})
	stdout, stderr, code := s.command(t, "cleanup", "--prefix=10.0.0.0/16")
	want := fmt.Sprintf("marksplit: note: table 900 and priority 900 in this network namespace are kept by another marksplit (pid %d, marksplit): one program per table and per priority in a network namespace; it has nothing left that cleanup would remove\n", a.cmd.Process.Pid)
	if code != 0 || stdout != "" {
		t.Errorf("cleanup beside an agent with nothing split: exit %d, stdout %q; want exit 0, nothing printed", code, stdout)
	}
	if diff := cmp.Diff(want, stderr); diff != "" {
		t.Errorf("cleanup's note (-want +got):\n%s", diff)
	}
}
