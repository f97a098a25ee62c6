package pathmtu

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Declared is an operator's path MTU for the peers inside Prefix
// (--path-mtu=CIDR=BYTES): Path bytes.
type Declared struct {
	Prefix netip.Prefix // masked
	Path   int
}

// MinPath and MaxPath bound a declared path MTU: IPv4's minimum MTU, and
// the largest jumbo frame.
const (
	MinPath = 68
	MaxPath = 65535
)

// ParseDeclared parses "CIDR=BYTES", as 10.1.0.0/16=1368.
func ParseDeclared(s string) (Declared, error) {
	p, n, ok := strings.Cut(s, "=")
	if !ok {
		return Declared{}, fmt.Errorf("pathmtu: %q: want CIDR=BYTES, as 10.1.0.0/16=1368", s)
	}
	pfx, err := netip.ParsePrefix(strings.TrimSpace(p))
	if err != nil {
		return Declared{}, fmt.Errorf("pathmtu: %q: %w", s, err)
	}
	if pfx.Addr().Is4In6() || pfx.Addr().Zone() != "" {
		return Declared{}, fmt.Errorf("pathmtu: %q: write the plain IPv4 or IPv6 prefix", s)
	}
	if pfx != pfx.Masked() {
		return Declared{}, fmt.Errorf("pathmtu: %q: prefix has host bits set: did you mean %v?", s, pfx.Masked())
	}
	path, err := strconv.Atoi(strings.TrimSpace(n))
	if err != nil || path < MinPath || path > MaxPath {
		return Declared{}, fmt.Errorf("pathmtu: %q: BYTES must be a number from %d to %d", s, MinPath, MaxPath)
	}
	return Declared{Prefix: pfx, Path: path}, nil
}

func (d Declared) String() string { return d.Prefix.String() + "=" + strconv.Itoa(d.Path) }

// DeclaredList is a repeatable flag of Declared values.
type DeclaredList []Declared

func (l *DeclaredList) String() string {
	if l == nil {
		return ""
	}
	var ss []string
	for _, d := range *l {
		ss = append(ss, d.String())
	}
	return strings.Join(ss, ",")
}

// Set adds one CIDR=BYTES; a prefix given twice is an error.
func (l *DeclaredList) Set(s string) error {
	d, err := ParseDeclared(s)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(*l, func(o Declared) bool { return o.Prefix == d.Prefix }) {
		return fmt.Errorf("pathmtu: %v declared twice", d.Prefix)
	}
	*l = append(*l, d)
	return nil
}

// lookup returns the declared path MTU of peer: the longest prefix that
// holds it wins.
func (l DeclaredList) lookup(peer netip.Addr) (int, bool) {
	best, path := -1, 0
	for _, d := range l {
		if d.Prefix.Contains(peer) && d.Prefix.Bits() > best {
			best, path = d.Prefix.Bits(), d.Path
		}
	}
	return path, best >= 0
}
