//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/marksplit/marksplit/internal/kerneltest"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// The end-to-end tests build the binary once and run it in fresh network
// namespaces holding the seed topology.

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	if os.Getenv(floorEnv) != "" {
		os.Exit(floorRepairer())
	}
	if names := os.Getenv(squatEnv); names != "" {
		os.Exit(squat(names))
	}
	if v := os.Getenv(floodEnv); v != "" {
		os.Exit(flood(v))
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// scaled stretches a time limit on a machine that runs everything
// MARKSPLIT_TIME_SCALE times slower than usual: `make test-kernels` sets
// it in its emulated guests (QEMU's TCG), where starting the agent alone
// takes seconds.
func scaled(d time.Duration) time.Duration {
	if f, err := strconv.ParseFloat(os.Getenv("MARKSPLIT_TIME_SCALE"), 64); err == nil && f > 1 {
		return time.Duration(float64(d) * f)
	}
	return d
}

// agentBinary builds the agent once per test binary, or returns the one
// MARKSPLIT_AGENT names (`make test-kernels` builds it on the host: a
// build inside its emulated guests would take minutes).
func agentBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("MARKSPLIT_AGENT"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "marksplit-agent-test-"); buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "marksplit")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// seed is the seed topology: a node namespace with enp7s0 (veth, MTU
// 1450, 10.0.0.5/16) to a gateway namespace holding 10.0.0.1/16, the
// routes a DHCP client gives (the gateway on link; 10.0.0.0/16 via it,
// lowered to 1355 by the old approach), and cilium_wg0 (tun, MTU 1355, up).
// The address has no prefix route: the DHCP client's /16 via the gateway
// is the node's route to its peers, as on cloud private networks.
type seed struct {
	ns, gw *netwatchtest.NetNS
}

func newSeed(t testing.TB, lowered bool) *seed {
	t.Helper()
	s := &seed{ns: kerneltest.NewNetNS(t), gw: kerneltest.NewNetNS(t)}
	s.ns.LoUp(t)
	s.gw.LoUp(t)
	s.ns.AddVeth(t, "enp7s0", s.gw, "gw0")
	s.gw.IP(t, "link", "set", "gw0", "mtu", "1450")
	s.gw.IP(t, "addr", "add", "10.0.0.1/16", "dev", "gw0")
	s.gw.IP(t, "link", "set", "gw0", "up")
	s.ns.IP(t, "link", "set", "enp7s0", "mtu", "1450")
	s.ns.IP(t, "addr", "add", "10.0.0.5/16", "dev", "enp7s0", "noprefixroute")
	s.ns.IP(t, "link", "set", "enp7s0", "up")
	s.dhcp(t, lowered)
	s.ns.AddTun(t, "cilium_wg0")
	s.ns.IP(t, "link", "set", "cilium_wg0", "mtu", "1355", "up")
	return s
}

// dhcp adds the routes a DHCP client adds; lowered gives the private
// network's route the tunnel MTU, as the old approach left it.
func (s *seed) dhcp(t testing.TB, lowered bool) {
	t.Helper()
	s.ns.IP(t, "route", "add", "10.0.0.1", "dev", "enp7s0", "proto", "dhcp", "scope", "link", "src", "10.0.0.5")
	args := []string{"route", "add", "10.0.0.0/16", "via", "10.0.0.1", "dev", "enp7s0", "proto", "dhcp", "src", "10.0.0.5"}
	if lowered {
		args = append(args, "mtu", "1355")
	}
	s.ns.IP(t, args...)
}

// routeGet is `ip route get ARGS` with its whitespace folded.
func (s *seed) routeGet(t testing.TB, args ...string) string {
	t.Helper()
	return strings.Join(strings.Fields(s.ns.IP(t, append([]string{"route", "get"}, args...)...)), " ")
}

// path is the table and MTU `ip route get` reports for the peer, with or
// without the mark; the MTU is the output link's when the route has none.
func (s *seed) path(t testing.TB, marked bool) (table string, mtu int) {
	t.Helper()
	return s.pathTo(t, "10.0.0.9", marked)
}

// pathTo is path for the address dst.
func (s *seed) pathTo(t testing.TB, dst string, marked bool) (table string, mtu int) {
	t.Helper()
	args := []string{dst}
	if marked {
		args = append(args, "mark", "0xe00")
	}
	f := strings.Fields(s.routeGet(t, args...))
	table = "main"
	for i := 0; i+1 < len(f); i++ {
		switch f[i] {
		case "table":
			table = f[i+1]
		case "mtu":
			mtu, _ = strconv.Atoi(f[i+1])
		case "dev":
			if mtu == 0 {
				mtu = s.linkMTU(t, f[i+1])
			}
		}
	}
	return table, mtu
}

func (s *seed) linkMTU(t testing.TB, name string) int {
	t.Helper()
	var links []struct {
		MTU int `json:"mtu"`
	}
	s.ns.IPJSON(t, &links, "link", "show", "dev", name)
	if len(links) != 1 {
		t.Fatalf("link %s: %d links", name, len(links))
	}
	return links[0].MTU
}

// splitAt is nil when unmarked traffic to the peer takes table 900 at
// tunnelMTU and marked traffic the main table at 1450.
func (s *seed) splitAt(t testing.TB, tunnelMTU int) error {
	t.Helper()
	if table, mtu := s.path(t, false); table != "900" || mtu != tunnelMTU {
		return fmt.Errorf("unmarked: table %s mtu %d, want table 900 mtu %d", table, mtu, tunnelMTU)
	}
	if table, mtu := s.path(t, true); table != "main" || mtu != 1450 {
		return fmt.Errorf("marked: table %s mtu %d, want table main mtu 1450", table, mtu)
	}
	return nil
}

// unsplit is nil when nothing the agent owns is left: no rule at 900 and
// table 900 empty, in both families.
func (s *seed) unsplit(t testing.TB) error {
	t.Helper()
	for _, fam := range []string{"-4", "-6"} {
		if out := s.ns.IP(t, fam, "rule", "show", "pref", "900"); out != "" {
			return fmt.Errorf("ip %s rule show pref 900: %q", fam, out)
		}
		// ip route show table 900 fails once the table is gone.
		for l := range strings.Lines(s.ns.IP(t, fam, "route", "show", "table", "all")) {
			if strings.Contains(l, " table 900 ") {
				return fmt.Errorf("ip %s route show table all: %q", fam, l)
			}
		}
	}
	return nil
}

// hang bounds every wait of these tests: only a hang reaches it, however
// busy the machine.
const hang = 2 * time.Minute

// eventually polls cond until it returns nil. d is how long it should take
// on a quiet machine: a slower wait is logged, not failed (how fast is the
// benchmarks' to measure); the test fails only when cond still does not
// hold after hang (or scaled(d), if longer).
func eventually(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	d = scaled(d)
	start := time.Now()
	deadline := start.Add(max(d, hang))
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			if took := time.Since(start); took > d {
				t.Logf("%s: took %v, more than the %v it takes on a quiet machine", what, took.Round(time.Millisecond), d)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, max(d, hang), err)
		}
		<-tick.C
	}
}

// command runs the agent to completion in the node namespace.
func (s *seed) command(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return s.commandEnv(t, nil, args...)
}

// commandEnv is command with the environment env (nil: the test's).
func (s *seed) commandEnv(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=" + s.ns.Path(), agentBinary(t)}, args...)...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// agentProc is `marksplit run` in the background.
type agentProc struct {
	cmd  *exec.Cmd
	out  *netwatchtest.SyncBuffer
	done chan struct{}
	err  error
}

// start runs `marksplit run ARGS --log-format=json` in the node namespace;
// the test's end kills it if it still runs.
func (s *seed) start(t testing.TB, args ...string) *agentProc {
	t.Helper()
	return s.startBin(t, agentBinary(t), args...)
}

// startBin is start with the agent binary bin.
func (s *seed) startBin(t testing.TB, bin string, args ...string) *agentProc {
	t.Helper()
	return s.startBinEnv(t, bin, nil, args...)
}

// startBinEnv is startBin with the environment env (nil: the test's).
func (s *seed) startBinEnv(t testing.TB, bin string, env []string, args ...string) *agentProc {
	t.Helper()
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--health-socket") }) {
		// Each agent its own: the default is one path for the whole host.
		args = append(args, "--health-socket="+filepath.Join(t.TempDir(), "health.sock"))
	}
	args = append(append([]string{"--net=" + s.ns.Path(), bin, "run"}, args...), "--log-format=json")
	a := &agentProc{cmd: exec.Command("nsenter", args...), out: new(netwatchtest.SyncBuffer), done: make(chan struct{})}
	a.cmd.Env = env
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			if t.Failed() {
				// Where it was: SIGQUIT has the Go runtime print every
				// goroutine's stack to the log before it exits (a hang
				// the log alone does not explain: /readyz never 200).
				a.cmd.Process.Signal(syscall.SIGQUIT)
				select {
				case <-a.done:
				case <-time.After(10 * time.Second):
				}
			}
			a.cmd.Process.Kill()
			<-a.done
		}
		if t.Failed() {
			t.Logf("agent output:\n%s", a.out)
		}
	})
	return a
}

// stop sends sig and waits at most 5 s for the exit.
func (a *agentProc) stop(t testing.TB, sig os.Signal) (exitCode int, took time.Duration) {
	t.Helper()
	start := time.Now()
	if err := a.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	timer := time.NewTimer(2 * time.Minute)
	defer timer.Stop()
	select {
	case <-a.done:
	case <-timer.C:
		t.Fatalf("the agent did not exit within 2 min of %v", sig)
	}
	return a.cmd.ProcessState.ExitCode(), time.Since(start)
}

// messages returns the msg of every JSON log line, and fails the test on
// a line that is not JSON.
func (a *agentProc) messages(t *testing.T) []string {
	t.Helper()
	var msgs []string
	sc := bufio.NewScanner(strings.NewReader(a.out.String()))
	for sc.Scan() {
		var l struct {
			Msg string `json:"msg"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("log line is not JSON: %q", sc.Text())
		}
		msgs = append(msgs, l.Msg)
	}
	return msgs
}

// changes returns the messages that are change lines.
func (a *agentProc) changes(t *testing.T) []string {
	t.Helper()
	var cs []string
	for _, m := range a.messages(t) {
		if changeLine.MatchString(m) {
			cs = append(cs, m)
		}
	}
	return cs
}

var changeLine = regexp.MustCompile(`^(table \d+: |rule \d+( \(inet6\))?: |\S+ route |node encryption: )`)

func (a *agentProc) logged(t *testing.T, msg string) error {
	t.Helper()
	select {
	case <-a.done:
		return fmt.Errorf("the agent exited: %v", a.err)
	default:
	}
	for _, m := range a.messages(t) {
		if m == msg {
			return nil
		}
	}
	return fmt.Errorf("the agent has not logged %q", msg)
}

var seedArgs = []string{"--prefix=10.0.0.0/16", "--encryption=on"}

// The seed converges in one `once` pass: the exact `ip route get` answers
// and one line per change; a second `once` finds nothing to do and says
// nothing.
func TestKernelOnceSeed(t *testing.T) {
	s := newSeed(t, true)
	if got, want := s.routeGet(t, "10.0.0.9"), "10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 uid 0 cache mtu 1355"; got != want {
		t.Fatalf("before: ip route get 10.0.0.9:\n got %q\nwant %q", got, want)
	}
	stdout, stderr, code := s.command(t, append([]string{"once"}, seedArgs...)...)
	if code != 0 {
		t.Fatalf("once: exit %d\n%s%s", code, stdout, stderr)
	}
	if diff := cmp.Diff(strings.Join(seedLines, "\n")+"\n", stdout); diff != "" {
		t.Errorf("once's output (-want +got):\n%s", diff)
	}
	if stderr != "" {
		t.Errorf("once's stderr: %q", stderr)
	}
	for _, tt := range []struct{ args, want string }{
		{"10.0.0.9", "10.0.0.9 via 10.0.0.1 dev enp7s0 table 900 src 10.0.0.5 uid 0 cache mtu 1355"},
		// The repaired main route has no MTU of its own: the link's.
		{"10.0.0.9 mark 0xe00", "10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mark 0xe00 uid 0 cache"},
	} {
		if got := s.routeGet(t, strings.Fields(tt.args)...); got != tt.want {
			t.Errorf("ip route get %s:\n got %q\nwant %q", tt.args, got, tt.want)
		}
	}
	if got, want := strings.TrimSpace(s.ns.IP(t, "rule", "show", "pref", "900")), "900:\tnot from all fwmark 0xe00/0xf00 lookup 900 proto 109"; got != want {
		t.Errorf("ip rule show pref 900: %q, want %q", got, want)
	}

	stdout, stderr, code = s.command(t, append([]string{"once"}, seedArgs...)...)
	if code != 0 || stdout != "" || stderr != "" {
		t.Errorf("second once: exit %d, stdout %q, stderr %q; want 0 and nothing", code, stdout, stderr)
	}
	// plan agrees: nothing to do.
	if stdout, stderr, code = s.command(t, append([]string{"plan"}, seedArgs...)...); code != 0 || stdout != "" {
		t.Errorf("plan after once: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// plan prints the operations and changes nothing.
func TestKernelPlan(t *testing.T) {
	s := newSeed(t, true)
	// IPv4 and IPv6's main table: IPv6's local table gains the link-local
	// address when duplicate address detection ends, on its own schedule.
	routes := func() string {
		return s.ns.IP(t, "-4", "route", "show", "table", "all") + s.ns.IP(t, "-6", "route", "show", "table", "main")
	}
	before := routes()
	stdout, stderr, code := s.command(t, append([]string{"plan"}, seedArgs...)...)
	if code != 0 {
		t.Fatalf("plan: exit %d\n%s%s", code, stdout, stderr)
	}
	want := "route-replace table 900: 10.0.0.1 dev enp7s0 scope link src 10.0.0.5 mtu 1355\n" +
		"route-replace table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355\n" +
		"rule-add      rule 900: not fwmark 0xe00/0xf00 lookup 900\n" +
		"route-repair  dhcp route 10.0.0.0/16 mtu 1450 (was 1355)\n"
	if diff := cmp.Diff(want, stdout); diff != "" {
		t.Errorf("plan's output (-want +got):\n%s", diff)
	}
	if after := routes(); after != before {
		t.Errorf("plan changed the routes:\nbefore %s\nafter %s", before, after)
	}
	if err := s.unsplit(t); err != nil {
		t.Error(err)
	}
}

// run converges, restores a rule someone deleted, rebuilds the table
// after an interface bounce, follows the tunnel MTU, and removes
// everything when the tunnel link goes; then exits 0 on SIGTERM.
func TestKernelRunFollowsTheKernel(t *testing.T) {
	s := newSeed(t, true)
	a := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })
	eventually(t, time.Second, "seed lines", func() error { return a.logged(t, "dhcp route 10.0.0.0/16 mtu 1450 (was 1355)") })

	// Someone deletes the rule.
	s.ns.IP(t, "rule", "del", "pref", "900")
	eventually(t, time.Second, "the rule restored", func() error { return s.splitAt(t, 1355) })

	// The interface bounces: the kernel flushes its IPv4 routes, the table's
	// copies with them; the DHCP client adds its routes again.
	s.ns.IP(t, "link", "set", "enp7s0", "down")
	eventually(t, time.Second, "nothing left to split", func() error { return s.unsplit(t) })
	s.ns.IP(t, "link", "set", "enp7s0", "up")
	s.dhcp(t, false)
	eventually(t, time.Second, "split again after the bounce", func() error { return s.splitAt(t, 1355) })

	// Cilium's upgrade changes the tunnel MTU.
	s.ns.IP(t, "link", "set", "cilium_wg0", "mtu", "1420")
	eventually(t, time.Second, "the table at the new tunnel MTU", func() error { return s.splitAt(t, 1420) })

	// The tunnel link goes.
	s.ns.IP(t, "link", "del", "cilium_wg0")
	eventually(t, time.Second, "everything removed without the tunnel link", func() error { return s.unsplit(t) })

	if code, took := a.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d after SIGTERM (%v), want 0", code, took)
	}
	want := []string{
		"table 900: 10.0.0.1 dev enp7s0 scope link src 10.0.0.5 mtu 1355",
		"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
		"rule 900: not fwmark 0xe00/0xf00 lookup 900",
		"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)",
		// restored
		"rule 900: not fwmark 0xe00/0xf00 lookup 900",
		// link down: the kernel dropped the table's routes; the rule goes
		"rule 900: removed not fwmark 0xe00/0xf00 lookup 900 proto 109",
		// the DHCP client's routes are back
		"table 900: 10.0.0.1 dev enp7s0 scope link src 10.0.0.5 mtu 1355",
		"rule 900: not fwmark 0xe00/0xf00 lookup 900",
		"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
		// the tunnel MTU
		"table 900: 10.0.0.1 dev enp7s0 scope link src 10.0.0.5 mtu 1420 (was 1355)",
		"table 900: 10.0.0.0/16 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1420 (was 1355)",
		// the tunnel link gone
		"rule 900: removed not fwmark 0xe00/0xf00 lookup 900 proto 109",
		"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto 109 src 10.0.0.5 mtu 1420",
		"table 900: removed 10.0.0.1 dev enp7s0 proto 109 scope link src 10.0.0.5 mtu 1420",
	}
	got := a.changes(t)
	// The DHCP client adds its two routes one after the other: the table
	// may be rebuilt in one pass or two, so the order of that group varies.
	if len(got) == len(want) {
		sortRange(got, 6, 9)
		sortRange(want, 6, 9)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("change lines (-want +got):\n%s", diff)
	}
}

func sortRange(s []string, from, to int) {
	sub := append([]string(nil), s[from:to]...)
	for i := range sub {
		for j := i + 1; j < len(sub); j++ {
			if sub[j] < sub[i] {
				sub[i], sub[j] = sub[j], sub[i]
			}
		}
	}
	copy(s[from:to], sub)
}

// SIGTERM and SIGINT: exit 0 within 5 s, the split left in place.
func TestKernelSignalLeavesRoutes(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			s := newSeed(t, true)
			a := s.start(t, append(seedArgs, "--metrics-addr=127.0.0.1:9184")...)
			eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })
			// IPv4 only: IPv6 link-local routes come and go with
			// duplicate address detection on their own schedule.
			tables := s.ns.IP(t, "-4", "route", "show", "table", "all")
			rules := s.ns.IP(t, "rule")
			code, took := a.stop(t, sig)
			if code != 0 {
				t.Errorf("exit %d after %v, want 0", code, sig)
			}
			t.Logf("exited %v after %v", code, took)
			if err := s.splitAt(t, 1355); err != nil {
				t.Errorf("after %v: %v", sig, err)
			}
			if got := s.ns.IP(t, "-4", "route", "show", "table", "all"); got != tables {
				t.Errorf("routes changed on %v:\nbefore %s\nafter %s", sig, tables, got)
			}
			if got := s.ns.IP(t, "rule"); got != rules {
				t.Errorf("rules changed on %v:\nbefore %s\nafter %s", sig, rules, got)
			}
		})
	}
}

// --encryption=off converges to nothing, saying so.
func TestKernelEncryptionOff(t *testing.T) {
	s := newSeed(t, true)
	if stdout, stderr, code := s.command(t, append([]string{"once"}, seedArgs...)...); code != 0 {
		t.Fatalf("once: exit %d\n%s%s", code, stdout, stderr)
	}
	a := s.start(t, "--prefix=10.0.0.0/16", "--encryption=off", "--metrics-addr=")
	eventually(t, 5*time.Second, "nothing owned left", func() error { return s.unsplit(t) })
	eventually(t, time.Second, "the removal logged", func() error {
		return a.logged(t, "table 900: removed 10.0.0.1 dev enp7s0 proto 109 scope link src 10.0.0.5 mtu 1355")
	})
	if code, _ := a.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("exit %d", code)
	}
	want := []string{
		"node encryption: no",
		"rule 900: removed not fwmark 0xe00/0xf00 lookup 900 proto 109",
		"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto 109 src 10.0.0.5 mtu 1355",
		"table 900: removed 10.0.0.1 dev enp7s0 proto 109 scope link src 10.0.0.5 mtu 1355",
	}
	if diff := cmp.Diff(want, a.changes(t)); diff != "" {
		t.Errorf("change lines (-want +got):\n%s", diff)
	}
	// The repaired main route stays repaired (no MTU of its own: the
	// link's); nothing else changed.
	if got := s.routeGet(t, "10.0.0.9"); got != "10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 uid 0 cache" {
		t.Errorf("ip route get 10.0.0.9: %q", got)
	}
}

// cleanup removes what the agent owns and nothing else: afterwards every
// table and rule is as before the agent ran.
func TestKernelCleanupLeavesNoTrace(t *testing.T) {
	s := newSeed(t, false)
	// Foreign objects the agent must not touch.
	s.ns.IP(t, "rule", "add", "fwmark", "0x1", "lookup", "901", "pref", "901")
	s.ns.IP(t, "route", "add", "10.9.0.0/16", "via", "10.0.0.1", "dev", "enp7s0", "table", "901")
	s.ns.IP(t, "-6", "route", "add", "fd00::/64", "dev", "enp7s0", "table", "902")
	snapshot := func() string {
		var b strings.Builder
		// IPv6: the foreign table only, since link-local routes come and
		// go with duplicate address detection on their own schedule.
		for _, args := range [][]string{{"-4", "route", "show", "table", "all"}, {"-6", "route", "show", "table", "902"},
			{"-4", "rule"}, {"-6", "rule"}} {
			fmt.Fprintf(&b, "ip %s\n%s", strings.Join(args, " "), s.ns.IP(t, args...))
		}
		return b.String()
	}
	before := snapshot()
	if stdout, stderr, code := s.command(t, append([]string{"once"}, seedArgs...)...); code != 0 || stdout == "" {
		t.Fatalf("once: exit %d\n%s%s", code, stdout, stderr)
	}
	if err := s.splitAt(t, 1355); err != nil {
		t.Fatal(err)
	}
	// cleanup needs no mode: the default auto without a node name works.
	stdout, stderr, code := s.command(t, "cleanup", "--prefix=10.0.0.0/16")
	if code != 0 {
		t.Fatalf("cleanup: exit %d\n%s%s", code, stdout, stderr)
	}
	want := "rule 900: removed not fwmark 0xe00/0xf00 lookup 900 proto 109\n" +
		"table 900: removed 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto 109 src 10.0.0.5 mtu 1355\n" +
		"table 900: removed 10.0.0.1 dev enp7s0 proto 109 scope link src 10.0.0.5 mtu 1355\n"
	if diff := cmp.Diff(want, stdout); diff != "" {
		t.Errorf("cleanup's output (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, snapshot()); diff != "" {
		t.Errorf("after cleanup (-before +after):\n%s", diff)
	}
	if stdout, stderr, code = s.command(t, "cleanup", "--prefix=10.0.0.0/16"); code != 0 || stdout != "" || stderr != "" {
		t.Errorf("second cleanup: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// verify passes on a split node and fails on an unsplit one.
func TestKernelVerify(t *testing.T) {
	s := newSeed(t, true)
	stdout, stderr, code := s.command(t, "verify", "--peer=10.0.0.9", "--prefix=10.0.0.0/16")
	if code != 1 || !strings.Contains(stdout, "FAIL: unmarked traffic uses table main, not 900") {
		t.Errorf("verify on an unsplit node: exit %d, want 1\n%s%s", code, stdout, stderr)
	}
	if stdout, stderr, code := s.command(t, append([]string{"once"}, seedArgs...)...); code != 0 {
		t.Fatalf("once: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = s.command(t, "verify", "--peer=10.0.0.9", "--prefix=10.0.0.0/16")
	want := "unmarked:  10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 table 900 mtu 1355\n" +
		"mark 0xe00: 10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 table main mtu 1450 (the link's)\n" +
		"ok: unmarked traffic to 10.0.0.9 uses table 900 at cilium_wg0's MTU 1355; marked traffic does not use table 900 (MTU 1450)\n"
	if code != 0 || stdout != want {
		if strings.Contains(stdout, "unmarked traffic uses table main") && strings.Contains(s.routeGet(t, "10.0.0.9"), "table 900") {
			t.Errorf("netwatch.RouteGet reports table main where `ip route get` says table 900: " +
				"its RTM_GETROUTE request lacks RTM_F_LOOKUP_TABLE, so the kernel answers RT_TABLE_MAIN")
		}
		t.Errorf("verify on a split node: exit %d, want 0\n got %q\nwant %q\nstderr %s", code, stdout, want, stderr)
	}
}

// Bad flags exit 2 with one clear line, before touching anything.
func TestBinaryBadFlags(t *testing.T) {
	bin := agentBinary(t)
	for _, args := range [][]string{
		{"run"},
		{"once", "--prefix=10.0.0.0/16", "--table=254"},
		{"--prefix=10.0.0.0/16", "--priority=32767"},
		{"plan", "--prefix=bogus"},
		{"verify", "--prefix=10.0.0.0/16"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%q: %v, want exit 2", args, err)
		}
		if lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "marksplit: ") {
			t.Errorf("%q: stderr %q, want one line", args, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("%q: stdout %q", args, stdout.String())
		}
	}
}

// /metrics, /healthz and /readyz answer in the node's namespace; the
// fragmentation counters are the namespace's own.
func TestKernelMetrics(t *testing.T) {
	s := newSeed(t, true)
	// A datagram larger than the lowered route's MTU, without DF: the
	// namespace fragments it, so FragOKs is 1.
	err := s.ns.Do(func() error {
		c, err := net.Dial("udp4", "10.0.0.9:9")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(make([]byte, 2000))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	a := s.start(t, append(seedArgs, "--metrics-addr=127.0.0.1:9184")...)
	get := nsGetter(s)
	readyWithin(t, get, 5*time.Second)
	if code, body, err := get("/healthz"); err != nil || code != 200 {
		t.Errorf("/healthz: %d %q %v", code, body, err)
	}
	code, body, err := get("/metrics")
	if err != nil || code != 200 {
		t.Fatalf("/metrics: %d %v", code, err)
	}
	for _, want := range []string{
		"marksplit_host_ip_frag_oks_total 1\n",
		"marksplit_host_ip_frag_creates_total 2\n",
		`marksplit_changes_total{kind="route-replace"} 2`,
		`marksplit_changes_total{kind="rule-add"} 1`,
		`marksplit_changes_total{kind="route-repair"} 1`,
		`marksplit_encryption_mode{mode="on"} 1`,
		`marksplit_resyncs_total{cause="initial"} 1`,
		`marksplit_events_total{kind="rule"}`,
		`marksplit_passes_total{result="changed"} 1`,
		"marksplit_ready 1\n",
		"marksplit_split_active 1\n",
		"marksplit_tunnel_link_present 1\n",
		`marksplit_table_routes{family="4"} 2`,
		`marksplit_failed_operations_total{kind="rule-add"} 0`,
		"marksplit_last_successful_pass_timestamp_seconds 1.",
		"marksplit_watcher_synced 1",
		"marksplit_watcher_mapped_bytes 0\n", // a few routes: all on the heap
		`marksplit_build_info{version="dev"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
	a.stop(t, syscall.SIGTERM)
}

// nsGetter GETs a path of the agent's metrics listener (127.0.0.1:9184)
// inside s's node namespace.
func nsGetter(s *seed) func(path string) (code int, body string, err error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := s.ns.Do(func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	return func(path string) (int, string, error) {
		resp, err := client.Get("http://127.0.0.1:9184" + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
}

// readyWithin waits until /readyz answers 200, failing after d.
func readyWithin(t testing.TB, get func(string) (int, string, error), d time.Duration) {
	t.Helper()
	eventually(t, d, "/readyz", func() error {
		code, body, err := get("/readyz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("%d %s", code, body)
		}
		return err
	})
}
