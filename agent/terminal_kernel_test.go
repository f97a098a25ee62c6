//go:build linux

package main

import (
	"strings"
	"testing"
)

// controlBytes reports whether s holds a byte a terminal acts on, other
// than the line ends.
func controlBytes(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0) })
}

// A link named with ESC and BEL (the kernel accepts both) reaches plan's,
// once's and verify's standard output escaped, never raw.
func TestKernelCommandsEscapeNames(t *testing.T) {
	s := newSeed(t, true)
	const evil = "\x1b[31m\x07e0"
	s.ns.IP(t, "link", "set", "enp7s0", "down")
	s.ns.IP(t, "link", "set", "enp7s0", "name", evil)
	s.ns.IP(t, "link", "set", evil, "up")
	s.ns.IP(t, "route", "add", "10.0.0.1", "dev", evil, "proto", "dhcp", "scope", "link", "src", "10.0.0.5")
	s.ns.IP(t, "route", "add", "10.0.0.0/16", "via", "10.0.0.1", "dev", evil, "proto", "dhcp", "src", "10.0.0.5", "mtu", "1355")
	const escaped = `dev \x1b[31m\ae0`
	for _, args := range [][]string{
		append([]string{"plan"}, seedArgs...),
		append([]string{"once"}, seedArgs...),
		{"verify", "--peer=10.0.0.9", "--prefix=10.0.0.0/16"},
	} {
		stdout, stderr, code := s.command(t, args...)
		if code != 0 || controlBytes(stdout) || !strings.Contains(stdout, escaped) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 0 and the link's name escaped (%s), no control characters", args[0], code, stdout, stderr, escaped)
		}
	}
}
