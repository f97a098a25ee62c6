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

// TestKernelUplinkPin runs uplinkpin in a fresh network namespace with two
// uplinks, changes the world under it and asks the kernel, after each
// change, where a packet goes without the mark and with it.
func TestKernelUplinkPin(t *testing.T) {
	ns := nltest.NewNetNS(t)
	ns.LoUp(t)
	// Two uplinks, each a veth whose peer stays unaddressed in the same
	// namespace: taking the peer down takes the uplink's carrier away.
	for _, l := range []struct{ name, v4, v6 string }{
		{"eth0", "198.51.100.2/24", "2001:db8:1::2/64"},
		{"eth1", "192.0.2.2/24", "2001:db8:2::2/64"},
	} {
		ns.AddVeth(t, l.name, nil, l.name+"p")
		ns.IP(t, "link", "set", l.name+"p", "up")
		ns.IP(t, "link", "set", l.name, "up")
		ns.IP(t, "addr", "add", l.v4, "dev", l.name)
		ns.IP(t, "addr", "add", l.v6, "dev", l.name, "nodad")
	}
	// eth0 is the primary uplink; eth1's default routes, as its DHCP
	// client and router advertisements would install them, come second.
	ns.IP(t, "route", "add", "default", "via", "198.51.100.1", "dev", "eth0", "metric", "100")
	ns.IP(t, "-6", "route", "add", "default", "via", "2001:db8:1::1", "dev", "eth0", "metric", "100")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1", "dev", "eth1", "metric", "200", "proto", "dhcp")
	ns.IP(t, "-6", "route", "add", "default", "via", "2001:db8:2::1", "dev", "eth1", "metric", "200", "proto", "ra")

	logs := start(t, ns, "--uplink", "eth1", "--mark", "0x100/0xff00")

	const v4, v6 = "203.0.113.9", "2001:db8:ff::9"
	primary4 := hop{Dev: "eth0", Gateway: "198.51.100.1"}
	primary6 := hop{Dev: "eth0", Gateway: "2001:db8:1::1"}
	pinned := func(gw string) hop { return hop{Dev: "eth1", Gateway: gw, Table: "920"} }
	both := func(t *testing.T, addr string, unmarked, marked hop) {
		t.Helper()
		waitRoute(t, ns, logs, addr, "", unmarked)
		waitRoute(t, ns, logs, addr, "0x100", marked)
		waitRoute(t, ns, logs, addr, "0x10101", marked) // bits outside the mask do not matter
		waitRoute(t, ns, logs, addr, "0x200", unmarked) // another mark under the mask
	}
	nothingOwned := func(t *testing.T) {
		t.Helper()
		waitOwned(t, ns, logs, "920", "920", "")
	}

	t.Log("both uplinks up: marked packets leave by eth1")
	both(t, v4, primary4, pinned("192.0.2.1"))
	both(t, v6, primary6, pinned("2001:db8:2::1"))

	t.Log("a DHCP renew changes eth1's gateway")
	ns.IP(t, "route", "replace", "default", "via", "192.0.2.254", "dev", "eth1", "metric", "200", "proto", "dhcp")
	ns.IP(t, "-6", "route", "replace", "default", "via", "2001:db8:2::fe", "dev", "eth1", "metric", "200", "proto", "ra")
	both(t, v4, primary4, pinned("192.0.2.254"))
	both(t, v6, primary6, pinned("2001:db8:2::fe"))
	waitLog(t, logs, "table 920: 0.0.0.0/0 via 192.0.2.254 dev eth1 (was 0.0.0.0/0 via 192.0.2.1 dev eth1)", 1)

	t.Log("eth1 loses carrier: everything owned is removed")
	ns.IP(t, "link", "set", "eth1p", "down")
	both(t, v4, primary4, primary4)
	nothingOwned(t)

	t.Log("eth1's carrier returns, with its routes")
	ns.IP(t, "link", "set", "eth1p", "up")
	both(t, v4, primary4, pinned("192.0.2.254"))
	both(t, v6, primary6, pinned("2001:db8:2::fe"))

	t.Log("eth1 goes down: the kernel flushes its routes, uplinkpin its own")
	ns.IP(t, "link", "set", "eth1", "down")
	both(t, v4, primary4, primary4)
	both(t, v6, primary6, primary6)
	nothingOwned(t)

	t.Log("eth1 comes up and its DHCP client installs the default route again")
	ns.IP(t, "link", "set", "eth1", "up")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1", "dev", "eth1", "metric", "200", "proto", "dhcp")
	both(t, v4, primary4, pinned("192.0.2.1"))
	both(t, v6, primary6, primary6) // its IPv6 address went with the down: no IPv6 default route

	t.Log("someone deletes the rule: it comes back")
	n := strings.Count(logs.String(), "rule 920: fwmark 0x100/0xff00 lookup 920")
	ns.IP(t, "rule", "del", "pref", "920")
	waitLog(t, logs, "rule 920: fwmark 0x100/0xff00 lookup 920", n+1)
	both(t, v4, primary4, pinned("192.0.2.1"))

	t.Log("someone adds a route to the table: it is removed")
	ns.IP(t, "route", "add", "10.9.0.0/16", "via", "198.51.100.1", "dev", "eth0", "table", "920")
	waitRoute(t, ns, logs, "10.9.0.1", "0x100", pinned("192.0.2.1"))
	waitOwned(t, ns, logs, "920", "920", "-4 route default via 192.0.2.1 dev eth1 table 920 proto 242\n"+
		"-4 rule 920:\tfrom all fwmark 0x100/0xff00 lookup 920 proto 242")

	t.Log("eth1's lease is lost: its default route goes, and so does the pin")
	ns.IP(t, "route", "del", "default", "via", "192.0.2.1", "dev", "eth1")
	both(t, v4, primary4, primary4)
	nothingOwned(t)

	t.Log("a new lease, then eth1 is deleted")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1", "dev", "eth1", "metric", "200", "proto", "dhcp")
	both(t, v4, primary4, pinned("192.0.2.1"))
	ns.IP(t, "link", "del", "eth1")
	both(t, v4, primary4, primary4)
	nothingOwned(t)
}

// TestKernelSignal builds uplinkpin, runs it in a namespace and checks that
// SIGTERM ends it with status 0, leaving its routes in place.
func TestKernelSignal(t *testing.T) {
	ns := nltest.NewNetNS(t)
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not in PATH: cannot build the binary")
	}
	bin := filepath.Join(t.TempDir(), "uplinkpin")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ns.AddVeth(t, "eth1", nil, "eth1p")
	ns.IP(t, "link", "set", "eth1p", "up")
	ns.IP(t, "link", "set", "eth1", "up")
	ns.IP(t, "addr", "add", "192.0.2.2/24", "dev", "eth1")
	ns.IP(t, "route", "add", "default", "via", "192.0.2.1")

	logs := new(syncBuffer)
	cmd := exec.Command("nsenter", "--net="+ns.Path(), bin, "--uplink", "eth1", "--mark", "0x100")
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
	want := hop{Dev: "eth1", Gateway: "192.0.2.1", Table: "920"}
	waitRoute(t, ns, logs, "203.0.113.9", "0x100", want)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("after SIGINT: %v\n%s", err, logs)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("still running 5 s after SIGINT\n%s", logs)
	}
	waitRoute(t, ns, logs, "203.0.113.9", "0x100", want)
}

// start runs uplinkpin in ns with the given flags until the test ends,
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
				t.Errorf("uplinkpin exited with %d\n%s", c, logs)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("uplinkpin did not stop within 5 s of its context ending")
		}
		if t.Failed() {
			t.Logf("uplinkpin's log:\n%s", logs)
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
