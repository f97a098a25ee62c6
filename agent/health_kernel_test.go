//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// floodEnv makes the test binary a flood instead of running tests
// (TestMain): "ADDR,N" opens N connections to ADDR that never send a byte,
// and opens a new one for each the server closes (the red team's reconnect
// flood, issue 38 RF). It prints "ready K" once each of the N was tried (K
// connected) and goes on until its standard input closes.
const floodEnv = "MARKSPLIT_TEST_FLOOD"

func flood(v string) int {
	addr, ns, _ := strings.Cut(v, ",")
	n, _ := strconv.Atoi(ns)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	var d net.Dialer
	var tried sync.WaitGroup
	var ok atomic.Int64
	for range n {
		tried.Add(1)
		go func() {
			first := true
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if first {
					if err == nil {
						ok.Add(1)
					}
					tried.Done()
					first = false
				}
				if err != nil {
					return
				}
				stop := context.AfterFunc(ctx, func() { c.Close() })
				io.Copy(io.Discard, c) // until the server closes it
				stop()
				c.Close()
			}
		}()
	}
	tried.Wait()
	fmt.Printf("ready %d\n", ok.Load())
	<-ctx.Done()
	return 0
}

// probeTimeout is the DaemonSet's timeoutSeconds of its exec probes: the
// kubelet kills a probe that runs longer and counts it failed.
const probeTimeout = 2 * time.Second

// execProbe runs the DaemonSet's exec probe, `marksplit health` (--ready
// for readiness), against the agent's health socket, killed after the
// probe's timeout as the kubelet does.
func execProbe(t *testing.T, socket string, ready bool) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	args := []string{"health", "--health-socket=" + socket}
	if ready {
		args = append(args, "--ready")
	}
	out, err := exec.CommandContext(ctx, agentBinary(t), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// probeTen runs each exec probe 10 times and fails unless each answers 10
// of 10; it logs the figures under the name when.
func probeTen(t *testing.T, socket, when string) {
	t.Helper()
	for _, ready := range []bool{false, true} {
		answered := 0
		var last error
		for range 10 {
			if err := execProbe(t, socket, ready); err != nil {
				last = err
				continue
			}
			answered++
		}
		name := "marksplit health"
		if ready {
			name += " --ready"
		}
		t.Logf("%s %s: %d/10 answered ok", when, name, answered)
		if answered != 10 {
			t.Errorf("%s %s: %d/10 answered ok, want 10/10; last: %v", when, name, answered, last)
		}
	}
}

// The red team's PSQ and RF (issue 38): a user (nobody) who binds
// 127.0.0.1:9184 and :9185 before the agent, and answers 200 there, made the
// agent exit 1 before it installed anything; 10,000 connections re-opened
// as fast as the metrics listener shed them failed the kubelet's httpGet
// probes. Now the agent installs the split beside the squatters, says so
// once, counts the failed binds, binds the port once it is free, and the
// DaemonSet's exec probes (the health socket) answer 10 of 10 beside the
// squatters, and again beside the flood on the agent's own listener.
func TestKernelProbesBesideSquatterAndFlood(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run the squatter and the flood as the user nobody")
	}
	s := newSeed(t, false)
	_, freeMetrics := s.startNobody(t, squatEnv+"=tcp:127.0.0.1:9184")
	s.startSquatter(t, "tcp:127.0.0.1:9185")
	socket := filepath.Join(t.TempDir(), "health.sock")
	a := s.start(t, append(seedArgs, "--metrics-addr=127.0.0.1:9184", "--health-socket="+socket)...)

	eventually(t, time.Minute, "the split beside the squatters", func() error {
		select {
		case <-a.done:
			return errors.New("the agent exited")
		default:
		}
		return s.splitAt(t, 1355)
	})
	eventually(t, time.Minute, "readiness beside the squatters", func() error { return execProbe(t, socket, true) })
	probeTen(t, socket, "beside squatters (uid 65534) on 127.0.0.1:9184 and :9185")
	warned := 0
	for _, m := range a.messages(t) {
		if strings.HasPrefix(m, "--metrics-addr 127.0.0.1:9184: ") && strings.Contains(m, "address already in use") {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("the agent warned %d times that 127.0.0.1:9184 is taken, want once", warned)
	}

	// The squatter goes: the agent binds the port (its next try is at most
	// 30 s away) and says how often it failed.
	freeMetrics()
	failures := regexp.MustCompile(`(?m)^marksplit_listen_failures_total\{listener="metrics"\} ([0-9]+)$`)
	eventually(t, 2*time.Minute, "the agent's /metrics on 127.0.0.1:9184 once the squatter left", func() error {
		var body string
		var c net.Conn
		err := s.ns.Do(func() (err error) {
			// The socket is made here, on the namespace's thread.
			c, err = net.DialTimeout("tcp", "127.0.0.1:9184", 10*time.Second)
			return err
		})
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET /metrics HTTP/1.0\r\n\r\n")
		b, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		body = string(b)
		m := failures.FindStringSubmatch(body)
		if m == nil || m[1] == "0" {
			return fmt.Errorf("marksplit_listen_failures_total{listener=\"metrics\"}: %v, want at least 1", m)
		}
		t.Logf("the agent listens on 127.0.0.1:9184 after the squatter left; %s", m[0])
		return nil
	})

	if testing.Short() {
		t.Skip("10,000 connections: not in -short")
	}
	ready, _ := s.startNobody(t, fmt.Sprintf("%s=127.0.0.1:9184,%d", floodEnv, 10000))
	t.Logf("flood (uid 65534): %s connections at first, each re-opened as soon as it is shed", strings.TrimPrefix(ready, "ready "))
	probeTen(t, socket, "beside a reconnect flood of 10,000 on 127.0.0.1:9184 and a squatter on :9185")
	select {
	case <-a.done:
		t.Fatalf("the agent exited: %v", a.err)
	default:
	}
	if err := s.splitAt(t, 1355); err != nil {
		t.Errorf("after the flood: %v", err)
	}
}

// A user who is not root can neither take the health socket's path nor ask
// the agent: its directory is made 0700 (or loses group and other write),
// the socket is 0600, and a socket left there by anyone else is replaced.
func TestKernelHealthSocketIsRoots(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	// Open to all up to the directory, so that only the modes below keep
	// nobody out.
	base, err := os.MkdirTemp("", "marksplit-health-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o755))
	dir := filepath.Join(base, "run")
	must(t, os.Mkdir(dir, 0o777))
	must(t, os.Chmod(dir, 0o777)) // an emptyDir's mode
	socket := filepath.Join(dir, "health.sock")
	// Someone bound the path while the directory was open to all.
	old, err := net.Listen("unix", socket)
	must(t, err)
	defer old.Close()

	s := newSeed(t, false)
	a := s.start(t, append(seedArgs, "--metrics-addr=", "--health-socket="+socket)...)
	eventually(t, time.Minute, "readiness", func() error { return execProbe(t, socket, true) })
	for path, want := range map[string]os.FileMode{dir: 0o755, socket: 0o600} {
		fi, err := os.Stat(path)
		must(t, err)
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
	}
	// nobody cannot connect.
	bin := filepath.Join(base, "marksplit")
	self, err := os.ReadFile(agentBinary(t))
	must(t, err)
	must(t, os.WriteFile(bin, self, 0o755))
	cmd := exec.Command(bin, "health", "--health-socket="+socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "permission denied") {
		t.Errorf("marksplit health as nobody: %v: %s; want permission denied", err, out)
	}
	if code, took := a.stop(t, os.Interrupt); code != 0 {
		t.Errorf("exit %d after %v", code, took)
	}
}
