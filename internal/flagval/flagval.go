// Package flagval parses the flags with which the example programs name
// what their policies own: a mark, a table, a rule priority, a routing
// protocol and a link. Each function returns an error of one line that
// does not repeat its input, for the caller to prefix with the flag.
package flagval

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/marksplit/marksplit/netwatch"
)

// Mark parses MARK[/MASK], each in decimal or 0x hex. Without a mask,
// the mask is all ones, as with ip-rule(8) and as the kernel reports it.
// It refuses a zero mark and a mark with bits outside the mask.
func Mark(s string) (mark, mask netwatch.Mark, err error) {
	ms, ks, hasMask := strings.Cut(s, "/")
	m, err := strconv.ParseUint(ms, 0, 32)
	if err != nil {
		return 0, 0, errors.New("not MARK or MARK/MASK (like 0x100/0xff00)")
	}
	k := uint64(0xffffffff)
	if hasMask {
		if k, err = strconv.ParseUint(ks, 0, 32); err != nil {
			return 0, 0, errors.New("not MARK or MARK/MASK (like 0x100/0xff00)")
		}
	}
	switch {
	case m == 0:
		return 0, 0, errors.New("the mark must not be zero")
	case m&^k != 0:
		return 0, 0, fmt.Errorf("mark %#x has bits outside mask %#x", m, k)
	}
	return netwatch.Mark(m), netwatch.Mark(k), nil
}

// Table parses a routing table number in decimal or 0x hex. It
// refuses the kernel's reserved tables: unspec, default, main and local.
func Table(s string) (netwatch.Table, error) {
	t, err := strconv.ParseUint(s, 0, 32)
	switch {
	case err != nil:
		return 0, errors.New("not a table number (1 to 4294967295)")
	case t == uint64(netwatch.TableUnspec), t == uint64(netwatch.TableDefault),
		t == uint64(netwatch.TableMain), t == uint64(netwatch.TableLocal):
		return 0, fmt.Errorf("reserved table (%v); choose one of your own", netwatch.Table(t))
	}
	return netwatch.Table(t), nil
}

// Priority parses a rule priority in decimal or 0x hex. It refuses
// 0, 32766 and 32767, the priorities of the kernel's local, main and
// default rules.
func Priority(s string) (uint32, error) {
	p, err := strconv.ParseUint(s, 0, 32)
	switch {
	case err != nil:
		return 0, errors.New("not a rule priority (1 to 4294967295)")
	case p == 0 || p == 32766 || p == 32767:
		return 0, errors.New("reserved for the kernel's local, main and default rules; choose another")
	}
	return uint32(p), nil
}

// Protocol parses a routing protocol: a number in decimal or 0x hex,
// or an iproute2 name as netwatch.Protocol.String returns it (static, dhcp, ...).
// It refuses 0 (unspec).
func Protocol(s string) (netwatch.Protocol, error) {
	if n, err := strconv.ParseUint(s, 0, 8); err == nil {
		if n == 0 {
			return 0, errors.New("not a protocol number (1 to 255)")
		}
		return netwatch.Protocol(n), nil
	}
	for i := 1; i < 256; i++ {
		if p := netwatch.Protocol(i); p.String() == s {
			return p, nil
		}
	}
	return 0, errors.New("not a protocol number (1 to 255) or iproute2 name")
}

// LinkName checks an interface name as the kernel would accept it: not
// empty, at most 15 bytes, no '/', ':' or white space, not "." or "..".
func LinkName(s string) error {
	switch {
	case s == "":
		return errors.New("empty link name")
	case len(s) > 15:
		return errors.New("longer than 15 bytes, the kernel's limit")
	case s == "." || s == ".." || strings.ContainsAny(s, "/: \t\n"):
		return errors.New("not a valid link name")
	}
	return nil
}
