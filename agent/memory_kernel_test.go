//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestKernelMemoryCgroup runs the agent's big passes inside a memory cgroup
// limited as deploy/daemonset.yaml limits the container: a first install
// with --underlay-link over 100,000 main routes, and a pass deleting 30,000
// routes another program put in table 900, and the first --peers=auto pass
// in a cluster of 15,000 nodes that all encrypt. Each must converge (`once`
// exits 0 and the table is as the policy wants) without an OOM kill. It
// uses the cgroup v2 memory controller where the host has it, else v1.
func TestKernelMemoryCgroup(t *testing.T) {
	limit := daemonSetMemoryLimit(t)
	t.Run("underlay-100k", func(t *testing.T) {
		s := newSeed(t, false)
		s.ns.AddRoutes(t, 100000, "10.0.0.1", "enp7s0")
		cg := newMemoryCgroup(t, limit)
		cg.once(t, s, "--underlay-link=enp7s0", "--encryption=on")
		if n := routeCount(t, s, "900"); n < 100000 {
			t.Errorf("table 900 holds %d routes, want the 100,000 split ones and the seed's", n)
		}
	})
	t.Run("foreign-30k", func(t *testing.T) {
		s := newSeed(t, false)
		addTableRoutes(t, s, 30000, "900")
		cg := newMemoryCgroup(t, limit)
		cg.once(t, s, "--prefix=10.0.0.0/16", "--encryption=on")
		if n := routeCount(t, s, "900"); n != 2 {
			t.Errorf("table 900 holds %d routes, want the seed's two split ones:\n%s", n, s.ns.IP(t, "route", "show", "table", "900"))
		}
	})
	t.Run("peers", func(t *testing.T) {
		s := newSeed(t, false)
		nodes := firstPassNodes()
		api := newEncryptingCluster(t, s, nodes)
		cg := newMemoryCgroup(t, limit)
		cg.onceEnv(t, s, api.env, peerArgs...)
		if n := strings.Count(s.ns.IP(t, "-4", "route", "show", "table", "900"), "\n"); n != nodes-1 {
			t.Errorf("table 900 holds %d routes, want one for each of the %d peers", n, nodes-1)
		}
	})
}

// daemonSetMemoryLimit is the agent container's memory limit in
// deploy/daemonset.yaml, in bytes.
func daemonSetMemoryLimit(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("../deploy/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	inLimits := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "limits:":
			inLimits = true
		case inLimits && strings.HasPrefix(line, "memory:"):
			v := strings.TrimSpace(strings.TrimPrefix(line, "memory:"))
			n, err := strconv.ParseInt(strings.TrimSuffix(v, "Mi"), 10, 64)
			if err != nil || !strings.HasSuffix(v, "Mi") {
				t.Fatalf("deploy/daemonset.yaml: memory limit %q: want N Mi", v)
			}
			return n << 20
		case inLimits && strings.HasSuffix(line, ":") && line != "limits:":
			inLimits = false
		}
	}
	t.Fatal("deploy/daemonset.yaml: no resources.limits.memory")
	return 0
}

// memoryCgroup is a memory cgroup of a test, v1 or v2.
type memoryCgroup struct {
	dir string
	v2  bool
}

// newMemoryCgroup makes a memory cgroup limited to limit bytes, without
// swap where the controller has a swap limit, removed when the test ends.
func newMemoryCgroup(t *testing.T, limit int64) *memoryCgroup {
	t.Helper()
	cg := &memoryCgroup{}
	name := fmt.Sprintf("marksplit-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		cg.v2 = true
		cg.dir = filepath.Join("/sys/fs/cgroup", name)
	} else if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		cg.dir = filepath.Join("/sys/fs/cgroup/memory", name)
	} else {
		t.Fatal("no memory cgroup controller: neither /sys/fs/cgroup/cgroup.controllers (v2) nor /sys/fs/cgroup/memory (v1)")
	}
	if cg.v2 {
		// The memory controller must be enabled for the root's children.
		if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+memory"), 0); err != nil {
			t.Logf("enable +memory in the root's subtree_control: %v", err)
		}
	}
	if err := os.Mkdir(cg.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(cg.dir); err != nil {
			t.Errorf("remove cgroup: %v", err)
		}
	})
	if cg.v2 {
		cg.write(t, "memory.max", strconv.FormatInt(limit, 10))
		if _, err := os.Stat(filepath.Join(cg.dir, "memory.swap.max")); err == nil {
			cg.write(t, "memory.swap.max", "0")
		}
	} else {
		cg.write(t, "memory.limit_in_bytes", strconv.FormatInt(limit, 10))
		if _, err := os.Stat(filepath.Join(cg.dir, "memory.memsw.limit_in_bytes")); err == nil {
			cg.write(t, "memory.memsw.limit_in_bytes", strconv.FormatInt(limit, 10))
		}
	}
	return cg
}

func (cg *memoryCgroup) write(t *testing.T, file, v string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(cg.dir, file), []byte(v), 0); err != nil {
		t.Fatalf("cgroup %s: %v", file, err)
	}
}

// stat returns the value of key in a flat-keyed cgroup file (memory.events,
// memory.oom_control); -1 when the key is not there.
func (cg *memoryCgroup) stat(t *testing.T, file, key string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cg.dir, file))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return -1
}

// oomKills counts the cgroup's OOM kills.
func (cg *memoryCgroup) oomKills(t *testing.T) int64 {
	if cg.v2 {
		return cg.stat(t, "memory.events", "oom_kill")
	}
	return cg.stat(t, "memory.oom_control", "oom_kill")
}

// peak is the cgroup's peak memory use in bytes, -1 where the kernel does
// not report it.
func (cg *memoryCgroup) peak(t *testing.T) int64 {
	file := "memory.max_usage_in_bytes"
	if cg.v2 {
		file = "memory.peak" // Linux 5.19 and later
	}
	b, err := os.ReadFile(filepath.Join(cg.dir, file))
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// once runs `marksplit once` with args in the seed's namespace, inside the
// cgroup from its first instruction (a shell joins the cgroup and execs
// it), and fails unless it converges without an OOM kill.
func (cg *memoryCgroup) once(t *testing.T, s *seed, args ...string) {
	t.Helper()
	cg.onceEnv(t, s, nil, args...)
}

// onceEnv is once with the environment env (nil: the test's).
func (cg *memoryCgroup) onceEnv(t *testing.T, s *seed, env []string, args ...string) {
	t.Helper()
	procs := filepath.Join(cg.dir, "cgroup.procs")
	cmd := exec.Command("nsenter", append([]string{"--net=" + s.ns.Path(), "sh", "-c", `echo $$ > "$0" && exec "$@"`,
		procs, agentBinary(t), "once", "--metrics-addr=", "--log-format=json"}, args...)...)
	cmd.Env = env
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	oom := cg.oomKills(t)
	t.Logf("once %v in a %d MiB cgroup (v2: %v): %v, %v, cgroup peak %.1f MiB, OOM kills %d",
		args, cg.limit(t)>>20, cg.v2, errString(err), took.Round(time.Millisecond), float64(cg.peak(t))/(1<<20), oom)
	if oom != 0 {
		t.Errorf("the agent was OOM-killed (%d kills)", oom)
	}
	if err != nil {
		lines := strings.Split(out.String(), "\n")
		t.Fatalf("once: %v; its last lines:\n%s", err, strings.Join(lines[max(0, len(lines)-5):], "\n"))
	}
}

func (cg *memoryCgroup) limit(t *testing.T) int64 {
	file := "memory.limit_in_bytes"
	if cg.v2 {
		file = "memory.max"
	}
	b, _ := os.ReadFile(filepath.Join(cg.dir, file))
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func errString(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit 0"
	case errors.As(err, &ee):
		return ee.String()
	}
	return err.Error()
}

// routeCount counts the routes of table in the seed's namespace.
func routeCount(t *testing.T, s *seed, table string) int {
	t.Helper()
	return strings.Count(s.ns.IP(t, "route", "show", "table", table), "\n")
}

// addTableRoutes adds n foreign /24 routes from 11.0.0.0/24 upwards to
// table, via the gateway, with ip -batch: another program's routes in the
// agent's table.
func addTableRoutes(t *testing.T, s *seed, n int, table string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes")
	var b strings.Builder
	for i := range n {
		a := 11<<24 + i<<8
		fmt.Fprintf(&b, "route add %d.%d.%d.0/24 via 10.0.0.1 dev enp7s0 table %s\n", a>>24, a>>16&0xff, a>>8&0xff, table)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	s.ns.IP(t, "-batch", path)
}
