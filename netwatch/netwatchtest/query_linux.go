//go:build linux

package netwatchtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/internal/fakekernel"
	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
)

// The questions a test asks of a namespace take the *netwatch.NetNS that
// New's Kernel and NewNetNS's NetNS both hand out (NetNS), so that one test
// runs on either: the fake kernel answers from its state, a real
// namespace with ip(8), an oracle independent of netwatch.

// fakeOf returns the fake kernel behind ns, or nil for a real namespace.
func fakeOf(ns *netwatch.NetNS) *Kernel {
	if e, ok := fakekernel.Of((*rtnl.NetNS)(ns)); ok {
		return (*Kernel)(e)
	}
	return nil
}

// ipIn runs ip(8) with args in the real namespace ns and returns its
// output, or an error with ip's message (matching the errno it names,
// for errors.Is).
func ipIn(ns *netwatch.NetNS, args ...string) (string, error) {
	fd := (*rtnl.NetNS)(ns).FD()
	if fd < 0 {
		return "", errors.New("netwatchtest: the namespace is closed")
	}
	path := "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(fd)
	out, err := exec.Command("nsenter", append([]string{"--net=" + path, "ip"}, args...)...).CombinedOutput()
	if err == nil {
		return string(out), nil
	}
	msg := strings.TrimSpace(string(out))
	for _, errno := range []syscall.Errno{syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.EACCES, syscall.EINVAL, syscall.ENODEV, syscall.ESRCH} {
		if strings.Contains(strings.ToLower(msg), errno.Error()) {
			return "", fmt.Errorf("netwatchtest: ip %s: %s: %w", strings.Join(args, " "), msg, errno)
		}
	}
	return "", fmt.Errorf("netwatchtest: ip %s: %s: %w", strings.Join(args, " "), msg, err)
}

// Hop is where a route lookup sends a packet, the fields a test checks:
// the output link's name, the gateway, the preferred source, the table
// the route was found in, and the route's own MTU (0: its link's
// applies). The fake kernel reports the route's own preferred source
// only; the kernel, the one it would choose.
type Hop struct {
	Dev     string
	Gateway netip.Addr
	PrefSrc netip.Addr
	Table   netwatch.Table
	MTU     uint32
}

// Matches reports whether got has every field want sets, and the table
// want names (main when 0).
func (want Hop) Matches(got Hop) bool {
	table := want.Table
	if table == 0 {
		table = netwatch.TableMain
	}
	return got.Dev == want.Dev && got.Table == table &&
		(!want.Gateway.IsValid() || got.Gateway == want.Gateway) &&
		(!want.PrefSrc.IsValid() || got.PrefSrc == want.PrefSrc) &&
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

// RouteGet answers q as `ip route get` does, through the rules: where the
// packet goes, or the lookup's error (ENETUNREACH, EHOSTUNREACH, EACCES,
// EINVAL for a blackhole), which errors.Is matches. The fake kernel's is
// the lookup alone: a forwarded packet's further checks are not modelled.
func RouteGet(ns *netwatch.NetNS, q Lookup) (Hop, error) {
	if k := fakeOf(ns); k != nil {
		r, err := k.engine().Lookup(q.Dst, q.Src, q.IIF, uint32(q.Mark))
		if err != nil {
			return Hop{}, err
		}
		h := Hop{Gateway: r.Gateway, PrefSrc: r.PrefSrc, Table: netwatch.Table(r.Table), MTU: r.MTU}
		for _, l := range k.engine().Links() {
			if l.Index == r.Index {
				h.Dev = l.Name
			}
		}
		return h, nil
	}
	args := []string{"-j", "route", "get", q.Dst.String()}
	if q.Src.IsValid() {
		args = append(args, "from", q.Src.String())
	}
	if q.IIF != "" {
		args = append(args, "iif", q.IIF)
	}
	if q.Mark != 0 {
		args = append(args, "mark", q.Mark.String())
	}
	out, err := ipIn(ns, args...)
	if err != nil {
		return Hop{}, err
	}
	var hs []struct {
		Dev     string     `json:"dev"`
		Gateway netip.Addr `json:"gateway"`
		PrefSrc netip.Addr `json:"prefsrc"`
		Table   string     `json:"table"`
		Metrics []struct {
			MTU uint32 `json:"mtu"`
		} `json:"metrics"`
	}
	if err := json.Unmarshal([]byte(out), &hs); err != nil || len(hs) != 1 {
		return Hop{}, fmt.Errorf("netwatchtest: ip %s: %q: not one route (%v)", strings.Join(args, " "), out, err)
	}
	h := Hop{Dev: hs[0].Dev, Gateway: hs[0].Gateway, PrefSrc: hs[0].PrefSrc, Table: netwatch.TableMain}
	switch hs[0].Table {
	case "", "main":
	case "local":
		h.Table = netwatch.TableLocal
	default:
		n, err := strconv.ParseUint(hs[0].Table, 10, 32)
		if err != nil {
			return Hop{}, fmt.Errorf("netwatchtest: ip %s: table %q: %w", strings.Join(args, " "), hs[0].Table, err)
		}
		h.Table = netwatch.Table(n)
	}
	for _, m := range hs[0].Metrics {
		h.MTU = max(h.MTU, m.MTU)
	}
	return h, nil
}

// WaitRoute polls RouteGet(ns, q) until its answer matches want, or
// fails the test, with logs (nil: none), after a deadline.
func WaitRoute(t testing.TB, ns *netwatch.NetNS, logs fmt.Stringer, q Lookup, want Hop) {
	t.Helper()
	var got Hop
	var err error
	if !Poll(func() bool {
		got, err = RouteGet(ns, q)
		return err == nil && want.Matches(got)
	}) {
		t.Fatalf("route get %+v: want %+v, got %+v (%v)%s", q, want, got, err, logText(logs))
	}
}

// OwnedText lists the routes in table and the rules at priority, IPv4
// first, one per line: "-4 route " or "-6 rule " and the object as ip(8)
// prints it (ip itself in a real namespace; netwatch's Describe and
// String, which print the same, on the fake kernel).
func OwnedText(ns *netwatch.NetNS, table netwatch.Table, priority uint32) (string, error) {
	if k := fakeOf(ns); k != nil {
		s := k.Snapshot()
		v := s.View()
		var lines []string
		for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
			flag := "-" + strconv.Itoa(int(f)) + " "
			for _, r := range s.Routes {
				if r.Family == f && r.Table == table {
					lines = append(lines, flag+"route "+r.Describe(v.Link))
				}
			}
			for _, r := range s.Rules {
				if r.Family == f && r.Priority == priority {
					lines = append(lines, flag+"rule "+r.String())
				}
			}
		}
		return strings.Join(lines, "\n"), nil
	}
	var lines []string
	for _, f := range []string{"-4", "-6"} {
		routes, err := ipIn(ns, f, "route", "show", "table", "all")
		if err != nil {
			return "", err
		}
		for l := range strings.Lines(routes) {
			if strings.Contains(l, " table "+table.String()+" ") {
				lines = append(lines, f+" route "+strings.TrimSpace(l))
			}
		}
		rules, err := ipIn(ns, f, "rule", "show", "pref", strconv.FormatUint(uint64(priority), 10))
		if err != nil {
			return "", err
		}
		for l := range strings.Lines(rules) {
			lines = append(lines, f+" rule "+strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n"), nil
}

// WaitOwned polls OwnedText(ns, table, priority) until it is want, or
// fails the test, with logs (nil: none), after a deadline.
func WaitOwned(t testing.TB, ns *netwatch.NetNS, logs fmt.Stringer, table netwatch.Table, priority uint32, want string) {
	t.Helper()
	var last string
	var err error
	if !Poll(func() bool {
		last, err = OwnedText(ns, table, priority)
		return err == nil && last == want
	}) {
		t.Fatalf("table %v and priority %d: want %q, have %q (%v)%s", table, priority, want, last, err, logText(logs))
	}
}

// logText is a program's log for a failure message, nil none.
func logText(logs fmt.Stringer) string {
	if logs == nil {
		return ""
	}
	return "\nlog:\n" + logs.String()
}
