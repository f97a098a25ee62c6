//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"go.uber.org/goleak"
)

// The state dump is checked against ip -j, an oracle that shares no code
// with netwatch: each line of watch -json -once must be what ip reports,
// converted to the dump's fields as DESIGN.md defines them.

// seed gives ns a bit of everything the dump prints: veth, tun and bridge
// links, addresses of both families and a peer address, routes in several
// tables (one above 255) of several types with a gateway, prefsrc, MTU,
// metric and protocol, a multipath route, and rules with marks, masks and
// "not".
func seed(t *testing.T, ns *netwatchtest.NetNS) {
	t.Helper()
	// No duplicate address detection: IPv6 link-local addresses and their
	// local routes appear as a link comes up, not a second or two later,
	// in the middle of the oracle's ip(8) calls.
	if err := ns.Do(func() error {
		for _, c := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+c+"/accept_dad", []byte("0"), 0o644); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "enp7s0", "type", "veth", "peer", "name", "peer0"},
		{"link", "set", "enp7s0", "mtu", "1450", "up"},
		{"link", "set", "peer0", "up"},
		{"tuntap", "add", "mode", "tun", "name", "cilium_wg0"},
		{"link", "set", "cilium_wg0", "mtu", "1355", "up"},
		{"link", "add", "br0", "type", "bridge"},
		{"addr", "add", "10.0.0.5/16", "dev", "enp7s0"},
		{"addr", "add", "fd00::5/64", "dev", "enp7s0", "nodad"},
		{"addr", "add", "10.9.0.1", "peer", "10.9.0.2/32", "dev", "cilium_wg0"},
		{"route", "add", "10.0.0.0/16", "via", "10.0.0.1", "dev", "enp7s0", "src", "10.0.0.5", "mtu", "1355", "table", "900", "proto", "77"},
		{"route", "add", "10.1.0.0/16", "via", "10.0.0.1", "table", "70000", "metric", "20"},
		{"route", "add", "blackhole", "10.2.0.0/16", "table", "900"},
		{"route", "add", "10.4.0.0/24", "nexthop", "via", "10.0.0.2", "weight", "3", "nexthop", "via", "10.0.0.3"},
		{"route", "add", "default", "via", "10.0.0.1"},
		{"-6", "route", "add", "fd09::/64", "via", "fd00::1", "dev", "enp7s0", "mtu", "1400", "table", "900"},
		{"-6", "route", "add", "unreachable", "fd0a::/64", "table", "900"},
		{"rule", "add", "not", "fwmark", "0xe00/0xf00", "lookup", "900", "pref", "900", "proto", "77"},
		{"rule", "add", "fwmark", "0x1", "lookup", "70000", "pref", "100"},
		{"rule", "add", "from", "10.0.0.0/8", "to", "10.9.0.0/16", "iif", "enp7s0", "blackhole", "pref", "50"},
		{"-6", "rule", "add", "not", "fwmark", "0xe00/0xf00", "lookup", "900", "pref", "900"},
		// Every attribute: metrics and their locks, realms, onlink, tos,
		// an expiry, a preference; every rule selector.
		{"route", "add", "10.20.0.0/16", "via", "10.0.0.1", "dev", "enp7s0", "proto", "dhcp", "src", "10.0.0.5", "metric", "1002",
			"onlink", "realm", "7", "mtu", "lock", "1355", "advmss", "1300", "initcwnd", "10", "initrwnd", "20", "rtt", "100ms",
			"rttvar", "20ms", "quickack", "1", "congctl", "reno", "window", "1000", "ssthresh", "30", "cwnd", "10",
			"reordering", "5", "hoplimit", "9", "features", "ecn", "rto_min", "5ms", "fastopen_no_cookie", "1"},
		{"route", "add", "10.21.0.0/16", "tos", "0x10", "via", "10.0.0.1", "table", "900", "realms", "3/4"},
		{"-6", "route", "add", "fd01::/64", "via", "fd00::1", "dev", "enp7s0", "proto", "ra", "metric", "1024", "expires", "600",
			"mtu", "1355", "hoplimit", "7", "pref", "high"},
		{"rule", "add", "pref", "910", "not", "fwmark", "0xe00/0xf00", "uidrange", "100-200", "tos", "0x10", "sport", "1000-2000",
			"dport", "53", "ipproto", "udp", "suppress_prefixlength", "0", "proto", "109", "iif", "lo", "lookup", "910"},
		{"rule", "add", "pref", "911", "from", "10.0.0.0/8", "to", "10.1.0.0/16", "realms", "3/4", "goto", "912"},
		{"rule", "add", "pref", "912", "l3mdev"},
		{"rule", "add", "pref", "913", "tun_id", "7", "oif", "enp7s0", "suppress_ifgroup", "5", "lookup", "913"},
		{"rule", "add", "pref", "914", "oif", "enp7s0", "blackhole"},
	} {
		ns.IP(t, cmd...)
	}
}

// routeFlags are the rtm_flags bits ip prints by name.
var routeFlags = map[string]uint32{"dead": 0x1, "pervasive": 0x2, "onlink": 0x4, "offload": 0x8, "linkdown": 0x10, "unresolved": 0x20, "trap": 0x40}

// scaled stretches a time limit on a machine that runs everything
// MARKSPLIT_TIME_SCALE times slower than usual: `make test-kernels` sets
// it in its emulated guests (QEMU's TCG).
func scaled(d time.Duration) time.Duration {
	if f, err := strconv.ParseFloat(os.Getenv("MARKSPLIT_TIME_SCALE"), 64); err == nil && f > 1 {
		return time.Duration(float64(d) * f)
	}
	return d
}

func num(v any) uint64 {
	switch x := v.(type) {
	case float64:
		return uint64(x)
	case string:
		n, _ := strconv.ParseUint(x, 0, 64)
		return n
	}
	return 0
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func prefix(s string, v6 bool) string {
	switch {
	case s == "default" && v6:
		return "::/0"
	case s == "default":
		return "0.0.0.0/0"
	case !strings.Contains(s, "/"):
		a := netip.MustParseAddr(s)
		return netip.PrefixFrom(a, a.BitLen()).String()
	}
	return netip.MustParsePrefix(s).Masked().String()
}

func flagBits(t *testing.T, v any) uint32 {
	t.Helper()
	var f uint32
	l, _ := v.([]any)
	for _, n := range l {
		bit, ok := routeFlags[str(n)]
		if !ok {
			t.Fatalf("ip: unknown route flag %v", n)
		}
		f |= bit
	}
	return f
}

// line is one dump line as a canonical JSON string.
func canonical(t *testing.T, m map[string]any) string {
	t.Helper()
	for k, v := range m {
		switch x := v.(type) {
		case string:
			if x == "" {
				delete(m, k)
			}
		case bool:
			if !x && k != "up" {
				delete(m, k)
			}
		case nil:
			delete(m, k)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	// Numbers as the dump prints them (json.Marshal of float64 from an
	// unmarshalled line and of uint64 agree for integers).
	return string(b)
}

// oracle returns the dump lines ip -j describes, by kind.
func oracle(t *testing.T, ns *netwatchtest.NetNS) []string {
	t.Helper()
	var lines []string
	var links []map[string]any
	ns.IPJSON(t, &links, "-d", "-N", "link", "show")
	index := map[string]uint64{}
	for _, l := range links {
		index[str(l["ifname"])] = num(l["ifindex"])
	}
	for _, l := range links {
		flags, _ := l["flags"].([]any)
		m := map[string]any{"kind": "link", "index": num(l["ifindex"]), "name": l["ifname"], "mtu": num(l["mtu"]),
			"up": slices.Contains(flags, any("UP")), "operstate": l["operstate"]}
		if li, ok := l["linkinfo"].(map[string]any); ok {
			m["link_kind"] = li["info_kind"]
		}
		lines = append(lines, canonical(t, m))
	}
	var addrs []struct {
		Index uint64           `json:"ifindex"`
		Info  []map[string]any `json:"addr_info"`
	}
	ns.IPJSON(t, &addrs, "addr", "show")
	for _, l := range addrs {
		for _, a := range l.Info {
			m := map[string]any{"kind": "addr", "index": l.Index,
				"prefix": netip.PrefixFrom(netip.MustParseAddr(str(a["local"])), int(num(a["prefixlen"]))).String()}
			if p := str(a["address"]); p != str(a["local"]) {
				m["peer"] = p
			}
			lines = append(lines, canonical(t, m))
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		var routes []map[string]any
		ns.IPJSON(t, &routes, fam, "-d", "-N", "route", "show", "table", "all")
		for _, r := range routes {
			v6 := fam == "-6"
			m := map[string]any{"kind": "route", "family": 4, "table": num(r["table"]), "dst": prefix(str(r["dst"]), v6),
				"gateway": r["gateway"], "dev": r["dev"], "src": r["prefsrc"], "metric": num(r["metric"]),
				"protocol": num(r["protocol"]), "scope": num(r["scope"]), "type": num(r["type"])}
			if v6 {
				m["family"] = 6
			}
			if dev := str(r["dev"]); dev != "" {
				m["index"] = index[dev]
			}
			if from := str(r["from"]); from != "" {
				m["from"] = prefix(from, v6)
			}
			if via, ok := r["via"].(map[string]any); ok {
				m["gateway"] = via["host"]
			}
			if f := flagBits(t, r["flags"]); f != 0 {
				m["flags"] = f
			}
			if nh := num(r["nhid"]); nh != 0 {
				m["nhid"] = nh
			}
			if ms, ok := r["metrics"].([]any); ok {
				for _, x := range ms {
					metricsOf(x.(map[string]any), m)
				}
			}
			if tos := num(r["tos"]); tos != 0 {
				m["tos"] = tos
			}
			if fl, ok := r["flow"].(map[string]any); ok {
				m["flow"] = num(fl["from"])<<16 | num(fl["to"])
			}
			if p := str(r["pref"]); p != "" && p != "medium" {
				m["pref"] = p
			}
			if e, ok := r["expires"]; ok {
				m["expires"] = num(e)
			}
			if hops, ok := r["nexthops"].([]any); ok {
				var hs []map[string]any
				for _, h := range hops {
					h := h.(map[string]any)
					hs = append(hs, map[string]any{"gateway": h["gateway"], "index": index[str(h["dev"])], "dev": h["dev"], "weight": num(h["weight"])})
				}
				m["nexthops"] = hs
			}
			lines = append(lines, canonical(t, m))
		}
		// ip -j leaves out the locks; its text says "mtu lock 1355", in
		// the same order of routes.
		var text []string
		for l := range strings.Lines(ns.IP(t, fam, "-d", "route", "show", "table", "all")) {
			if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, " ") {
				text[len(text)-1] += l // a multipath route's next hops
				continue
			}
			text = append(text, l)
		}
		if len(text) != len(routes) {
			t.Fatalf("ip %s route: %d lines of text, %d of JSON", fam, len(text), len(routes))
		}
		for i := range routes {
			if locks := lockWords(text[i]); len(locks) > 0 {
				var m map[string]any
				json.Unmarshal([]byte(lines[len(lines)-len(routes)+i]), &m)
				m["locks"] = locks
				lines[len(lines)-len(routes)+i] = canonical(t, m)
			}
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		var rules []map[string]any
		ns.IPJSON(t, &rules, fam, "-d", "-N", "rule", "show")
		for _, r := range rules {
			m := map[string]any{"kind": "rule", "family": 4, "priority": num(r["priority"]), "table": num(r["table"]),
				"protocol": num(r["protocol"]), "iif": r["iif"], "oif": r["oif"]}
			if fam == "-6" {
				m["family"] = 6
			}
			if _, ok := r["not"]; ok {
				m["invert"] = true
			}
			if mark, ok := r["fwmark"]; ok {
				m["mark"], m["mask"] = num(mark), uint64(0xffffffff)
				if mask, ok := r["fwmask"]; ok {
					m["mask"] = num(mask)
				}
				if m["mark"] == uint64(0) {
					delete(m, "mark")
				}
			}
			switch {
			case r["goto"] != nil:
				m["action"] = netwatch.RuleAction(2).String()
			case r["nop"] != nil || strings.Contains(str(r["action"]), "nop"):
				m["action"] = netwatch.RuleAction(3).String()
			case r["action"] != nil:
				m["action"] = netwatch.RuleAction(num(r["action"])).String()
			}
			ruleSelectors(r, m)
			for _, sel := range []struct{ addr, bits, key string }{{"src", "srclen", "from"}, {"dst", "dstlen", "to"}} {
				a := str(r[sel.addr])
				if a == "" || a == "all" {
					continue
				}
				addr := netip.MustParseAddr(a)
				bits := addr.BitLen()
				if l, ok := r[sel.bits]; ok {
					bits = int(num(l))
				}
				m[sel.key] = netip.PrefixFrom(addr, bits).Masked().String()
			}
			lines = append(lines, canonical(t, m))
		}
	}
	return lines
}

// extras are what apart takes out of a line: the expiry, which counts
// down between ip's dump and watch's, and the attributes netwatch keeps
// undecoded, which this ip(8) does not print.
type extras struct {
	expires map[string]uint64 // by line without it
	attrs   map[string][]any
}

// apart takes "expires" and "attrs" out of each line.
func apart(t *testing.T, lines []string) ([]string, extras) {
	t.Helper()
	x := extras{expires: map[string]uint64{}, attrs: map[string][]any{}}
	out := make([]string, len(lines))
	for i, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		e, hasE := m["expires"]
		a, hasA := m["attrs"].([]any)
		delete(m, "expires")
		delete(m, "attrs")
		out[i] = canonical(t, m)
		if hasE {
			x.expires[out[i]] = num(e)
		}
		if hasA {
			x.attrs[out[i]] = a
		}
	}
	return out, x
}

// sameExtras checks the expiries within two seconds (scaled), and that every
// undecoded attribute watch prints is one a newer kernel added to rules
// (FRA_DSCP and after, 25 on): nothing older goes undecoded.
func sameExtras(want, got extras) error {
	for l, e := range want.expires {
		g, ok := got.expires[l]
		tol := uint64(scaled(2*time.Second) / time.Second)
		if !ok || g+tol < e || e+tol < g {
			return fmt.Errorf("expires of %s: ip %d, watch %d (set: %v)", l, e, g, ok)
		}
	}
	if len(got.expires) != len(want.expires) {
		return fmt.Errorf("%d lines with an expiry, ip has %d", len(got.expires), len(want.expires))
	}
	for l, as := range got.attrs {
		for _, a := range as {
			if typ := num(a.(map[string]any)["type"]); !strings.Contains(l, `"kind":"rule"`) || typ < 25 {
				return fmt.Errorf("%s: undecoded attribute %v", l, a)
			}
		}
	}
	return nil
}

// metricsOf converts ip -j's metrics into the dump's: the MTU apart, the
// others in the kernel's units (ip prints rtt in ms, the kernel keeps 1/8
// ms; rttvar 1/4 ms), features as bits, congestion as congctl.
func metricsOf(x map[string]any, m map[string]any) {
	obj := map[string]any{}
	for k, v := range x {
		switch k {
		case "mtu":
			m["mtu"] = num(v)
		case "rtt":
			obj[k] = num(v) * 8
		case "rttvar":
			obj[k] = num(v) * 4
		case "congestion":
			obj["congctl"] = v
		case "ecn":
			obj["features"] = uint64(1)
		default:
			obj[k] = num(v)
		}
	}
	if len(obj) > 0 {
		m["metrics"] = obj
	}
}

// lockWords returns the metrics ip's text says are locked ("mtu lock 1355").
func lockWords(line string) []any {
	var locks []any
	f := strings.Fields(line)
	for i := 0; i+1 < len(f); i++ {
		if f[i+1] == "lock" {
			name := f[i]
			if name == "congctl" {
				name = "congctl"
			}
			locks = append(locks, name)
		}
	}
	return locks
}

// ruleSelectors converts ip -j's rule selectors into the dump's fields.
func ruleSelectors(r, m map[string]any) {
	if tos := num(r["tos"]); tos != 0 {
		m["tos"] = tos
	}
	if _, ok := r["uid_start"]; ok {
		m["uidrange"] = []any{num(r["uid_start"]), num(r["uid_end"])}
	}
	for _, p := range []string{"sport", "dport"} {
		if v, ok := r[p]; ok {
			m[p] = []any{num(v), num(v)}
		} else if v, ok := r[p+"_start"]; ok {
			m[p] = []any{num(v), num(r[p+"_end"])}
		}
	}
	if p := str(r["ipproto"]); p != "" {
		n, ok := map[string]uint64{"tcp": 6, "udp": 17, "icmp": 1, "ipv6-icmp": 58}[p]
		if !ok {
			n = num(strings.TrimPrefix(p, "ipproto-"))
		}
		m["ipproto"] = n
	}
	if _, ok := r["suppress_prefixlen"]; ok {
		m["suppress_prefixlength"] = num(r["suppress_prefixlen"])
	}
	if _, ok := r["suppress_ifgroup"]; ok {
		m["suppress_ifgroup"] = num(r["suppress_ifgroup"])
	}
	if g, ok := r["goto"]; ok {
		m["goto"] = num(g)
	}
	if _, ok := r["flow_to"]; ok {
		m["flow"] = num(r["flow_from"])<<16 | num(r["flow_to"])
	}
	if _, ok := r["l3mdev"]; ok {
		m["l3mdev"] = uint64(1)
	}
	if id, ok := r["tun_id"]; ok {
		m["tun_id"] = num(id)
	}
	if _, ok := r["unresolved"]; ok {
		m["state"] = uint64(4) // FIB_RULE_UNRESOLVED
	}
}

// dumpLines reads watch's output as canonical lines and checks that the
// kinds come in the documented order: links, addresses, routes, rules.
func dumpLines(t *testing.T, out []byte) []string {
	t.Helper()
	order := map[string]int{"link": 0, "addr": 1, "route": 2, "rule": 3}
	var lines []string
	last := 0
	for l := range strings.Lines(string(out)) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		k, ok := order[str(m["kind"])]
		if !ok || k < last {
			t.Fatalf("line %q: kind out of order", l)
		}
		last = k
		if dst, ok := m["dst"]; ok && prefix(str(dst), strings.Contains(str(dst), ":")) != dst {
			t.Errorf("line %q: dst is not a masked prefix", l)
		}
		lines = append(lines, canonical(t, m))
	}
	return lines
}

// TestKernelWatchOnce runs the example with -json -once in a namespace and
// compares each line with what ip -j reports, until they agree (IPv6
// duplicate address detection changes the state for a second or two).
func TestKernelWatchOnce(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the namespace's cleanup
	ns := newNetNS(t)
	seed(t, ns)
	deadline := time.Now().Add(scaled(2 * time.Minute))
	for {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"-json", "-once", "-netns", ns.Path()}, &stdout, &stderr); code != 0 {
			t.Fatalf("watch -json -once: exit %d: %s", code, stderr.Bytes())
		}
		got, extra := apart(t, dumpLines(t, stdout.Bytes()))
		want, wantExtra := apart(t, oracle(t, ns))
		if err := sameExtras(wantExtra, extra); err != nil {
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			continue
		}
		slices.Sort(got)
		slices.Sort(want)
		diff := cmp.Diff(want, got)
		if diff == "" {
			t.Logf("%d lines equal ip -j", len(got))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("watch -json -once differs from ip -j (-ip +watch):\n%s", diff)
		}
	}
}

// TestKernelWatchEvents runs the example without -once: after the dump, a
// route added and deleted makes exactly one "new" and one "del" line.
func TestKernelWatchEvents(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the namespace's cleanup
	ns := newNetNS(t)
	ns.IP(t, "link", "set", "lo", "up")

	pr, pw := io.Pipe()
	lines := make(chan map[string]any, 1024)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(pr)
		for s.Scan() {
			var m map[string]any
			if err := json.Unmarshal(s.Bytes(), &m); err != nil {
				t.Errorf("line %q: %v", s.Text(), err)
				continue
			}
			lines <- m
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	nns, err := netwatch.OpenNetNS(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nns.Close()
	w := netwatch.New(netwatch.Options{NetNS: nns})
	go func() { done <- watch(ctx, w, false, true, pw) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("watch: %v", err)
			}
		case <-time.After(scaled(time.Second)):
			t.Errorf("watch did not return within %v of cancellation", scaled(time.Second))
			<-done
		}
		pw.Close()
		for range lines {
		}
	}()

	const dst = "192.0.2.0/24"
	timeout := time.After(scaled(2 * time.Minute))
	next := func() map[string]any {
		t.Helper()
		select {
		case m := <-lines:
			return m
		case <-timeout:
			t.Fatal("timed out waiting for a line")
		}
		return nil
	}
	// The dump first: lo, its addresses and routes.
	if m := next(); m["kind"] != "link" || m["event"] != nil {
		t.Fatalf("first line %v, want a link without an event", m)
	}
	for _, step := range []struct {
		cmd   []string
		event string
	}{
		{[]string{"route", "add", "blackhole", dst, "table", "70000", "proto", "77"}, "new"},
		{[]string{"route", "del", "blackhole", dst, "table", "70000"}, "del"},
	} {
		ns.IP(t, step.cmd...)
		for {
			m := next()
			if m["kind"] != "route" || m["dst"] != dst {
				continue
			}
			if m["event"] != step.event || num(m["table"]) != 70000 || num(m["protocol"]) != 77 || num(m["type"]) != 6 {
				t.Fatalf("after %q: line %v, want one with event %q for the route", step.cmd, m, step.event)
			}
			// ip(8) made it: the port of its socket, which it has closed
			// by now, so its process is not known.
			if m["origin"] != "program" || num(m["port"]) == 0 {
				t.Errorf("after %q: line %v, want origin program with a port", step.cmd, m)
			}
			break
		}
	}
	// Nothing else about the route: a change to another table makes the
	// next line, and it must not be about dst.
	ns.IP(t, "route", "add", "blackhole", "198.51.100.0/24", "table", "900")
	for {
		m := next()
		if m["dst"] == dst {
			t.Fatalf("extra line about %s: %v", dst, m)
		}
		if m["dst"] == "198.51.100.0/24" {
			if m["event"] != "new" {
				t.Fatalf("line %v, want event new", m)
			}
			break
		}
	}
}
