//go:build linux

package mtupolicy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
)

// The policy's edges on a real kernel, each checked with ip route get
// without and with the mark.

// pathIs checks what ip route get says for dst, unmarked or marked.
func (s *kseed) pathIs(t *testing.T, dst string, marked bool, table, mtu string) {
	t.Helper()
	if gt, gm := s.path(t, dst, marked); gt != table || gm != mtu {
		t.Errorf("ip route get %s (marked: %v): table %s mtu %s, want table %s mtu %s", dst, marked, gt, gm, table, mtu)
	}
}

// A tunnel whose MTU is above the underlay's (cilium_wg0 1500 over a 1400
// link): the table routes take the link's 1400, not 1500, or unmarked
// packets of 1468 bytes would be dropped at the device.
func TestKernelTunnelAboveUnderlay(t *testing.T) {
	s := newKSeed(t, false)
	s.ns.IP(t, "link", "set", "cilium_wg0", "mtu", "1500")
	s.ns.IP(t, "link", "set", "enp7s0", "mtu", "1400")
	s.pass(t, mtupolicy.ModeOn)
	s.pathIs(t, "10.0.0.9", false, "900", "1400")
	s.pathIs(t, "10.0.0.9", true, "main", "1400")
	if out := s.ns.IP(t, "route", "show", "table", "900", "10.0.0.0/16"); !strings.Contains(out, "mtu 1400") {
		t.Errorf("table route: %q, want mtu 1400", out)
	}
}

// A tunnel link that exists but is down splits nothing; once up it does.
func TestKernelTunnelDown(t *testing.T) {
	s := newKSeed(t, false)
	s.ns.IP(t, "link", "set", "cilium_wg0", "down")
	if ops := s.pass(t, mtupolicy.ModeOn); len(ops) != 0 {
		t.Errorf("a down tunnel was split:\n%s", opsString(ops))
	}
	s.unsplit(t)
	s.pathIs(t, "10.0.0.9", false, "main", "1450")
	var notes []string
	s.w.Read(func(v netwatch.View) { d, _ := mtupolicy.Desired(v, s.cfg, mtupolicy.ModeOn); notes = d.Notes })
	if len(notes) != 1 || !strings.Contains(notes[0], "tunnel link cilium_wg0 is down") {
		t.Errorf("notes %q, want the tunnel down", notes)
	}
	s.ns.IP(t, "link", "set", "cilium_wg0", "up")
	s.pass(t, mtupolicy.ModeOn)
	s.pathIs(t, "10.0.0.9", false, "900", "1355")
}

// A tunnel below IPv6's minimum of 1280: IPv4 is split at the tunnel MTU,
// IPv6 not at all (no route, no rule), and a note says so.
func TestKernelTunnelBelowIPv6Minimum(t *testing.T) {
	s := newKSeed(t, false)
	s.gw.IP(t, "addr", "add", "fd00::1/64", "dev", "gw0", "nodad")
	s.ns.IP(t, "addr", "add", "fd00::5/64", "dev", "enp7s0", "noprefixroute", "nodad")
	s.ns.IP(t, "-6", "route", "add", "fd00::1", "dev", "enp7s0", "proto", "dhcp")
	s.ns.IP(t, "-6", "route", "add", "fd00::/64", "via", "fd00::1", "dev", "enp7s0", "proto", "dhcp")
	s.ns.IP(t, "link", "set", "cilium_wg0", "mtu", "1200")
	s.cfg.Prefixes = append(s.cfg.Prefixes, pfx("fd00::/64"))
	ops := s.pass(t, mtupolicy.ModeOn)
	if slices.ContainsFunc(ops, func(o netwatch.Op) bool { return o.Route.Family == netwatch.IPv6 || o.Rule.Family == netwatch.IPv6 }) {
		t.Errorf("IPv6 split below its minimum MTU:\n%s", opsString(ops))
	}
	s.pathIs(t, "10.0.0.9", false, "900", "1200")
	s.pathIs(t, "fd00::9", false, "main", "1450")
	if out := s.ns.IP(t, "-6", "rule", "show", "pref", "900"); out != "" {
		t.Errorf("IPv6 rule at 900: %q", out)
	}
	var notes []string
	s.w.Read(func(v netwatch.View) { d, _ := mtupolicy.Desired(v, s.cfg, mtupolicy.ModeOn); notes = d.Notes })
	if len(notes) != 1 || !strings.Contains(notes[0], "below the family's minimum 1280: inet6 is not split") {
		t.Errorf("notes %q, want IPv6 below its minimum", notes)
	}
}

// The repaired main route follows its link: the repair took its lowered
// MTU off, so when the underlay's MTU drops, marked packets get the new
// one, and the table routes are clamped to it.
func TestKernelRepairFollowsTheLink(t *testing.T) {
	s := newKSeed(t, true)
	s.pass(t, mtupolicy.ModeOn)
	s.pathIs(t, "10.0.0.9", true, "main", "1450")
	s.ns.IP(t, "link", "set", "enp7s0", "mtu", "1300")
	s.pass(t, mtupolicy.ModeOn)
	s.pathIs(t, "10.0.0.9", true, "main", "1300")
	s.pathIs(t, "10.0.0.9", false, "900", "1300")
	if out := s.ns.IP(t, "route", "show", "10.0.0.0/16"); strings.Contains(out, "mtu") {
		t.Errorf("the main route has an MTU of its own again: %q", out)
	}
}
