package netwatch

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The parsers below read the flags with which a policy names what it owns:
// its mark, table, rule priority and routing protocol. Each returns an
// error of one line that does not repeat its input, for the caller to
// prefix with the flag.

// ParseMark parses MARK[/MASK], each in decimal or 0x hex. Without a mask,
// the mask is all ones, as with ip-rule(8) and as the kernel reports it.
// It refuses a zero mark and a mark with bits outside the mask.
func ParseMark(s string) (mark, mask Mark, err error) {
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
	return Mark(m), Mark(k), nil
}

// ParseTable parses a routing table number in decimal or 0x hex. It
// refuses the kernel's reserved tables: unspec, default, main and local.
func ParseTable(s string) (Table, error) {
	t, err := strconv.ParseUint(s, 0, 32)
	switch {
	case err != nil:
		return 0, errors.New("not a table number (1 to 4294967295)")
	case t == uint64(TableUnspec), t == uint64(TableDefault),
		t == uint64(TableMain), t == uint64(TableLocal):
		return 0, fmt.Errorf("reserved table (%v); choose one of your own", Table(t))
	}
	return Table(t), nil
}

// ParsePriority parses a rule priority in decimal or 0x hex. It refuses
// 0, 32766 and 32767, the priorities of the kernel's local, main and
// default rules.
func ParsePriority(s string) (uint32, error) {
	p, err := strconv.ParseUint(s, 0, 32)
	switch {
	case err != nil:
		return 0, errors.New("not a rule priority (1 to 4294967295)")
	case p == 0 || p == 32766 || p == 32767:
		return 0, errors.New("reserved for the kernel's local, main and default rules; choose another")
	}
	return uint32(p), nil
}

// ParseProtocol parses a routing protocol: a number in decimal or 0x hex,
// or an iproute2 name as Protocol.String returns it (static, dhcp, ...).
// It refuses 0 (unspec).
func ParseProtocol(s string) (Protocol, error) {
	if n, err := strconv.ParseUint(s, 0, 8); err == nil {
		if n == 0 {
			return 0, errors.New("not a protocol number (1 to 255)")
		}
		return Protocol(n), nil
	}
	for i := 1; i < 256; i++ {
		if p := Protocol(i); p.String() == s {
			return p, nil
		}
	}
	return 0, errors.New("not a protocol number (1 to 255) or iproute2 name")
}

// ParseLinkName checks an interface name as the kernel would accept it:
// not empty, at most 15 bytes, no '/', ':' or white space, not "." or "..".
func ParseLinkName(s string) (string, error) {
	switch {
	case s == "":
		return "", errors.New("empty link name")
	case len(s) > 15:
		return "", errors.New("longer than 15 bytes, the kernel's limit")
	case s == "." || s == ".." || strings.ContainsAny(s, "/: \t\n"):
		return "", errors.New("not a valid link name")
	}
	return s, nil
}
