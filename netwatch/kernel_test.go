//go:build linux

package netwatch

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// Real-kernel tests: each runs in a fresh network namespace and compares the
// cache with what ip(8) reports, an oracle independent of netwatch's
// decoder.

// kernelTestsEnv turns a skipped real-kernel test into a failed one.
const kernelTestsEnv = "MARKSPLIT_KERNEL_TESTS"

// skipKernel skips the test, or fails it when kernelTestsEnv=1.
func skipKernel(tb testing.TB, reason string) {
	tb.Helper()
	if os.Getenv(kernelTestsEnv) == "1" {
		tb.Fatalf("real-kernel test cannot run (%s) but %s=1", reason, kernelTestsEnv)
	}
	tb.Skipf("skipping real-kernel test: %s (set %s=1 to fail instead)", reason, kernelTestsEnv)
}

// testNS is a named network namespace (ip netns), deleted when the test
// ends.
type testNS struct {
	name string
	fd   int // for kernelDialer{netns: fd}
}

// newTestNS creates a network namespace with lo up.
func newTestNS(tb testing.TB) *testNS {
	tb.Helper()
	if os.Geteuid() != 0 {
		skipKernel(tb, "not running as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skipKernel(tb, "ip(8) not found in PATH")
	}
	name := fmt.Sprintf("mstest-%d-%08x", os.Getpid(), rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		skipKernel(tb, fmt.Sprintf("ip netns add: %v: %s", err, bytes.TrimSpace(out)))
	}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("open network namespace %s: %v", name, err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	ns := &testNS{name: name, fd: fd}
	ns.ip(tb, "link", "set", "lo", "up")
	return ns
}

func (ns *testNS) dialer() kernelDialer { return kernelDialer{netns: ns.fd} }

// ip runs ip(8) in the namespace and returns its output, failing the test
// on error.
func (ns *testNS) ip(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := ns.run(args...)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

func (ns *testNS) run(args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"-n", ns.name}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), nil
}

// ipJSONs runs several ip -j commands at once and decodes their outputs
// into vs.
func (ns *testNS) ipJSONs(tb testing.TB, vs []any, args [][]string) {
	tb.Helper()
	type result struct {
		out string
		err error
	}
	res := make([]chan result, len(args))
	for i, a := range args {
		res[i] = make(chan result, 1)
		go func() {
			out, err := ns.run(append([]string{"-j"}, a...)...)
			res[i] <- result{out, err}
		}()
	}
	for i, c := range res {
		r := <-c
		if r.err != nil {
			tb.Fatal(r.err)
		}
		if strings.TrimSpace(r.out) == "" {
			r.out = "[]"
		}
		if err := json.Unmarshal([]byte(r.out), vs[i]); err != nil {
			tb.Fatalf("decode ip -j %s: %v\n%s", strings.Join(args[i], " "), err, r.out)
		}
	}
}

// batch runs commands with ip -force -batch and returns how many failed.
// Failures are expected: random changes aim at objects that may be gone.
// ip takes no options on batch lines: lines that start with "-6 " run after
// the others, in an ip -6 -batch of their own (ip rule needs it).
func (ns *testNS) batch(tb testing.TB, cmds []string) int {
	tb.Helper()
	var v4, v6 []string
	for _, c := range cmds {
		if c6, ok := strings.CutPrefix(c, "-6 "); ok {
			v6 = append(v6, c6)
		} else {
			v4 = append(v4, c)
		}
	}
	n := ns.batchArgs(tb, nil, v4)
	if len(v6) > 0 {
		n += ns.batchArgs(tb, []string{"-6"}, v6)
	}
	return n
}

func (ns *testNS) batchArgs(tb testing.TB, args, cmds []string) int {
	tb.Helper()
	cmd := exec.Command("ip", append([]string{"-n", ns.name, "-force", "-batch", "-"}, args...)...)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	failed := strings.Count(stderr.String(), "Command failed")
	if os.Getenv("MARKSPLIT_BATCH_LOG") != "" {
		tb.Logf("ip -batch:\n%s\n%s", strings.Join(cmds, "\n"), stderr.Bytes())
	}
	if err != nil && failed == 0 {
		tb.Fatalf("ip -batch: %v: %s", err, stderr.Bytes())
	}
	return failed
}

func (ns *testNS) ipJSON(tb testing.TB, v any, args ...string) {
	tb.Helper()
	out := ns.ip(tb, append([]string{"-j"}, args...)...)
	if strings.TrimSpace(out) == "" {
		out = "[]"
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		tb.Fatalf("decode ip -j %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// linkIndex returns the index of the link called name.
func (ns *testNS) linkIndex(tb testing.TB, name string) uint32 {
	tb.Helper()
	var ls []struct {
		Index uint32 `json:"ifindex"`
	}
	ns.ipJSON(tb, &ls, "link", "show", "dev", name)
	if len(ls) != 1 {
		tb.Fatalf("ip link show dev %s: %d links", name, len(ls))
	}
	return ls[0].Index
}

// kernelState is what both the oracle and the cache are reduced to before
// they are compared. Addresses are strings so that cmp can print them.
type kernelState struct {
	Links  []kLink
	Addrs  []kAddr
	Routes []kRoute // sorted: routes sharing a key compare as a multiset
	Rules  []kRule  // kernel order, IPv4 then IPv6
}

type kLink struct {
	Index     uint32
	Name      string
	MTU       uint32
	Up        bool
	LowerUp   bool
	OperState string
	Kind      string
	Master    uint32
}

type kAddr struct {
	Index  uint32
	Prefix string
	Peer   string
	Scope  uint8
	Flags  uint32 // the IFA_F_* bits ip prints, see addrFlagNames
	Label  string
}

type kRoute struct {
	Family   uint8
	Table    uint32
	Dst      string
	From     string
	Gateway  string
	Dev      string
	PrefSrc  string
	MTU      uint32
	Metric   uint32
	Protocol uint8
	Scope    uint8
	Type     uint8
	Flags    uint32
	NextHops []kHop
	NHID     uint32
}

type kHop struct {
	Gateway string
	Dev     string
	Weight  uint16
	Flags   uint32
}

type kRule struct {
	Family   uint8
	Priority uint32
	Table    uint32
	Action   uint8
	Invert   bool
	Mark     uint32
	Mask     uint32
	Protocol uint8
	Src      string
	Dst      string
	IIF      string
	OIF      string
	Goto     uint32
}

// The address flags ip prints by name; "permanent" is printed as its
// absence ("dynamic") and is not compared.
var ipAddrFlags = map[string]uint32{
	"secondary": 0x01, "temporary": 0x01, "nodad": 0x02, "optimistic": 0x04,
	"dadfailed": 0x08, "home": 0x10, "deprecated": 0x20, "tentative": 0x40,
	"mngtmpaddr": 0x100, "noprefixroute": 0x200, "autojoin": 0x400, "stable-privacy": 0x800,
}

// ip prints only these flags for IPv4 addresses.
const addrFlags4 = 0x01 | 0x200 | 0x400

// The rtm_flags / rtnh_flags bits ip prints by name.
var routeFlagNames = map[string]uint32{
	"dead": 0x1, "pervasive": 0x2, "onlink": 0x4, "offload": 0x8,
	"linkdown": 0x10, "unresolved": 0x20, "trap": 0x40,
}

func jsonUint(tb testing.TB, v any) uint64 {
	tb.Helper()
	switch x := v.(type) {
	case float64:
		return uint64(x)
	case string:
		n, err := strconv.ParseUint(x, 0, 64)
		if err != nil {
			tb.Fatalf("ip -j: number %q: %v", x, err)
		}
		return n
	case nil:
		return 0
	}
	tb.Fatalf("ip -j: unexpected number %#v", v)
	return 0
}

func jsonStr(v any) string {
	s, _ := v.(string)
	return s
}

// ipPrefix parses ip's "10.0.0.0/8", "10.0.0.1" (a host) or "default".
func ipPrefix(tb testing.TB, s string, f Family) string {
	tb.Helper()
	if s == "default" {
		if f == IPv4 {
			return "0.0.0.0/0"
		}
		return "::/0"
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			tb.Fatalf("ip -j: address %q: %v", s, err)
		}
		return netip.PrefixFrom(a, a.BitLen()).String()
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		tb.Fatalf("ip -j: prefix %q: %v", s, err)
	}
	return p.Masked().String()
}

func ipFlags(tb testing.TB, v any) uint32 {
	tb.Helper()
	var f uint32
	l, _ := v.([]any)
	for _, n := range l {
		bit, ok := routeFlagNames[jsonStr(n)]
		if !ok {
			tb.Fatalf("ip -j: unknown route flag %v", n)
		}
		f |= bit
	}
	return f
}

// oracle reads the namespace's state with ip -j: numeric (-N), detailed
// (-d), every table, both families.
func (ns *testNS) oracle(tb testing.TB) kernelState {
	tb.Helper()
	var s kernelState

	var links []map[string]any
	var addrLinks []struct {
		Index    uint32           `json:"ifindex"`
		AddrInfo []map[string]any `json:"addr_info"`
	}
	var routes, rules [2][]map[string]any
	ns.ipJSONs(tb, []any{&links, &addrLinks, &routes[0], &routes[1], &rules[0], &rules[1]}, [][]string{
		{"-d", "-N", "link", "show"},
		{"-N", "addr", "show"},
		{"-4", "-d", "-N", "route", "show", "table", "all"},
		{"-6", "-d", "-N", "route", "show", "table", "all"},
		{"-4", "-d", "-N", "rule", "show"},
		{"-6", "-d", "-N", "rule", "show"},
	})
	index := make(map[string]uint32)
	for _, l := range links {
		index[jsonStr(l["ifname"])] = uint32(jsonUint(tb, l["ifindex"]))
	}
	for _, l := range links {
		kl := kLink{
			Index:     uint32(jsonUint(tb, l["ifindex"])),
			Name:      jsonStr(l["ifname"]),
			MTU:       uint32(jsonUint(tb, l["mtu"])),
			OperState: jsonStr(l["operstate"]),
		}
		flags, _ := l["flags"].([]any)
		kl.Up = slices.Contains(flags, any("UP"))
		kl.LowerUp = slices.Contains(flags, any("LOWER_UP"))
		if li, ok := l["linkinfo"].(map[string]any); ok {
			kl.Kind = jsonStr(li["info_kind"])
		}
		if m, ok := l["master"]; ok {
			kl.Master = index[jsonStr(m)]
		}
		s.Links = append(s.Links, kl)
	}
	slices.SortFunc(s.Links, func(a, b kLink) int { return int(a.Index) - int(b.Index) })

	for _, l := range addrLinks {
		for _, a := range l.AddrInfo {
			f := IPv4
			if jsonStr(a["family"]) == "inet6" {
				f = IPv6
			}
			local := netip.MustParseAddr(jsonStr(a["local"]))
			ka := kAddr{
				Index:  l.Index,
				Prefix: netip.PrefixFrom(local, int(jsonUint(tb, a["prefixlen"]))).String(),
				Scope:  uint8(jsonUint(tb, a["scope"])),
				Label:  jsonStr(a["label"]),
			}
			if p := jsonStr(a["address"]); p != "" && p != jsonStr(a["local"]) {
				ka.Peer = p
			}
			for name, bit := range ipAddrFlags {
				if a[name] == true {
					if name == "temporary" && f == IPv4 || name == "secondary" && f == IPv6 {
						continue
					}
					ka.Flags |= bit
				}
			}
			s.Addrs = append(s.Addrs, ka)
		}
	}
	sortAddrs(s.Addrs)

	for i, f := range []Family{IPv4, IPv6} {
		for _, r := range routes[i] {
			kr := kRoute{
				Family:   uint8(f),
				Table:    uint32(jsonUint(tb, r["table"])),
				Dst:      ipPrefix(tb, jsonStr(r["dst"]), f),
				Gateway:  jsonStr(r["gateway"]),
				Dev:      jsonStr(r["dev"]),
				PrefSrc:  jsonStr(r["prefsrc"]),
				Metric:   uint32(jsonUint(tb, r["metric"])),
				Protocol: uint8(jsonUint(tb, r["protocol"])),
				Scope:    uint8(jsonUint(tb, r["scope"])),
				Type:     uint8(jsonUint(tb, r["type"])),
				Flags:    ipFlags(tb, r["flags"]),
				NHID:     uint32(jsonUint(tb, r["nhid"])),
			}
			if kr.Table == 0 {
				kr.Table = uint32(TableMain)
			}
			if from := jsonStr(r["from"]); from != "" {
				kr.From = ipPrefix(tb, from, f)
			}
			if via, ok := r["via"].(map[string]any); ok {
				kr.Gateway = jsonStr(via["host"])
			}
			if ms, ok := r["metrics"].([]any); ok {
				for _, m := range ms {
					if mtu, ok := m.(map[string]any)["mtu"]; ok {
						kr.MTU = uint32(jsonUint(tb, mtu))
					}
				}
			}
			if nhs, ok := r["nexthops"].([]any); ok {
				kr.NextHops = []kHop{}
				for _, n := range nhs {
					nh := n.(map[string]any)
					h := kHop{
						Gateway: jsonStr(nh["gateway"]),
						Dev:     jsonStr(nh["dev"]),
						Weight:  uint16(jsonUint(tb, nh["weight"])),
						Flags:   ipFlags(tb, nh["flags"]),
					}
					if via, ok := nh["via"].(map[string]any); ok {
						h.Gateway = jsonStr(via["host"])
					}
					kr.NextHops = append(kr.NextHops, h)
				}
			}
			s.Routes = append(s.Routes, kr)
		}
	}
	sortRoutes(s.Routes)

	for i, f := range []Family{IPv4, IPv6} {
		for _, r := range rules[i] {
			kr := kRule{
				Family:   uint8(f),
				Priority: uint32(jsonUint(tb, r["priority"])),
				Table:    uint32(jsonUint(tb, r["table"])),
				Action:   uint8(ActionToTable),
				Protocol: uint8(jsonUint(tb, r["protocol"])),
				IIF:      jsonStr(r["iif"]),
				OIF:      jsonStr(r["oif"]),
				Goto:     uint32(jsonUint(tb, r["goto"])),
			}
			_, kr.Invert = r["not"]
			if _, ok := r["nop"]; ok {
				kr.Action = uint8(actionNop)
			}
			if _, ok := r["goto"]; ok {
				kr.Action = uint8(actionGoto)
			}
			if a, ok := r["action"]; ok {
				kr.Action = uint8(jsonUint(tb, a))
			}
			if m, ok := r["fwmark"]; ok {
				kr.Mark, kr.Mask = uint32(jsonUint(tb, m)), 0xffffffff
				if mask, ok := r["fwmask"]; ok {
					kr.Mask = uint32(jsonUint(tb, mask))
				}
			}
			for _, sel := range []struct {
				addr, bits string
				to         *string
			}{{"src", "srclen", &kr.Src}, {"dst", "dstlen", &kr.Dst}} {
				a := jsonStr(r[sel.addr])
				if a == "" || a == "all" {
					continue
				}
				addr := netip.MustParseAddr(a)
				bits := addr.BitLen()
				if l, ok := r[sel.bits]; ok {
					bits = int(jsonUint(tb, l))
				}
				*sel.to = netip.PrefixFrom(addr, bits).Masked().String()
			}
			s.Rules = append(s.Rules, kr)
		}
	}
	return s
}

func sortAddrs(as []kAddr) {
	slices.SortFunc(as, func(a, b kAddr) int {
		if a.Index != b.Index {
			return int(a.Index) - int(b.Index)
		}
		return cmp.Or(strings.Compare(a.Prefix, b.Prefix), strings.Compare(a.Peer, b.Peer))
	})
}

// sortRoutes sorts routes by all their fields, formatting each once.
func sortRoutes(rs []kRoute) {
	type keyed struct {
		key string
		r   kRoute
	}
	ks := make([]keyed, len(rs))
	for i, r := range rs {
		ks[i] = keyed{fmt.Sprint(r), r}
	}
	slices.SortFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	for i := range ks {
		rs[i] = ks[i].r
	}
}

// stateOf reduces a cache snapshot to what the oracle can see.
func stateOf(snap Snapshot) kernelState {
	var s kernelState
	names := make(map[uint32]string)
	for _, l := range snap.Links {
		names[l.Index] = l.Name
		s.Links = append(s.Links, kLink{
			Index: l.Index, Name: l.Name, MTU: l.MTU, Up: l.Flags&LinkUp != 0, LowerUp: l.Flags&LinkLowerUp != 0,
			OperState: l.OperState.String(), Kind: l.Kind, Master: l.Master,
		})
	}
	str := func(v interface {
		IsValid() bool
		String() string
	}) string {
		if !v.IsValid() {
			return ""
		}
		return v.String()
	}
	for _, a := range snap.Addrs {
		ka := kAddr{Index: a.Index, Prefix: a.Prefix.String(), Peer: str(a.Peer), Scope: uint8(a.Scope), Label: a.Label}
		if FamilyOf(a.Prefix.Addr()) == IPv4 {
			ka.Flags = uint32(a.Flags & addrFlags4)
		} else {
			ka.Flags = uint32(a.Flags &^ addrPermanent)
			ka.Label = "" // ip prints labels of IPv4 addresses only
		}
		s.Addrs = append(s.Addrs, ka)
	}
	sortAddrs(s.Addrs)
	for _, r := range snap.Routes {
		kr := kRoute{
			Family: uint8(r.Family), Table: uint32(r.Table), Dst: r.Dst.String(), From: str(r.Src),
			Gateway: str(r.Gateway), Dev: names[r.Index], PrefSrc: str(r.PrefSrc), MTU: r.MTU,
			Metric: r.Metric, Protocol: uint8(r.Protocol), Scope: uint8(r.Scope), Type: uint8(r.Type),
			Flags: uint32(r.Flags), NHID: r.NHID,
		}
		if r.NextHops != nil {
			kr.NextHops = []kHop{}
			for _, nh := range r.NextHops {
				kr.NextHops = append(kr.NextHops, kHop{Gateway: str(nh.Gateway), Dev: names[nh.Index], Weight: nh.Weight, Flags: uint32(nh.Flags)})
			}
		}
		s.Routes = append(s.Routes, kr)
	}
	sortRoutes(s.Routes)
	for _, r := range snap.Rules {
		s.Rules = append(s.Rules, kRule{
			Family: uint8(r.Family), Priority: r.Priority, Table: uint32(r.Table), Action: uint8(r.Action),
			Invert: r.Invert, Mark: uint32(r.Mark), Mask: uint32(r.Mask), Protocol: uint8(r.Protocol),
			Src: str(r.Src), Dst: str(r.Dst), IIF: r.IIF, OIF: r.OIF, Goto: r.Goto,
		})
	}
	return s
}

// startWatcher runs a watcher until the test ends. Its cleanup checks that
// Run returns on cancellation (a minute: only a hang) and that no goroutine is
// left behind.
func startWatcher(tb testing.TB, opts Options) *Watcher {
	tb.Helper()
	ignore := goleak.IgnoreCurrent()
	tb.Cleanup(func() { goleak.VerifyNone(tb, ignore) })
	w := New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("Run: %v", err)
			}
		case <-time.After(time.Minute): // only a hang: a busy machine under -race takes its time
			tb.Errorf("Run did not return within a minute of cancellation")
			<-done
		}
	})
	return w
}

// waitSynced waits for the watcher's first sync.
func waitSynced(tb testing.TB, w *Watcher, timeout time.Duration) {
	tb.Helper()
	deadline := time.After(timeout)
	for ch := w.nextChange(); !w.synced(); ch = w.nextChange() {
		select {
		case <-ch:
		case <-deadline:
			tb.Fatalf("watcher not synced after %v; stats %+v", timeout, w.Stats())
		}
	}
}

// waitConverged polls until the cache equals the oracle, and fails the
// test with the last difference at the deadline. IPv6 duplicate address
// detection changes addresses and routes a second or two after a link comes
// up, so a snapshot can be momentarily stale on either side.
func waitConverged(tb testing.TB, w *Watcher, ns *testNS, timeout time.Duration, context string) kernelState {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	diff := "cache never synced"
	start := time.Now()
	for {
		if w.synced() {
			want := ns.oracle(tb)
			var got kernelState
			w.Read(func(v View) { got = stateOf(v.snapshot()) })
			if diff = gocmp.Diff(want, got); diff == "" {
				if os.Getenv("MARKSPLIT_CONVERGE_LOG") != "" {
					tb.Logf("%s: converged in %v", context, time.Since(start))
				}
				return want
			}
		}
		select {
		case <-deadline.C:
			tb.Fatalf("%s: cache did not converge with the kernel within %v; stats %+v\n(-ip +cache):\n%s",
				context, timeout, w.Stats(), diff)
		case <-tick.C:
		}
	}
}

// routeWriter changes routes through its own rtnetlink socket, many per
// write, and collects the acknowledgements in bulk.
type routeWriter struct {
	c *netlink.Conn
}

func dialRouteWriter(tb testing.TB, ns *testNS) *routeWriter {
	tb.Helper()
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: ns.fd})
	if err != nil {
		tb.Fatalf("dial rtnetlink: %v", err)
	}
	tb.Cleanup(func() { c.Close() })
	for _, o := range []netlink.ConnOption{netlink.CapAcknowledge, netlink.ExtendedAcknowledge} {
		if err := c.SetOption(o, true); err != nil {
			tb.Fatalf("set netlink option: %v", err)
		}
	}
	if err := c.SetReadBuffer(16 << 20); err != nil {
		tb.Fatalf("set read buffer: %v", err)
	}
	if err := c.SetWriteBuffer(4 << 20); err != nil {
		tb.Fatalf("set write buffer: %v", err)
	}
	return &routeWriter{c: c}
}

// writeBatch is how many requests go into one sendmsg.
const writeBatch = 1024

// do sends one request per route, writeBatch per write, and returns the
// number of requests the kernel refused and the first refusal.
func (rw *routeWriter) do(typ uint16, flags netlink.HeaderFlags, rs []Route) (int, error) {
	var failed int
	var first error
	msgs := make([]netlink.Message, 0, writeBatch)
	for len(rs) > 0 {
		n := min(len(rs), writeBatch)
		msgs = msgs[:0]
		for _, r := range rs[:n] {
			if typ == unix.RTM_DELROUTE {
				r.Scope = scopeNowhere
			}
			b, err := encodeRoute(r)
			if err != nil {
				return failed, err
			}
			msgs = append(msgs, netlink.Message{
				Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request | netlink.Acknowledge | flags},
				Data:   b,
			})
		}
		if _, err := rw.c.SendMessages(msgs); err != nil {
			return failed, err
		}
		for got := 0; got < n; {
			ms, err := rw.c.Receive()
			if err != nil {
				// The kernel's answer to one request is a bare errno;
				// the socket's own failures are system call errors.
				var se *os.SyscallError
				if errors.As(err, &se) || !errors.As(err, new(unix.Errno)) {
					return failed, err
				}
				failed++
				if first == nil {
					first = err
				}
				got++
				continue
			}
			got += len(ms)
		}
		rs = rs[n:]
	}
	return failed, first
}

// add adds routes that must not exist yet.
func (rw *routeWriter) add(tb testing.TB, rs []Route) {
	tb.Helper()
	if n, err := rw.do(unix.RTM_NEWROUTE, netlink.Create|netlink.Excl, rs); n > 0 || err != nil {
		tb.Fatalf("add %d routes: %d failed: %v", len(rs), n, err)
	}
}

// del deletes routes that must exist.
func (rw *routeWriter) del(tb testing.TB, rs []Route) {
	tb.Helper()
	if n, err := rw.do(unix.RTM_DELROUTE, 0, rs); n > 0 || err != nil {
		tb.Fatalf("delete %d routes: %d failed: %v", len(rs), n, err)
	}
}

// gwRoutes returns n /24 routes of table t via gw on link index, numbered
// from first (0 is 11.0.0.0/24): the shape of a full BGP table.
func gwRoutes(t Table, first, n int, gw netip.Addr, index uint32) []Route {
	rs := make([]Route, n)
	for i := range rs {
		k := first + i
		rs[i] = Route{
			Family: IPv4, Table: t, Protocol: protoBGP, Type: RouteUnicast, Gateway: gw, Index: index,
			Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(11 + k>>16), byte(k >> 8), byte(k), 0}), 24),
		}
	}
	return rs
}

// underlay gives ns a veth pair whose first end is up with 10.200.0.1/24,
// dualUnderlay is a namespace with the underlay and fd00::1/64 on u0
// besides, and a synced watcher of it.
func dualUnderlay(t *testing.T) (*testNS, *Watcher) {
	t.Helper()
	ns := newTestNS(t)
	underlay(t, ns)
	ns.batch(t, []string{"addr add fd00::1/64 dev u0 nodad"})
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)
	return ns, w
}

// and returns that end's index and a gateway on it.
func underlay(tb testing.TB, ns *testNS) (uint32, netip.Addr) {
	tb.Helper()
	if n := ns.batch(tb, []string{
		"link add u0 type veth peer name u1",
		"link set u1 up",
		"link set u0 up",
		"addr add 10.200.0.1/24 dev u0",
	}); n > 0 {
		tb.Fatalf("set up the underlay: %d commands failed", n)
	}
	return ns.linkIndex(tb, "u0"), netip.MustParseAddr("10.200.0.2")
}

func seed(tb testing.TB) uint64 {
	tb.Helper()
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("MARKSPLIT_SEED"); v != "" {
		var err error
		if s, err = strconv.ParseUint(v, 0, 64); err != nil {
			tb.Fatalf("MARKSPLIT_SEED: %v", err)
		}
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("random seed %d: rerun with MARKSPLIT_SEED=%d", s, s)
		}
	})
	return s
}

func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	return n
}

// TestKernelRandomChanges makes 6000 random changes (about 4000 that the
// kernel accepts) to links, addresses, routes, nexthop objects and rules,
// some while the watcher's initial sync and requested resyncs run, and
// checks that the cache converges to what ip reports, every 1000 changes.
func TestKernelRandomChanges(t *testing.T) {
	ns := newTestNS(t)
	rng := rand.New(rand.NewPCG(seed(t), 0))
	changes := envInt(t, "MARKSPLIT_CHANGES", 6000)
	const chunk = 100

	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	g := &chaos{rng: rng}
	g.refresh(t, ns)
	var ok, failed int
	for i := 0; i*chunk < changes; i++ {
		cmds := g.commands(chunk)
		n := ns.batch(t, cmds)
		ok, failed = ok+len(cmds)-n, failed+n
		switch {
		case i%10 == 9:
			g.st = waitConverged(t, w, ns, 15*time.Second, fmt.Sprintf("after %d changes", (i+1)*chunk))
			continue
		case rng.IntN(8) == 0:
			// A resync while the next chunk runs: events queue during the
			// dump and are applied after it.
			w.Resync()
		}
		g.refresh(t, ns)
	}
	waitConverged(t, w, ns, 15*time.Second, "at the end")
	st := w.Stats()
	t.Logf("%d changes made, %d refused by the kernel; stats %+v", ok, failed, st)
	if ok < changes/2 {
		t.Errorf("only %d of %d random changes succeeded; the generator needs fixing", ok, ok+failed)
	}
}

// chaos generates ip -batch commands against the last known state, so that
// most of them succeed.
type chaos struct {
	rng *rand.Rand
	st  kernelState
	// atStart are the links at the start of the chunk being generated:
	// commands that make ip exit when a link is missing go first.
	atStart map[string]bool
}

func (g *chaos) refresh(tb testing.TB, ns *testNS) { g.st = ns.oracle(tb) }

// The links the generator plays with: veth pairs va<i>/vb<i>, tun devices
// (one called like Cilium's WireGuard link) and bridges. Each link has its
// own subnets: 10.200.<id>.0/24 and fd20:<id>::/64, gateway .254 / ::fe.
var chaosLinks = []struct {
	name, peer, kind string
	id               int
}{
	{"va0", "vb0", "veth", 1}, {"va1", "vb1", "veth", 2}, {"va2", "vb2", "veth", 3}, {"va3", "vb3", "veth", 4},
	{"vb0", "va0", "veth", 5}, {"vb1", "va1", "veth", 6}, {"vb2", "va2", "veth", 7}, {"vb3", "va3", "veth", 8},
	{"tn0", "", "tun", 9}, {"cilium_wg0", "", "tun", 10}, {"br0", "", "bridge", 11}, {"br1", "", "bridge", 12},
}

var chaosTables = []string{"main", "100", "1000", "70000"}

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

func (g *chaos) exists(name string) bool {
	return slices.ContainsFunc(g.st.Links, func(l kLink) bool { return l.Name == name })
}

// someLink returns an existing chaos link, or a random one.
func (g *chaos) someLink() (name string, id int) {
	var have []int
	for i, l := range chaosLinks {
		if g.exists(l.name) {
			have = append(have, i)
		}
	}
	i := g.rng.IntN(len(chaosLinks))
	if len(have) > 0 && g.rng.IntN(10) > 0 {
		i = pick(g.rng, have...)
	}
	return chaosLinks[i].name, chaosLinks[i].id
}

// linkWithSubnet returns an up chaos link with an address in its own
// subnet of family f, where the .254 / ::fe gateway is reachable.
func (g *chaos) linkWithSubnet(f Family) (l struct {
	name, peer, kind string
	id               int
}, ok bool) {
	var ls []int
	for i, cl := range chaosLinks {
		sub := fmt.Sprintf("10.200.%d.", cl.id)
		if f == IPv6 {
			sub = fmt.Sprintf("fd20:%d::", cl.id)
		}
		for _, kl := range g.st.Links {
			if kl.Name != cl.name || !kl.Up {
				continue
			}
			for _, a := range g.st.Addrs {
				if a.Index == kl.Index && strings.HasPrefix(a.Prefix, sub) && !strings.HasSuffix(a.Prefix, "/32") && !strings.HasSuffix(a.Prefix, "/128") {
					ls = append(ls, i)
				}
			}
		}
	}
	if len(ls) == 0 {
		return l, false
	}
	return chaosLinks[pick(g.rng, ls...)], true
}

// forget removes the element at i from *xs: the generator's view of what
// a command in this chunk deleted.
func forget[T any](xs *[]T, i int) { *xs = slices.Delete(slices.Clone(*xs), i, i+1) }

func (g *chaos) someAddr(f Family) string {
	var as []string
	for _, a := range g.st.Addrs {
		p := netip.MustParsePrefix(a.Prefix)
		if FamilyOf(p.Addr()) == f && !p.Addr().IsLoopback() {
			as = append(as, p.Addr().String())
		}
	}
	if len(as) == 0 || g.rng.IntN(10) == 0 {
		if f == IPv4 {
			return "10.200.1.1"
		}
		return "fd20:1::1"
	}
	return pick(g.rng, as...)
}

func (g *chaos) commands(n int) []string {
	cmds := make([]string, 0, n)
	g.atStart = make(map[string]bool)
	for _, l := range g.st.Links {
		g.atStart[l.Name] = true
	}
	for len(cmds) < n {
		switch r := g.rng.IntN(100); {
		case r < 5, r < 10 && len(g.st.Links) < 8:
			cmds = append(cmds, g.linkAdd())
		case r < 7:
			cmds = append(cmds, g.linkDel())
		case r < 17:
			name, _ := g.someLink()
			cmds = append(cmds, "link set "+name+" "+pick(g.rng, "up", "up", "down"))
		case r < 19:
			name, _ := g.someLink()
			cmds = append(cmds, "link set "+name+" mtu "+pick(g.rng, "1280", "1400", "1450", "1500", "9000"))
		case r < 21:
			// ip exits on a master that does not exist: only at the start of
			// a chunk, with a bridge known to exist.
			name, _ := g.someLink()
			master := pick(g.rng, "br0", "br1")
			switch {
			case g.rng.IntN(3) == 0:
				cmds = append(cmds, "link set "+name+" nomaster")
			case g.atStart[master]:
				cmds = slices.Insert(cmds, 0, "link set "+name+" master "+master)
			}
		case r < 33:
			cmds = append(cmds, g.addrAdd())
		case r < 40:
			cmds = append(cmds, g.addrDel())
		case r < 80, r < 83:
			cmd, atStart := g.route()
			if r >= 80 {
				cmd, atStart = g.nexthopObject()
			}
			if atStart {
				cmds = slices.Insert(cmds, 0, cmd)
			} else if cmd != "" {
				cmds = append(cmds, cmd)
			}
		default:
			cmds = append(cmds, g.rule())
		}
	}
	return cmds
}

func (g *chaos) linkAdd() string {
	var missing []int
	for i, l := range chaosLinks {
		if !g.exists(l.name) {
			missing = append(missing, i)
		}
	}
	i := g.rng.IntN(len(chaosLinks))
	if len(missing) > 0 && g.rng.IntN(10) > 0 {
		i = pick(g.rng, missing...)
	}
	l := chaosLinks[i]
	g.st.Links = append(g.st.Links, kLink{Name: l.name}, kLink{Name: l.peer})
	switch l.kind {
	case "veth":
		return "link add " + l.name + " type veth peer name " + l.peer
	case "tun":
		return "tuntap add mode tun name " + l.name
	}
	return "link add " + l.name + " type bridge"
}

func (g *chaos) linkDel() string {
	name, _ := g.someLink()
	g.st.Links = slices.DeleteFunc(slices.Clone(g.st.Links), func(l kLink) bool { return l.Name == name })
	if strings.HasPrefix(name, "tn") || name == "cilium_wg0" {
		return "tuntap del mode tun name " + name
	}
	return "link del " + name
}

func (g *chaos) addrAdd() string {
	name, id := g.someLink()
	host := pick(g.rng, 1, 2, 3, 10)
	if g.rng.IntN(2) == 0 {
		if g.rng.IntN(10) == 0 {
			return fmt.Sprintf("addr add 10.200.%d.%d peer 10.201.%d.%d/32 dev %s", id, host, id, host, name)
		}
		return fmt.Sprintf("addr add 10.200.%d.%d/%s dev %s", id, host, pick(g.rng, "24", "24", "24", "16", "32"), name)
	}
	return fmt.Sprintf("addr add fd20:%d::%d/%s dev %s%s", id, host, pick(g.rng, "64", "64", "128"), name,
		pick(g.rng, "", "", "", " nodad", " noprefixroute"))
}

func (g *chaos) addrDel() string {
	var as []int
	for i, a := range g.st.Addrs {
		if a.Index != 1 {
			as = append(as, i)
		}
	}
	if len(as) == 0 {
		name, id := g.someLink()
		return fmt.Sprintf("addr del 10.200.%d.1/24 dev %s", id, name)
	}
	ai := pick(g.rng, as...)
	a := g.st.Addrs[ai]
	forget(&g.st.Addrs, ai)
	name := ""
	for _, l := range g.st.Links {
		if l.Index == a.Index {
			name = l.Name
		}
	}
	if name == "" {
		// The address's link went earlier in this chunk: a delete of an
		// address that is not there, on a link that is.
		name, _ = g.someLink()
	}
	if a.Peer != "" {
		return fmt.Sprintf("addr del %s peer %s dev %s", netip.MustParsePrefix(a.Prefix).Addr(), a.Peer, name)
	}
	return "addr del " + a.Prefix + " dev " + name
}

func (g *chaos) dst(f Family) string {
	i := g.rng.IntN(16)
	if f == IPv4 {
		return pick(g.rng, fmt.Sprintf("10.100.%d.0/24", i), fmt.Sprintf("10.101.0.%d/32", i%8), "0.0.0.0/0")
	}
	return pick(g.rng, fmt.Sprintf("fd10:%d::/64", i), fmt.Sprintf("fd11::%d/128", i%8), "::/0")
}

// nexthop returns "via GW dev LINK" or "dev LINK" on a chaos link.
func (g *chaos) nexthop(f Family) string {
	name, id := g.someLink()
	if l, ok := g.linkWithSubnet(f); ok && g.rng.IntN(4) > 0 {
		name, id = l.name, l.id
	}
	switch g.rng.IntN(6) {
	case 0:
		return "dev " + name
	case 1:
		if f == IPv4 {
			return fmt.Sprintf("via 10.222.%d.1 dev %s onlink", id, name)
		}
		return "via fe80::" + strconv.Itoa(id) + " dev " + name
	case 2:
		if f == IPv4 && g.rng.IntN(3) == 0 {
			return "via inet6 fe80::" + strconv.Itoa(id) + " dev " + name
		}
	}
	if f == IPv4 {
		return fmt.Sprintf("via 10.200.%d.254 dev %s", id, name)
	}
	return fmt.Sprintf("via fd20:%d::fe dev %s", id, name)
}

// route returns a route command, and whether it must run at the start of
// the chunk because ip exits when one of its links does not exist.
func (g *chaos) route() (string, bool) {
	f := pick(g.rng, IPv4, IPv4, IPv6)
	if g.rng.IntN(3) == 0 && len(g.st.Routes) > 0 {
		return g.routeDel()
	}
	verb := pick(g.rng, "add", "add", "add", "replace", "replace", "append", "prepend", "change")
	var b strings.Builder
	b.WriteString("route " + verb + " ")
	multipath := ""
	switch t := g.rng.IntN(20); {
	case t < 2:
		b.WriteString(pick(g.rng, "blackhole ", "unreachable ", "prohibit ", "throw "))
		b.WriteString(g.dst(f))
	case t < 4 && verb != "append" && verb != "prepend":
		// A nexthop object (ip nexthop), single or a group.
		b.WriteString(g.dst(f) + " nhid " + pick(g.rng, "1", "2", "3", "4", "11", "12"))
	case t < 6 && f == IPv4:
		// Paths come last on ip's command line, and ip exits when their
		// link does not exist.
		b.WriteString(g.dst(f))
		multipath = " nexthop " + g.nexthop(f) + " weight " + pick(g.rng, "1", "2", "5") + " nexthop " + g.nexthop(f)
		for _, w := range strings.Fields(multipath) {
			if strings.HasPrefix(w, "v") || strings.HasPrefix(w, "t") || strings.HasPrefix(w, "br") || strings.HasPrefix(w, "cil") {
				if !g.atStart[w] {
					multipath = " " + g.nexthop(f)
					break
				}
			}
		}
	default:
		b.WriteString(g.dst(f) + " " + g.nexthop(f))
	}
	b.WriteString(" table " + pick(g.rng, chaosTables...))
	if g.rng.IntN(3) == 0 {
		b.WriteString(" metric " + pick(g.rng, "10", "100"))
	}
	if g.rng.IntN(3) == 0 {
		b.WriteString(" mtu " + pick(g.rng, "1300", "1355", "1400"))
	}
	if g.rng.IntN(5) == 0 {
		b.WriteString(" src " + g.someAddr(f))
	}
	if g.rng.IntN(3) == 0 {
		b.WriteString(" proto " + pick(g.rng, "static", "77", "bgp"))
	}
	return b.String() + multipath, strings.Contains(multipath, "nexthop")
}

// nexthopObject returns an ip nexthop command, and whether it must run at
// the start of the chunk (ip exits when its link does not exist). Objects
// 1-4 are single next hops (IPv4, IPv6 or blackhole), 11 and 12 groups.
func (g *chaos) nexthopObject() (string, bool) {
	id := pick(g.rng, 1, 2, 3, 4)
	switch g.rng.IntN(5) {
	case 0, 1:
		verb := pick(g.rng, "add", "replace")
		f := IPv4
		if id == 3 {
			f = IPv6
		}
		l, ok := g.linkWithSubnet(f)
		if id == 4 || !ok || !g.atStart[l.name] {
			return fmt.Sprintf("nexthop %s id %d blackhole", verb, id), false
		}
		if f == IPv6 {
			return fmt.Sprintf("nexthop %s id %d via fd20:%d::fe dev %s", verb, id, l.id, l.name), true
		}
		return fmt.Sprintf("nexthop %s id %d via 10.200.%d.254 dev %s", verb, id, l.id, l.name), true
	case 2:
		return fmt.Sprintf("nexthop %s id %d group %s", pick(g.rng, "add", "replace"), pick(g.rng, 11, 12),
			pick(g.rng, "1/2", "1,3/2", "2")), false
	}
	return fmt.Sprintf("nexthop del id %d", pick(g.rng, 1, 2, 3, 4, 11, 12)), false
}

func (g *chaos) routeDel() (string, bool) {
	var rs []int
	for i, r := range g.st.Routes {
		if r.Table != uint32(TableLocal) && r.Protocol != uint8(ProtoKernel) {
			rs = append(rs, i)
		}
	}
	if len(rs) == 0 {
		return "route del " + g.dst(IPv4) + " table 100", false
	}
	ri := pick(g.rng, rs...)
	r := g.st.Routes[ri]
	forget(&g.st.Routes, ri)
	var b strings.Builder
	b.WriteString("route del ")
	if r.Type != uint8(RouteUnicast) {
		b.WriteString(RouteType(r.Type).String() + " ")
	}
	b.WriteString(r.Dst + " table " + strconv.Itoa(int(r.Table)))
	if r.From != "" {
		b.WriteString(" from " + r.From)
	}
	if r.Metric != 0 {
		b.WriteString(" metric " + strconv.Itoa(int(r.Metric)))
	}
	switch {
	case len(r.NextHops) > 0 && g.rng.IntN(2) == 0:
		// One path of a multipath route (IPv6 removes just that path).
		h := pick(g.rng, r.NextHops...)
		if h.Gateway != "" {
			b.WriteString(" via " + h.Gateway)
		}
		if h.Dev != "" {
			b.WriteString(" dev " + h.Dev)
		}
	case r.Gateway != "" && g.rng.IntN(2) == 0:
		if strings.Contains(r.Gateway, ":") && r.Family == uint8(IPv4) {
			b.WriteString(" via inet6 " + r.Gateway)
		} else {
			b.WriteString(" via " + r.Gateway)
		}
		if r.Dev != "" {
			b.WriteString(" dev " + r.Dev)
		}
	}
	if g.rng.IntN(4) == 0 && r.PrefSrc != "" {
		b.WriteString(" src " + r.PrefSrc)
	}
	return b.String(), false
}

func (g *chaos) rule() string {
	f := pick(g.rng, IPv4, IPv6)
	if g.rng.IntN(3) == 0 {
		return g.ruleDel(f)
	}
	var b strings.Builder
	if f == IPv6 {
		b.WriteString("-6 ")
	}
	b.WriteString("rule add")
	if g.rng.IntN(5) == 0 {
		if f == IPv6 {
			b.WriteString(pick(g.rng, " from fd20::/16", " to fd10::/16"))
		} else {
			b.WriteString(pick(g.rng, " from 10.200.0.0/16", " to 10.100.0.0/16"))
		}
	}
	if g.rng.IntN(4) == 0 {
		b.WriteString(" not")
	}
	switch g.rng.IntN(5) {
	case 0:
		b.WriteString(" fwmark 0xe00/0xf00")
	case 1:
		b.WriteString(" fwmark 0x1")
	case 2:
		b.WriteString(" fwmark 0x10/0xff")
	}
	if g.rng.IntN(10) == 0 {
		name, _ := g.someLink()
		b.WriteString(pick(g.rng, " iif ", " oif ") + name)
	}
	switch a := g.rng.IntN(20); {
	case a < 2:
		b.WriteString(pick(g.rng, " blackhole", " unreachable", " prohibit"))
	case a < 3:
		b.WriteString(" nop")
	case a < 4:
		b.WriteString(" goto 2000")
	default:
		b.WriteString(" lookup " + pick(g.rng, chaosTables...))
	}
	if g.rng.IntN(6) > 0 {
		b.WriteString(" pref " + pick(g.rng, "100", "200", "900", "1000", "2000"))
	}
	if g.rng.IntN(3) == 0 {
		b.WriteString(" proto " + pick(g.rng, "77", "kernel", "static"))
	}
	return b.String()
}

func (g *chaos) ruleDel(f Family) string {
	var rs []int
	for i, r := range g.st.Rules {
		if r.Family == uint8(f) && r.Priority != 0 && r.Priority < 32766 {
			rs = append(rs, i)
		}
	}
	fam := ""
	if f == IPv6 {
		fam = "-6 "
	}
	if len(rs) == 0 {
		return fam + "rule del pref 900"
	}
	ri := pick(g.rng, rs...)
	r := g.st.Rules[ri]
	forget(&g.st.Rules, ri)
	if g.rng.IntN(2) == 0 {
		// By priority alone: the kernel removes the first rule there.
		return fam + "rule del pref " + strconv.Itoa(int(r.Priority))
	}
	var b strings.Builder
	b.WriteString(fam + "rule del")
	if r.Src != "" {
		b.WriteString(" from " + r.Src)
	}
	if r.Dst != "" {
		b.WriteString(" to " + r.Dst)
	}
	if r.Invert {
		b.WriteString(" not")
	}
	if r.Mark != 0 || r.Mask != 0 {
		fmt.Fprintf(&b, " fwmark 0x%x/0x%x", r.Mark, r.Mask)
	}
	if r.IIF != "" {
		b.WriteString(" iif " + r.IIF)
	}
	if r.OIF != "" {
		b.WriteString(" oif " + r.OIF)
	}
	switch RuleAction(r.Action) {
	case ActionToTable:
		b.WriteString(" lookup " + strconv.Itoa(int(r.Table)))
	case actionGoto:
		b.WriteString(" goto " + strconv.Itoa(int(r.Goto)))
	case actionNop:
		b.WriteString(" nop")
	default:
		b.WriteString(" " + RuleAction(r.Action).String())
	}
	fmt.Fprintf(&b, " pref %d proto %d", r.Priority, r.Protocol)
	return b.String()
}

// hookDialer runs beforeDump once, after the watcher's multicast socket
// joined its groups and before its first dump: a change made there is both
// in the dump and queued as an event that is applied after it.
type hookDialer struct {
	kernelDialer
	beforeDump func()
}

func (d *hookDialer) Dial(cfg rtnl.DialConfig) (rtnl.Conn, error) {
	c, err := d.kernelDialer.Dial(cfg)
	if err == nil && len(cfg.Groups) == 0 && d.beforeDump != nil {
		d.beforeDump()
		d.beforeDump = nil
	}
	return c, err
}

// TestKernelQueuedEvents checks the events that the initial dump already
// reflects: applying them again must not change the cache.
func TestKernelQueuedEvents(t *testing.T) {
	for _, tc := range []struct {
		name    string
		changes []string
	}{
		{"rule added", []string{
			"rule add fwmark 0xe00/0xf00 lookup 900 pref 900",
			"-6 rule add not fwmark 0xe00/0xf00 lookup 900 pref 900",
		}},
		{"route added then replaced", []string{
			"route add 10.9.0.0/24 via 10.200.0.2 table 900",
			"route replace 10.9.0.0/24 via 10.200.0.3 table 900",
		}},
		{"route added, deleted, added", []string{
			"route add 10.9.0.0/24 via 10.200.0.2 table 900",
			"route del 10.9.0.0/24 table 900",
			"route add 10.9.0.0/24 via 10.200.0.3 table 900",
			"route prepend 10.9.0.0/24 via 10.200.0.2 table 900",
		}},
		{"IPv6 route added then replaced", []string{
			"route add fd09::/64 dev u0 table 900",
			"route replace fd09::/64 via fe80::1 dev u0 table 900",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := newTestNS(t)
			underlay(t, ns)
			d := &hookDialer{kernelDialer: ns.dialer(), beforeDump: func() {
				if n := ns.batch(t, tc.changes); n > 0 {
					t.Errorf("%d changes failed", n)
				}
			}}
			w := startWatcher(t, Options{NetNS: fakeNetNS(d)})
			waitConverged(t, w, ns, 5*time.Second, "after the initial sync")
		})
	}
}

// TestKernelPeerAddresses: IPv4 allows the same local address and prefix
// length twice on a link when the peers differ.
func TestKernelPeerAddresses(t *testing.T) {
	ns := newTestNS(t)
	ns.batch(t, []string{"tuntap add mode tun name tn0"})
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)
	for _, cmds := range [][]string{
		{"addr add 10.9.0.1/32 dev tn0", "addr add 10.9.0.1 peer 10.9.0.2/32 dev tn0", "addr add 10.9.0.1 peer 10.9.0.3/32 dev tn0"},
		{"addr del 10.9.0.1/32 dev tn0"},
		{"addr del 10.9.0.1 peer 10.9.0.3/32 dev tn0"},
	} {
		if n := ns.batch(t, cmds); n > 0 {
			t.Fatalf("%q: %d failed", cmds, n)
		}
		waitConverged(t, w, ns, 5*time.Second, strings.Join(cmds, "; "))
	}
}

// TestKernelRouteAliases: IPv4 keeps several routes with one key (ip route
// prepend and append), in order; replace changes the first, delete removes
// the first that matches.
func TestKernelRouteAliases(t *testing.T) {
	ns := newTestNS(t)
	underlay(t, ns)
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)
	for _, cmd := range []string{
		"route add 10.9.0.0/24 via 10.200.0.2",
		"route prepend 10.9.0.0/24 via 10.200.0.3",
		"route append 10.9.0.0/24 via 10.200.0.4",
		// The same next hop as a route there, other metrics: a new route.
		"route prepend 10.9.0.0/24 via 10.200.0.2 mtu 1300",
		"route replace 10.9.0.0/24 via 10.200.0.5",
		"route del 10.9.0.0/24 via 10.200.0.2",
		"route append 10.9.0.0/24 via 10.200.0.2 src 10.200.0.1",
		"route del 10.9.0.0/24 via 10.200.0.2 src 10.200.0.1",
		"route change 10.9.0.0/24 via 10.200.0.6 mtu 1400",
	} {
		if n := ns.batch(t, []string{cmd}); n > 0 {
			t.Fatalf("%s: failed", cmd)
		}
		waitConverged(t, w, ns, 5*time.Second, cmd)
	}
}

// TestKernelIPv6Multipath: IPv6 merges routes with one key into a multipath
// route, and removes single paths from it, notifying only that path.
func TestKernelIPv6Multipath(t *testing.T) {
	ns, w := dualUnderlay(t)
	for _, cmd := range []string{
		"route add fd09::/64 via fd00::2 dev u0",
		"route append fd09::/64 via fd00::3 dev u0",
		"route append fd09::/64 via fd00::4 dev u0",
		"route del fd09::/64 via fd00::3 dev u0",
		"route prepend fd09::/64 via fd00::5 dev u0",
		"route del fd09::/64 via fd00::2 dev u0",
		"route del fd09::/64 via fd00::4 dev u0",
		"route replace fd09::/64 via fd00::6 dev u0",
		"route del fd09::/64",
	} {
		if n := ns.batch(t, []string{cmd}); n > 0 {
			t.Fatalf("%s: failed", cmd)
		}
		waitConverged(t, w, ns, 5*time.Second, cmd)
	}
}

// TestKernelIPv6SharedKey: an IPv6 route that cannot join a multipath
// route (no gateway, or none among the routes it joins) goes after the
// routes with its key, and the cache follows without a re-dump: a pod
// veth's fe80::/64 and ff00::/8 beside every other link's cost an event,
// not a dump of the family. A gateway route beside a gateway route is
// merged by the kernel and re-dumped.
func TestKernelIPv6SharedKey(t *testing.T) {
	ns, w := dualUnderlay(t)
	// The routes to fd0b::/64 in order, each as gateway@dev, or
	// "multipath".
	order := func() (ip, cache []string) {
		var rs []struct {
			Dst, Gateway, Dev string
			Nexthops          []any
		}
		ns.ipJSON(t, &rs, "-6", "route", "show", "table", "main")
		for _, r := range rs {
			switch {
			case r.Dst != "fd0b::/64":
			case len(r.Nexthops) > 0:
				ip = append(ip, "multipath")
			default:
				ip = append(ip, r.Gateway+"@"+r.Dev)
			}
		}
		w.Read(func(v View) {
			for _, r := range v.routesTo(TableMain, netip.MustParsePrefix("fd0b::/64")) {
				if len(r.NextHops) > 0 {
					cache = append(cache, "multipath")
					continue
				}
				g := ""
				if r.Gateway.IsValid() {
					g = r.Gateway.String()
				}
				l, _ := v.Link(r.Index)
				cache = append(cache, g+"@"+l.Name)
			}
		})
		return ip, cache
	}
	for _, step := range []struct {
		cmds   []string
		redump bool // the kernel merges paths: the family is re-dumped
	}{
		{cmds: []string{"link add w0 type veth peer name w1", "link set w1 up", "link set w0 up"}},
		{cmds: []string{"link add w2 type veth peer name w3", "link set w3 up", "link set w2 up"}},
		{cmds: []string{"route add fd0b::/64 dev w2"}},
		{cmds: []string{"route append fd0b::/64 dev w0"}},
		{cmds: []string{"route prepend fd0b::/64 dev u0"}},
		{cmds: []string{"route append fd0b::/64 via fd00::2 dev u0"}},
		{cmds: []string{"route append fd0b::/64 via fd00::3 dev u0"}, redump: true},
		{cmds: []string{"route del fd0b::/64 dev w0"}},
		{cmds: []string{"link set w2 down"}},
		{cmds: []string{"link set w2 up", "route append fd0b::/64 dev w2"}},
		{cmds: []string{"link del w0"}},
	} {
		before := w.Stats().Resyncs[resyncRoutes]
		if n := ns.batch(t, step.cmds); n > 0 {
			t.Fatalf("%q: %d failed", step.cmds, n)
		}
		what := strings.Join(step.cmds, "; ")
		waitConverged(t, w, ns, 5*time.Second, what)
		if err := w.Barrier(context.Background()); err != nil {
			t.Fatal(err)
		}
		if ip, cache := order(); !slices.Equal(ip, cache) {
			t.Errorf("%s: fd0b::/64's routes in the kernel's order %q, in the cache's %q", what, ip, cache)
		}
		if got := w.Stats().Resyncs[resyncRoutes] - before; (got > 0) != step.redump {
			t.Errorf("%s: %d whole-family route re-dumps, want them: %v", what, got, step.redump)
		}
	}
}

// TestKernelSilentChanges covers what the kernel changes without an event:
// IPv4 routes of a link that goes down or away or of an address that goes,
// IPv6 prefsrc of a removed address, route MTUs and linkdown flags after a
// link change.
func TestKernelSilentChanges(t *testing.T) {
	ns := newTestNS(t)
	underlay(t, ns)
	ns.batch(t, []string{
		"link add w0 type veth peer name w1", "link set w0 up", "link set w1 up",
		"addr add 10.201.0.1/24 dev w0", "addr add fd01::1/64 dev w0 nodad", "addr add fd01::2/64 dev w0 nodad",
	})
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)
	for _, step := range [][]string{
		{"route add 10.9.0.0/24 via 10.201.0.2 table 900 src 10.201.0.1", "route add 10.9.1.0/24 dev w0 mtu 1400",
			"route add fd09::/64 via fd01::ff dev w0 src fd01::2 mtu 1400", "route add fd0a::/64 dev w0 table 900 mtu 1500"},
		{"link set w0 mtu 1300"},
		{"link set w0 mtu 1500"},
		{"addr del fd01::2/64 dev w0"},
		{"link set w1 down"},
		{"link set w1 up"},
		{"addr del 10.201.0.1/24 dev w0"},
		{"addr add 10.201.0.1/24 dev w0", "route add 10.9.0.0/24 via 10.201.0.2 table 900", "route add 10.9.2.0/24 via 10.201.0.2 onlink dev w0"},
		{"link set w0 down"},
		{"link set w0 up", "route add 10.9.0.0/24 via 10.201.0.2 table 900"},
		{"link del w0"},
	} {
		if n := ns.batch(t, step); n > 0 {
			t.Fatalf("%q: %d failed", step, n)
		}
		waitConverged(t, w, ns, 5*time.Second, strings.Join(step, "; "))
	}
}

// TestKernelNexthopObjects: routes that use nexthop objects (ip nexthop)
// are cached with their RTA_NH_ID, and follow the object when it changes
// or goes.
func TestKernelNexthopObjects(t *testing.T) {
	ns, w := dualUnderlay(t)
	for _, step := range [][]string{
		{"nexthop add id 1 via 10.200.0.2 dev u0", "nexthop add id 2 via 10.200.0.3 dev u0",
			"nexthop add id 3 group 1/2", "nexthop add id 6 via fd00::2 dev u0"},
		{"route add 10.9.0.0/24 nhid 1", "route add 10.9.1.0/24 nhid 3 table 900", "route add fd09::/64 nhid 6"},
		{"nexthop replace id 1 via 10.200.0.4 dev u0"},
		{"nexthop replace id 6 via fd00::4 dev u0"},
		{"nexthop del id 2"},
		{"nexthop del id 1"},
		{"nexthop del id 6"},
	} {
		if n := ns.batch(t, step); n > 0 {
			t.Fatalf("%q: %d failed", step, n)
		}
		waitConverged(t, w, ns, 5*time.Second, strings.Join(step, "; "))
	}
}

// TestKernelOverflow floods a watcher that has a small receive buffer with
// 100,000 route changes: the kernel drops events (ENOBUFS), the watcher
// says so in its stats, resyncs, and ends equal to the kernel.
func TestKernelOverflow(t *testing.T) {
	ns := newTestNS(t)
	index, gw := underlay(t, ns)
	// The watcher reads no events while the flood is sent: its buffer
	// overflows however fast the machine lets it read.
	var gate pauseGate
	w := startWatcher(t, Options{NetNS: fakeNetNS(gatedDialer{ns.dialer(), &gate}), ReadBuffer: 32 << 10})
	waitSynced(t, w, 2*time.Minute)

	rw := dialRouteWriter(t, ns)
	const n = 50000
	rs := gwRoutes(100, 0, n, gw, index)
	start := time.Now()
	gate.pause()
	rw.add(t, rs)
	// Replace half with another gateway and another MTU, then delete the
	// other half: 100,000 changes of three kinds.
	other := netip.MustParseAddr("10.200.0.3")
	rep := slices.Clone(rs[:n/2])
	for i := range rep {
		rep[i].Gateway, rep[i].MTU = other, 1400
	}
	if failed, err := rw.do(unix.RTM_NEWROUTE, netlink.Create|netlink.Replace, rep); failed > 0 || err != nil {
		t.Fatalf("replace %d routes: %d failed: %v", len(rep), failed, err)
	}
	rw.del(t, rs[n/2:])
	gate.resume()
	t.Logf("100,000 changes in %v", time.Since(start))

	ns.ip(t, "route", "add", "10.255.0.0/24", "via", "10.200.0.2", "table", "100")
	waitConverged(t, w, ns, 30*time.Second, "after the flood")
	t.Logf("converged %v after the start of the flood", time.Since(start))
	st := w.Stats()
	t.Logf("stats after 100,000 changes with a 32 KiB buffer: %+v", st)
	if st.Resyncs[resyncOverflow] == 0 {
		t.Errorf("no overflow resync: Resyncs = %v", st.Resyncs)
	}
	if got := w.Stats(); !got.Synced {
		t.Errorf("watcher not synced after the flood")
	}
}

// pauseGate holds the receives of a multicast conn while paused.
type pauseGate struct{ ch atomic.Pointer[chan struct{}] }

func (g *pauseGate) pause() {
	ch := make(chan struct{})
	g.ch.Store(&ch)
}

func (g *pauseGate) resume() {
	if ch := g.ch.Swap(nil); ch != nil {
		close(*ch)
	}
}

func (g *pauseGate) wait() {
	if ch := g.ch.Load(); ch != nil {
		<-*ch
	}
}

// gatedConn is a multicast conn whose next receive waits while its gate
// is paused (one already waiting for the kernel returns first).
type gatedConn struct {
	rtnl.Conn
	gate *pauseGate
}

func (c *gatedConn) ReceiveBatch(b []byte) ([]byte, error) {
	c.gate.wait()
	return c.Conn.ReceiveBatch(b)
}

type gatedDialer struct {
	kernelDialer
	gate *pauseGate
}

func (d gatedDialer) Dial(cfg rtnl.DialConfig) (rtnl.Conn, error) {
	c, err := d.kernelDialer.Dial(cfg)
	if err != nil || len(cfg.Groups) == 0 {
		return c, err
	}
	return &gatedConn{Conn: c, gate: d.gate}, nil
}

// cancelOnRoute cancels a context when its conn receives the first route
// message: in the middle of a dump of a large table.
type cancelOnRoute struct {
	rtnl.Conn
	fire func()
}

func (c *cancelOnRoute) ReceiveDatagram(b []byte) ([]byte, error) {
	d, err := c.Conn.ReceiveDatagram(b)
	if err == nil && len(d) >= unix.NLMSG_HDRLEN && binary.NativeEndian.Uint16(d[4:6]) == unix.RTM_NEWROUTE {
		c.fire()
	}
	return d, err
}

type cancelDialer struct {
	kernelDialer
	fire func()
}

func (d cancelDialer) Dial(cfg rtnl.DialConfig) (rtnl.Conn, error) {
	c, err := d.kernelDialer.Dial(cfg)
	if err != nil || len(cfg.Groups) > 0 {
		return c, err
	}
	return &cancelOnRoute{Conn: c, fire: d.fire}, nil
}

// TestKernelRunStopsDuringDump cancels a watcher in the middle of its
// initial dump of 50,000 routes: Run returns (a minute: only a hang) and leaves no
// goroutine behind.
func TestKernelRunStopsDuringDump(t *testing.T) {
	ns := newTestNS(t)
	index, gw := underlay(t, ns)
	dialRouteWriter(t, ns).add(t, gwRoutes(100, 0, 50000, gw, index))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	cancelled := make(chan time.Time, 1)
	w := New(Options{NetNS: fakeNetNS(cancelDialer{ns.dialer(), func() {
		once.Do(func() { cancelled <- time.Now(); cancel() })
	}})})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-cancelled:
	case err := <-done:
		t.Fatalf("Run returned before its dump: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("no route dump within 2 min")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(time.Minute): // only a hang
		t.Fatalf("Run did not return within a minute of cancellation mid-dump")
	}
	if w.synced() {
		t.Errorf("synced although the dump was cut short")
	}
}

// TestKernelDumpOrder checks that the route keys' order (cache_routes.go) is the
// order in which the kernel dumps routes, so that a dump only appends to
// each table's sorted array: random routes of both families — nested
// prefixes, TOS, metrics, IPv6 source prefixes, several tables, routes
// sharing a key — go in in random order; after the sync the cache equals
// ip(8) and no table holds a route out of its array.
func TestKernelDumpOrder(t *testing.T) {
	ns := newTestNS(t)
	underlay(t, ns)
	ns.ip(t, "-6", "addr", "add", "fd00:200::1/64", "dev", "u0", "nodad")
	rng := rand.New(rand.NewPCG(seed(t), 0))
	var cmds []string
	for range 1500 {
		table := pick(rng, "main", "100", "70000")
		metric := pick(rng, "", " metric 5", " metric 20")
		if rng.IntN(2) == 0 {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))}), 8+rng.IntN(25)).Masked()
			tos := pick(rng, "", "", " tos 4", " tos 8")
			gw := pick(rng, "10.200.0.2", "10.200.0.3")
			cmds = append(cmds, fmt.Sprintf("route %s %v via %s table %s%s%s", pick(rng, "add", "add", "append"), p, gw, table, tos, metric))
			continue
		}
		a := [16]byte{0xfd, 0x01, 0, byte(rng.IntN(4)), byte(rng.IntN(256))}
		p := netip.PrefixFrom(netip.AddrFrom16(a), 16+rng.IntN(49)).Masked()
		from := ""
		if rng.IntN(4) == 0 {
			s := netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x09, 0, byte(rng.IntN(4))}), 24+rng.IntN(9)).Masked()
			from = " from " + s.String()
		}
		cmds = append(cmds, fmt.Sprintf("-6 route add %v%s via fd00:200::2 table %s%s", p, from, table, metric))
	}
	ns.batch(t, cmds) // some fail (a key taken): fine
	// Duplicate address detection ends with a route in the local table,
	// an event that may sort anywhere: let it end before the dump.
	deadline := time.Now().Add(2 * time.Minute)
	for ns.ip(t, "-6", "addr", "show", "tentative") != "" {
		if time.Now().After(deadline) {
			t.Fatal("IPv6 addresses still tentative after 2 min")
		}
		runtime.Gosched()
	}
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	want := waitConverged(t, w, ns, 10*time.Second, "after the dump")
	if len(want.Routes) < 1000 {
		t.Fatalf("only %d routes in the kernel", len(want.Routes))
	}
	w.Read(func(v View) {
		for f, tables := range v.s.tables {
			for id, tb := range tables {
				if n := len(tb.m4.added) + len(tb.m6.added) + tb.m4.ndead + tb.m6.ndead; n > 0 {
					t.Errorf("family %d table %d: %d of %d routes out of the dump's order", f, id, n, tb.len())
				}
			}
		}
	})
}

// TestKernelLargeDatagram: a link with hundreds of alternative names makes
// a link message, and so a dump datagram, longer than a dump buffer. It
// comes whole, in a buffer of its own, and the watcher's cache has the
// link (a dump request without IFLA_EXT_MASK gets no such link at all).
func TestKernelLargeDatagram(t *testing.T) {
	ns := newTestNS(t)
	underlay(t, ns)
	var cmds []string
	for i := range 490 {
		cmds = append(cmds, fmt.Sprintf("link property add dev u0 altname n%03d%0120d", i, 0))
	}
	if n := ns.batch(t, cmds); n > 0 {
		t.Fatalf("%d of %d altnames refused", n, len(cmds))
	}

	c, err := ns.dialer().Dial(rtnl.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, err := c.Send(netlink.Message{Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request | netlink.Dump},
		Data: dumpRequest(dumpOf{typ: unix.RTM_GETLINK, af: unix.AF_UNSPEC})})
	if err != nil {
		t.Fatal(err)
	}
	longest := 0
	for end := false; !end; {
		d, err := c.ReceiveDatagram(make([]byte, dumpBufferSize))
		if err != nil {
			t.Fatal(err)
		}
		longest = max(longest, len(d))
		if end, _, err = scanDump(d, req.Header.Sequence); err != nil {
			t.Fatal(err)
		}
	}
	if longest <= dumpBufferSize {
		t.Fatalf("longest link dump datagram %d bytes, want more than a dump buffer (%d)", longest, dumpBufferSize)
	}

	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitConverged(t, w, ns, 5*time.Second, fmt.Sprintf("a link message of %d bytes", longest))
}

// TestKernelReceiveNow: the dialed socket is non-blocking, so
// ReceiveDatagram reads with raw syscalls (recvNow); with nothing queued
// it still waits in the runtime's poller, until its deadline, rather than
// block its thread (which would hang the test).
func TestKernelReceiveNow(t *testing.T) {
	ns := newTestNS(t)
	c, err := ns.dialer().Dial(rtnl.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.(*kernelConn).nonblock {
		t.Fatal("the rtnetlink socket is blocking: ReceiveDatagram would not use recvNow")
	}
	if err := c.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if d, err := c.ReceiveDatagram(make([]byte, dumpBufferSize)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReceiveDatagram on an idle socket: %d bytes, %v; want the deadline", len(d), err)
	}
	// And data that comes later is read.
	if err := c.SetReadDeadline(time.Now().Add(2 * time.Minute)); err != nil {
		t.Fatal(err)
	}
	req, err := c.Send(netlink.Message{Header: netlink.Header{Type: unix.RTM_GETRULE, Flags: netlink.Request | netlink.Dump},
		Data: dumpRequest(dumpOf{typ: unix.RTM_GETRULE, af: unix.AF_INET})})
	if err != nil {
		t.Fatal(err)
	}
	// The three rules come in one datagram; DONE with them (6.10 and
	// later) or in a datagram of its own (earlier kernels).
	for i := 1; ; i++ {
		d, err := c.ReceiveDatagram(make([]byte, dumpBufferSize))
		if err != nil {
			t.Fatal(err)
		}
		end, _, err := scanDump(d, req.Header.Sequence)
		if err != nil {
			t.Fatalf("the rules dump, datagram %d: %v", i, err)
		}
		if end {
			break
		}
		if i == 2 {
			t.Fatalf("the rules dump did not end in 2 datagrams")
		}
	}
}

// TestKernelLargeTableChurn: after the dump of a 20,000-route table, a
// mix of deletions and of new routes that sort between the dumped ones
// (so that the store keeps them aside and merges them into its array) ends
// equal to the kernel, and the store stays within its bound on what it
// keeps aside.
func TestKernelLargeTableChurn(t *testing.T) {
	ns := newTestNS(t)
	index, gw := underlay(t, ns)
	all := gwRoutes(TableMain, 0, 40000, gw, index)
	var even, odd []Route
	for i, r := range all {
		if i%2 == 0 {
			even = append(even, r)
		} else {
			odd = append(odd, r)
		}
	}
	rw := dialRouteWriter(t, ns)
	rw.add(t, even)
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)

	rng := rand.New(rand.NewPCG(seed(t), 0))
	rng.Shuffle(len(even), func(i, j int) { even[i], even[j] = even[j], even[i] })
	rng.Shuffle(len(odd), func(i, j int) { odd[i], odd[j] = odd[j], odd[i] })
	for i := 0; i < 8; i++ {
		rw.del(t, even[i*1000:(i+1)*1000])
		rw.add(t, odd[i*1000:(i+1)*1000])
	}
	waitConverged(t, w, ns, 20*time.Second, "after 16,000 changes")
	w.Read(func(v View) {
		s := &v.s.table(IPv4, TableMain, false).m4
		if d := len(s.added) + s.ndead; d >= compactMin && 4*d >= s.n {
			t.Errorf("store keeps %d changes aside of an array of %d: it should have merged them", d, s.n)
		}
	})
}

// TestKernelBarrier: right after Barrier the cache holds what the kernel
// acknowledged before the call — routes added and deleted by the
// thousand, and the IPv4 routes a link loses, silently, when it goes down.
func TestKernelBarrier(t *testing.T) {
	ns := newTestNS(t)
	index, gw := underlay(t, ns)
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)
	ctx := context.Background()
	count := func() (n int) {
		w.Read(func(v View) {
			for range v.Routes(IPv4, 100) {
				n++
			}
		})
		return n
	}
	rw := dialRouteWriter(t, ns)
	for round := range 10 {
		rs := gwRoutes(100, round*2000, 2000, gw, index)
		rw.add(t, rs)
		if err := w.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		if n := count(); n != 2000 {
			t.Fatalf("round %d: %d routes in table 100 right after Barrier, want 2000", round, n)
		}
		rw.del(t, rs)
		if err := w.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		if n := count(); n != 0 {
			t.Fatalf("round %d: %d routes in table 100 right after Barrier, want 0", round, n)
		}
	}
	rw.add(t, gwRoutes(100, 0, 2000, gw, index))
	ns.ip(t, "link", "set", "u0", "down")
	if err := w.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d routes in table 100 right after Barrier, want none: their link went down", n)
	}
}

// TestKernelApplyRefused checks that the Applier, whose socket reads
// answers into small buffers, still gets a refusal whole: the errno and
// the kernel's own explanation, and a long request's acknowledgement.
func TestKernelApplyRefused(t *testing.T) {
	ns := newTestNS(t)
	index, _ := underlay(t, ns)
	ap, err := DialApplier(fakeNetNS(ns.dialer()))
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()
	r := Route{Family: IPv4, Table: TableMain, Dst: netip.MustParsePrefix("10.9.0.0/24"), Index: index,
		Gateway: netip.MustParseAddr("192.0.2.1"), Protocol: ProtoStatic, Scope: ScopeUniverse, Type: RouteUnicast}
	_, err = ap.Apply([]Op{{Kind: RouteReplace, Route: r}})
	if !errors.Is(err, unix.ENETUNREACH) {
		t.Fatalf("a gateway off the link's subnets: %v, want ENETUNREACH", err)
	}
	if !strings.Contains(err.Error(), "gateway") {
		t.Errorf("error %q lacks the kernel's explanation", err)
	}
	// A rule added twice: the second is refused with EEXIST, in an
	// acknowledgement that echoes the whole request.
	rule := Rule{Family: IPv4, Priority: 77, Table: 77, Action: ActionToTable, IIF: "abcdefghijklmno"}
	if _, err := ap.Apply([]Op{{Kind: RuleAdd, Rule: rule}}); err != nil {
		t.Fatal(err)
	}
	if res, err := ap.Apply([]Op{{Kind: RuleAdd, Rule: rule}}); err != nil || !res[0].Already {
		t.Fatalf("adding the rule again: %v, %+v; want it already there", err, res)
	}
}
