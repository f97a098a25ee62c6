//go:build linux

package netwatchtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"golang.org/x/sys/unix"
)

// StartProgram runs a program's run function (as the examples' main calls
// it, with "--netns" and the namespace's path ahead of args) in ns until
// the test ends, then checks that it stopped with status 0; name is the
// program's, for messages. It returns the program's log.
func (ns *NetNS) StartProgram(t testing.TB, name string, run func(ctx context.Context, args []string, stderr io.Writer) int, args ...string) *SyncBuffer {
	t.Helper()
	logs := new(SyncBuffer)
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- run(ctx, append([]string{"--netns", ns.Path()}, args...), logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("%s exited with %d\n%s", name, c, logs)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s did not stop within 5 s of its context ending", name)
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
	case <-time.After(5 * time.Second):
		t.Fatalf("still running 5 s after %s\n%s", name, p.logs)
	}
}

// Hop is what `ip -j route get` says, the fields a test checks; Table is
// empty for the main table, MTU 0 for a route without an MTU of its own
// (its link's applies).
type Hop struct {
	Dev     string `json:"dev"`
	Gateway string `json:"gateway"`
	PrefSrc string `json:"prefsrc"`
	Table   string `json:"table"`
	MTU     uint32 `json:"-"` // from "metrics": [{"mtu": N}]
}

// Matches reports whether got has every field want sets, and the table
// want names (main when empty).
func (want Hop) Matches(got Hop) bool {
	return got.Dev == want.Dev && got.Table == want.Table &&
		(want.Gateway == "" || got.Gateway == want.Gateway) &&
		(want.PrefSrc == "" || got.PrefSrc == want.PrefSrc) &&
		(want.MTU == 0 || got.MTU == want.MTU)
}

// Lookup is the question of a route lookup, as `ip route get` takes it:
// where a packet to Dst goes.
type Lookup struct {
	Dst netip.Addr
	// Src is the packet's source ("from"); zero for a locally generated
	// packet without one.
	Src netip.Addr
	// IIF is the link a forwarded packet came in by ("iif"); "" for a
	// locally generated packet.
	IIF  string
	Mark netwatch.Mark
}

// RouteGet asks the kernel, with `ip -j route get` in the namespace, where
// a packet goes, and returns the answer with ip(8)'s output (its error
// message when it failed).
func (ns *NetNS) RouteGet(q Lookup) (Hop, string) {
	args := []string{"--net=" + ns.Path(), "ip", "-j", "route", "get", q.Dst.String()}
	if q.Src.IsValid() {
		args = append(args, "from", q.Src.String())
	}
	if q.IIF != "" {
		args = append(args, "iif", q.IIF)
	}
	if q.Mark != 0 {
		args = append(args, "mark", q.Mark.String())
	}
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		return Hop{}, strings.TrimSpace(string(out))
	}
	var hs []struct {
		Hop
		Metrics []struct {
			MTU uint32 `json:"mtu"`
		} `json:"metrics"`
	}
	if err := json.Unmarshal(out, &hs); err != nil || len(hs) != 1 {
		return Hop{}, string(out)
	}
	for _, m := range hs[0].Metrics {
		hs[0].Hop.MTU = max(hs[0].Hop.MTU, m.MTU)
	}
	return hs[0].Hop, string(out)
}

// WaitRoute polls `ip route get ADDR [mark MARK]` until the kernel's
// answer matches want, or fails the test, with logs, after a deadline.
func (ns *NetNS) WaitRoute(t testing.TB, logs fmt.Stringer, addr, mark string, want Hop) {
	t.Helper()
	var last string
	if !Poll(func() bool {
		q := Lookup{Dst: netip.MustParseAddr(addr)}
		if mark != "" {
			m, err := strconv.ParseUint(mark, 0, 32)
			if err != nil {
				t.Fatalf("netwatchtest: mark %q: %v", mark, err)
			}
			q.Mark = netwatch.Mark(m)
		}
		var got Hop
		got, last = ns.RouteGet(q)
		return want.Matches(got)
	}) {
		t.Fatalf("ip route get %s mark %q: want %+v, kernel says %s\nlog:\n%s", addr, mark, want, last, logs)
	}
}

// WaitOwned polls until the routes in table and the rules at priority, both
// families, one per line as OwnedText lists them, are want, or fails the
// test, with logs, after a deadline.
func (ns *NetNS) WaitOwned(t testing.TB, logs fmt.Stringer, table, priority, want string) {
	t.Helper()
	var last string
	if !Poll(func() bool {
		last = ns.OwnedText(table, priority)
		return last == want
	}) {
		t.Fatalf("table %s and priority %s: want %q, kernel has %q\nlog:\n%s", table, priority, want, last, logs)
	}
}

// OwnedText lists the routes in table and the rules at priority, IPv4
// first, one per line as ip(8) prints them after "-4 route ", "-6 rule "
// and so on.
func (ns *NetNS) OwnedText(table, priority string) string {
	ip := func(args ...string) string {
		out, err := exec.Command("nsenter", append([]string{"--net=" + ns.Path(), "ip"}, args...)...).CombinedOutput()
		if err != nil {
			return "error: " + strings.TrimSpace(string(out))
		}
		return string(out)
	}
	var lines []string
	for _, f := range []string{"-4", "-6"} {
		for l := range strings.Lines(ip(f, "route", "show", "table", "all")) {
			if strings.Contains(l, " table "+table+" ") {
				lines = append(lines, f+" route "+strings.TrimSpace(l))
			}
		}
		for l := range strings.Lines(ip(f, "rule", "show", "pref", priority)) {
			lines = append(lines, f+" rule "+strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n")
}

// WaitLog waits until logs holds s at least n times, or fails the test
// after a deadline.
func WaitLog(t testing.TB, logs fmt.Stringer, s string, n int) {
	t.Helper()
	if !Poll(func() bool { return strings.Count(logs.String(), s) >= n }) {
		t.Fatalf("log does not hold %q %d times:\n%s", s, n, logs)
	}
}

// Poll calls cond until it is true or 10 seconds have passed, and reports
// whether it became true.
func Poll(cond func() bool) bool {
	deadline := time.NewTimer(10 * time.Second)
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
