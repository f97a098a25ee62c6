//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/marksplit/marksplit/internal/nltest"
)

// TestKernelVPNBypass runs vpnbypass in a fresh network namespace, changes
// the world under it and asks the kernel, after each change, where a
// packet to the chosen prefixes goes without the VPN's mark and with it.
func TestKernelVPNBypass(t *testing.T) {
	ns := nltest.NewNetNS(t)
	ns.LoUp(t)
	// The underlay: a veth whose peer stays unaddressed in the same
	// namespace (both ends up, so it has carrier), and default routes.
	ns.AddVeth(t, "eth0", nil, "eth0p")
	ns.IP(t, "link", "set", "eth0p", "up")
	ns.IP(t, "link", "set", "eth0", "up")
	ns.IP(t, "addr", "add", "192.0.2.2/24", "dev", "eth0")
	ns.IP(t, "addr", "add", "2001:db8:1::2/64", "dev", "eth0", "nodad")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1")
	ns.IP(t, "-6", "route", "add", "default", "via", "2001:db8:1::1")

	logs := start(t, ns, "--link", "vpn0", "--prefix", "198.51.100.0/24", "--prefix", "2001:db8:100::/48")

	const v4, v6 = "198.51.100.7", "2001:db8:100::7"
	underlay4 := hop{Dev: "eth0", Gateway: "192.0.2.1"}
	underlay6 := hop{Dev: "eth0", Gateway: "2001:db8:1::1"}
	both := func(t *testing.T, addr string, unmarked, marked hop) {
		t.Helper()
		waitRoute(t, ns, logs, addr, "", unmarked)
		waitRoute(t, ns, logs, addr, "0x80000", marked)
		// Another mark in the same byte is not the VPN's.
		waitRoute(t, ns, logs, addr, "0x40000", unmarked)
	}
	nothingOwned := func(t *testing.T) {
		t.Helper()
		waitOwned(t, ns, logs, "910", "910", "")
	}

	t.Log("no VPN link: nothing changes")
	waitLog(t, logs, "vpnbypass: started", 1)
	both(t, v4, underlay4, underlay4)
	nothingOwned(t)

	t.Log("the VPN link appears, up, with an address of each family")
	ns.AddTun(t, "vpn0")
	ns.IP(t, "link", "set", "vpn0", "up")
	ns.IP(t, "addr", "add", "100.64.0.1/32", "dev", "vpn0")
	ns.IP(t, "addr", "add", "fd7a::1/128", "dev", "vpn0", "nodad")
	both(t, v4, hop{Dev: "vpn0", Table: "910", PrefSrc: "100.64.0.1"}, underlay4)
	both(t, v6, hop{Dev: "vpn0", Table: "910", PrefSrc: "fd7a::1"}, underlay6)
	waitRoute(t, ns, logs, "192.0.2.77", "", hop{Dev: "eth0"}) // outside the prefixes

	t.Log("the VPN link changes address")
	ns.IP(t, "addr", "add", "100.64.0.2/32", "dev", "vpn0")
	ns.IP(t, "addr", "del", "100.64.0.1/32", "dev", "vpn0")
	ns.IP(t, "addr", "add", "fd7a::2/128", "dev", "vpn0", "nodad")
	ns.IP(t, "addr", "del", "fd7a::1/128", "dev", "vpn0")
	both(t, v4, hop{Dev: "vpn0", Table: "910", PrefSrc: "100.64.0.2"}, underlay4)
	both(t, v6, hop{Dev: "vpn0", Table: "910", PrefSrc: "fd7a::2"}, underlay6)

	t.Log("the VPN link goes down: everything owned is removed")
	ns.IP(t, "link", "set", "vpn0", "down")
	both(t, v4, underlay4, underlay4)
	both(t, v6, underlay6, underlay6)
	nothingOwned(t)

	t.Log("the VPN link comes up again (its IPv6 address went with the down)")
	ns.IP(t, "link", "set", "vpn0", "up")
	both(t, v4, hop{Dev: "vpn0", Table: "910", PrefSrc: "100.64.0.2"}, underlay4)
	both(t, v6, hop{Dev: "vpn0", Table: "910"}, underlay6)

	t.Log("someone deletes the rule: it comes back")
	n := strings.Count(logs.String(), "rule 910: not fwmark 0x80000/0xff0000 lookup 910")
	ns.IP(t, "rule", "del", "pref", "910")
	waitLog(t, logs, "rule 910: not fwmark 0x80000/0xff0000 lookup 910", n+1)
	both(t, v4, hop{Dev: "vpn0", Table: "910", PrefSrc: "100.64.0.2"}, underlay4)

	t.Log("someone adds a route to the table and changes one: the table is put back")
	ns.IP(t, "route", "add", "203.0.113.0/24", "dev", "eth0", "table", "910")
	ns.IP(t, "route", "replace", "198.51.100.0/24", "dev", "eth0", "table", "910")
	waitRoute(t, ns, logs, "203.0.113.9", "", underlay4)
	both(t, v4, hop{Dev: "vpn0", Table: "910", PrefSrc: "100.64.0.2"}, underlay4)

	t.Log("the VPN link is deleted: everything owned is removed")
	ns.IP(t, "link", "del", "vpn0")
	both(t, v4, underlay4, underlay4)
	both(t, v6, underlay6, underlay6)
	nothingOwned(t)

	t.Log("the VPN link is created again, with another index and address")
	ns.AddTun(t, "vpn0")
	ns.IP(t, "addr", "add", "100.64.0.3/32", "dev", "vpn0")
	ns.IP(t, "link", "set", "vpn0", "up")
	both(t, v4, hop{Dev: "vpn0", Table: "910", PrefSrc: "100.64.0.3"}, underlay4)
	both(t, v6, hop{Dev: "vpn0", Table: "910"}, underlay6)
}

// TestKernelSignal builds vpnbypass, runs it in a namespace and checks that
// SIGTERM ends it with status 0, leaving its routes in place.
func TestKernelSignal(t *testing.T) {
	ns := nltest.NewNetNS(t)
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not in PATH: cannot build the binary")
	}
	bin := filepath.Join(t.TempDir(), "vpnbypass")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ns.AddTun(t, "vpn0")
	ns.IP(t, "link", "set", "vpn0", "up")

	logs := new(syncBuffer)
	cmd := exec.Command("nsenter", "--net="+ns.Path(), bin, "--link", "vpn0", "--prefix", "198.51.100.0/24")
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	})
	waitRoute(t, ns, logs, "198.51.100.7", "", hop{Dev: "vpn0", Table: "910"})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("after SIGTERM: %v\n%s", err, logs)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("still running 5 s after SIGTERM\n%s", logs)
	}
	waitRoute(t, ns, logs, "198.51.100.7", "", hop{Dev: "vpn0", Table: "910"})
}

// start runs vpnbypass in ns with the given flags until the test ends,
// then checks that it stopped with status 0.
func start(t *testing.T, ns *nltest.NetNS, args ...string) *syncBuffer {
	t.Helper()
	logs := new(syncBuffer)
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	go func() { code <- run(ctx, append([]string{"--netns", ns.Path()}, args...), logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("vpnbypass exited with %d\n%s", c, logs)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("vpnbypass did not stop within 5 s of its context ending")
		}
		if t.Failed() {
			t.Logf("vpnbypass's log:\n%s", logs)
		}
	})
	return logs
}

// hop is what `ip -j route get` says, the fields a test checks; Table is
// empty for the main table.
type hop struct {
	Dev     string `json:"dev"`
	Gateway string `json:"gateway"`
	PrefSrc string `json:"prefsrc"`
	Table   string `json:"table"`
}

// matches reports whether got has every field want sets, and the table
// want names (main when empty).
func (want hop) matches(got hop) bool {
	return got.Dev == want.Dev && got.Table == want.Table &&
		(want.Gateway == "" || got.Gateway == want.Gateway) &&
		(want.PrefSrc == "" || got.PrefSrc == want.PrefSrc)
}

func routeGet(ns *nltest.NetNS, addr, mark string) (hop, string) {
	args := []string{"--net=" + ns.Path(), "ip", "-j", "route", "get", addr}
	if mark != "" {
		args = append(args, "mark", mark)
	}
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		return hop{}, strings.TrimSpace(string(out))
	}
	var hs []hop
	if err := json.Unmarshal(out, &hs); err != nil || len(hs) != 1 {
		return hop{}, string(out)
	}
	return hs[0], string(out)
}

// waitRoute polls `ip route get ADDR [mark MARK]` until the kernel's
// answer matches want, or fails the test after a deadline.
func waitRoute(t *testing.T, ns *nltest.NetNS, logs *syncBuffer, addr, mark string, want hop) {
	t.Helper()
	var last string
	if !poll(func() bool {
		var got hop
		got, last = routeGet(ns, addr, mark)
		return want.matches(got)
	}) {
		t.Fatalf("ip route get %s mark %q: want %+v, kernel says %s\nlog:\n%s", addr, mark, want, last, logs)
	}
}

// waitOwned polls until the routes in table and the rules at priority, both
// families, one per line as ip(8) prints them, are want.
func waitOwned(t *testing.T, ns *nltest.NetNS, logs *syncBuffer, table, priority, want string) {
	t.Helper()
	var last string
	if !poll(func() bool {
		last = ownedText(ns, table, priority)
		return last == want
	}) {
		t.Fatalf("table %s and priority %s: want %q, kernel has %q\nlog:\n%s", table, priority, want, last, logs)
	}
}

// ownedText lists the routes in table and the rules at priority, IPv4 first.
func ownedText(ns *nltest.NetNS, table, priority string) string {
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

// waitLog waits until the log holds s at least n times.
func waitLog(t *testing.T, logs *syncBuffer, s string, n int) {
	t.Helper()
	if !poll(func() bool { return strings.Count(logs.String(), s) >= n }) {
		t.Fatalf("log does not hold %q %d times:\n%s", s, n, logs)
	}
}

// poll calls cond until it is true or 10 seconds have passed.
func poll(cond func() bool) bool {
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

// syncBuffer is a bytes.Buffer that the program and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
