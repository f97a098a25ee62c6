//go:build linux

package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/marksplit/marksplit/internal/peakrss"
)

// passSection measures each passCase with the agent of this tree and with
// base, the agent built from baseRev, each in a fresh namespace, taking
// turns.
func passSection(repo, agent, baseRev string) ([]passResult, error) {
	base, cleanup, err := buildBase(repo, baseRev)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	res, err := peersPass(repo, base)
	if err != nil {
		return nil, err
	}
	for i := range res {
		if res[i].Agent == "base" {
			res[i].Agent = baseRev
		} else {
			res[i].Agent = "this tree"
		}
	}
	for _, c := range passCases {
		for _, a := range []struct{ name, bin string }{{"this tree", agent}, {baseRev, base}} {
			r, err := runPass(c, a.bin)
			if err != nil {
				return nil, fmt.Errorf("%s with %s: %w", c.Name, a.name, err)
			}
			r.Agent = a.name
			logf("pass %s, agent %s: peak RSS %.1f MiB, %v %s", c.Name, a.name, float64(r.PeakRSS)/1024, r.Took.Round(time.Millisecond), r.Err)
			res = append(res, r)
		}
	}
	return res, nil
}

// peersPass runs the agent package's BenchmarkKernelPeersFirstPass, which
// serves the CiliumNodes of a cluster where every node encrypts from its
// stand-in API server, with base as MARKSPLIT_BENCH_BASE, and takes its
// figures: this tree's agent first, then base's.
func peersPass(repo, base string) ([]passResult, error) {
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", "^BenchmarkKernelPeersFirstPass$", "-benchtime", "1x", "./agent")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "MARKSPLIT_BENCH_BASE="+base, "MARKSPLIT_KERNEL_TESTS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("BenchmarkKernelPeersFirstPass: %v\n%s", err, out)
	}
	res, err := parsePeersBench(string(out))
	for _, r := range res {
		logf("pass %s, agent %s: peak RSS %.1f MiB, %v", r.Case, r.Agent, float64(r.PeakRSS)/1024, r.Took.Round(time.Millisecond))
	}
	return res, err
}

// buildBase builds the agent of rev from a git worktree of repo.
func buildBase(repo, rev string) (bin string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "bench-base-")
	if err != nil {
		return "", nil, err
	}
	wt := filepath.Join(dir, "src")
	cleanup = func() {
		exec.Command("git", "-C", repo, "worktree", "remove", "--force", wt).Run()
		os.RemoveAll(dir)
	}
	if out, err := exec.Command("git", "-C", repo, "worktree", "add", "--detach", wt, rev).CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("git worktree add %s: %v\n%s", rev, err, out)
	}
	bin = filepath.Join(dir, "marksplit-base")
	build := exec.Command("go", "build", "-o", bin, "./agent")
	build.Dir = wt
	if out, err := build.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("go build ./agent at %s: %v\n%s", rev, err, out)
	}
	return bin, cleanup, nil
}

// runPass sets up a fresh seed namespace for c and runs `once` in it.
func runPass(c passCase, bin string) (passResult, error) {
	ns := fmt.Sprintf("bench-pass-%d", os.Getpid())
	gw := ns + "-gw"
	defer exec.Command("ip", "netns", "del", ns).Run()
	defer exec.Command("ip", "netns", "del", gw).Run()
	if err := seedNS(ns, gw); err != nil {
		return passResult{}, err
	}
	if err := batchRoutes(ns, c.routes, c.extra); err != nil {
		return passResult{}, err
	}
	cmd := exec.Command("nsenter", append([]string{"--net=/var/run/netns/" + ns, bin, "once", "--metrics-addr="}, c.args...)...)
	var out strings.Builder
	cmd.Stderr = &out
	start := time.Now()
	rss, err := peakrss.Run(cmd, bin)
	r := passResult{Case: c.Name, Took: time.Since(start), PeakRSS: rss}
	if err != nil {
		r.Err = err.Error()
		if cmd.ProcessState != nil {
			r.Err = cmd.ProcessState.String()
		}
		if s := strings.TrimSpace(out.String()); s != "" {
			lines := strings.Split(s, "\n")
			r.Err += ": " + lines[len(lines)-1]
		}
	}
	return r, nil
}

// seedNS makes the seed topology of the agent's tests in namespace ns, with
// its gateway in gw.
func seedNS(ns, gw string) error {
	for _, args := range [][]string{
		{"netns", "add", ns}, {"netns", "add", gw},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "enp7s0", "type", "veth", "peer", "name", "gw0", "netns", gw},
		{"-n", gw, "link", "set", "gw0", "mtu", "1450"},
		{"-n", gw, "addr", "add", "10.0.0.1/16", "dev", "gw0"},
		{"-n", gw, "link", "set", "gw0", "up"},
		{"-n", ns, "link", "set", "enp7s0", "mtu", "1450"},
		{"-n", ns, "addr", "add", "10.0.0.5/16", "dev", "enp7s0", "noprefixroute"},
		{"-n", ns, "link", "set", "enp7s0", "up"},
		{"-n", ns, "route", "add", "10.0.0.1", "dev", "enp7s0", "proto", "dhcp", "scope", "link", "src", "10.0.0.5"},
		{"-n", ns, "route", "add", "10.0.0.0/16", "via", "10.0.0.1", "dev", "enp7s0", "proto", "dhcp", "src", "10.0.0.5"},
		{"-n", ns, "tuntap", "add", "mode", "tun", "cilium_wg0"},
		{"-n", ns, "link", "set", "cilium_wg0", "mtu", "1355", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// batchRoutes adds n /24 routes from 11.0.0.0/24 upwards via the gateway,
// each with extra (say "table 900"), in one ip -batch.
func batchRoutes(ns string, n int, extra string) error {
	f, err := os.CreateTemp("", "bench-routes-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	w := bufio.NewWriter(f)
	for i := range n {
		a := 11<<24 + i<<8
		fmt.Fprintf(w, "route add %d.%d.%d.0/24 via 10.0.0.1 dev enp7s0 %s\n", a>>24, a>>16&0xff, a>>8&0xff, extra)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	f.Close()
	if out, err := exec.Command("ip", "-n", ns, "-batch", f.Name()).CombinedOutput(); err != nil {
		return fmt.Errorf("ip -batch: %v: %s", err, out)
	}
	return nil
}

// startHogs starts n CPU hogs, each a shell spinning in a loop (processes,
// so that the bench's own goroutines are not starved of its Ps), and
// returns the function that stops them: the passes' memory is measured on
// a node whose cores are busy, where the collector runs late.
func startHogs(n int) (stop func()) {
	var hogs []*exec.Cmd
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			logf("a CPU hog did not start: %v", err)
			continue
		}
		hogs = append(hogs, c)
	}
	return func() {
		for _, c := range hogs {
			c.Process.Kill()
			c.Wait()
		}
	}
}
