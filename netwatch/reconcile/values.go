package reconcile

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/marksplit/marksplit/netwatch"
)

// The values a program names what it owns with. Each is a flag.Value whose
// Set parses the text form ip(8) prints and then applies the type's one
// Check, which a policy's own validation calls too; the errors are one line
// that does not repeat the input, for the caller to prefix with the flag's
// name.

// OwnTable is a routing table a program may own: 1 to 4294967295, except the
// kernel's own (0 unspec, 253 default, 254 main, 255 local) and 252, which
// rtnetlink headers say for every table above 255. Text: a number, decimal
// or 0x hex.
type OwnTable netwatch.Table

// Check reports why t cannot be owned, or nil.
func (t OwnTable) Check() error {
	switch netwatch.Table(t) {
	case 0, 252, 253, netwatch.TableMain, netwatch.TableLocal:
		return fmt.Errorf("table %d is reserved (0, 252, 253 default, 254 main, 255 local): choose one of your own", uint32(t))
	}
	return nil
}

// Set parses and checks a table number.
func (t *OwnTable) Set(s string) error {
	n, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return errors.New("not a table number (1 to 4294967295, but not 252 to 255)")
	}
	if err := OwnTable(n).Check(); err != nil {
		return err
	}
	*t = OwnTable(n)
	return nil
}

func (t OwnTable) String() string { return strconv.FormatUint(uint64(t), 10) }

// Shared names the known program on a Kubernetes node that keeps table t
// for itself ("Cilium's table 2004": Cilium's 200 to 202, 2004 and 2005,
// Tailscale's 52), or returns "". Check allows such a table, since a node
// without that program may use it; owning it where the program runs
// removes that program's routes, so program.Program refuses it unless told
// otherwise, and the agent likewise.
func (t OwnTable) Shared() string {
	switch {
	case t >= 200 && t <= 202 || t == 2004 || t == 2005:
		return fmt.Sprintf("Cilium's table %d", uint32(t))
	case t == 52:
		return "Tailscale's table 52"
	}
	return ""
}

// OwnPriority is a rule priority a program may own: 1 to 32765. 0 is the
// kernel's local rule; 32766 and 32767 are the main and default tables'
// rules, and a rule after main's would never see a packet that main routes.
type OwnPriority uint32

// Check reports why p cannot be owned, or nil.
func (p OwnPriority) Check() error {
	switch {
	case p == 0:
		return errors.New("priority 0 is the kernel's local rule: choose 1 to 32765")
	case p >= 32766:
		return fmt.Errorf("priority %d is at or after the main table's rule (32766), where nothing main routes would reach it: choose 1 to 32765", uint32(p))
	}
	return nil
}

// Set parses and checks a priority, decimal or 0x hex.
func (p *OwnPriority) Set(s string) error {
	n, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return errors.New("not a rule priority (1 to 32765)")
	}
	if err := OwnPriority(n).Check(); err != nil {
		return err
	}
	*p = OwnPriority(n)
	return nil
}

func (p OwnPriority) String() string { return strconv.FormatUint(uint64(p), 10) }

// Shared names the known program whose rules are at p ("Cilium's rule
// priority 100": Cilium's 1, 8 to 10, 20, 100 and 109 to 112, Tailscale's
// 5210 to 5270), or returns "", as OwnTable.Shared does.
func (p OwnPriority) Shared() string {
	switch {
	case p == 1 || p >= 8 && p <= 10 || p == 20 || p == 100 || p >= 109 && p <= 112:
		return fmt.Sprintf("Cilium's rule priority %d", uint32(p))
	case p >= 5210 && p <= 5270:
		return fmt.Sprintf("Tailscale's rule priority %d", uint32(p))
	}
	return ""
}

// MarkMask is a firewall mark under a mask, as a rule matches it: text
// MARK/MASK, each decimal or 0x hex, as ip-rule(8) prints it. The mask is
// required: a bare mark means all 32 bits to the kernel, which is rarely
// what was meant (Cilium's WireGuard mark is 0x1e00 up to 1.17 and 0xe00
// since; only 0xe00/0xf00 matches both); write MARK/0xffffffff for every
// bit.
type MarkMask struct {
	Mark, Mask netwatch.Mark
}

// Check reports why m cannot be matched usefully, or nil: a zero mark or
// mask, or mark bits outside the mask.
func (m MarkMask) Check() error {
	switch {
	case m.Mask == 0:
		return fmt.Errorf("mask 0 matches every packet: the mark %v would mean nothing", m.Mark)
	case m.Mark == 0:
		return fmt.Errorf("mark 0/%v: the mark must be non-zero", m.Mask)
	case m.Mark&^m.Mask != 0:
		return fmt.Errorf("mask %v does not cover mark %v (bits %v outside it)", m.Mask, m.Mark, m.Mark&^m.Mask)
	}
	return nil
}

// Set parses and checks MARK/MASK.
func (m *MarkMask) Set(s string) error {
	ms, ks, hasMask := strings.Cut(s, "/")
	mark, err := strconv.ParseUint(ms, 0, 32)
	if err != nil {
		return errors.New("not MARK/MASK (like 0xe00/0xf00)")
	}
	if !hasMask {
		return fmt.Errorf("%s has no mask: a bare mark matches all 32 bits, and Cilium's WireGuard mark is 0x1e00 up to 1.17 and 0xe00 since; give the mask (0xe00/0xf00 matches both), or MARK/0xffffffff for every bit", ms)
	}
	mask, err := strconv.ParseUint(ks, 0, 32)
	if err != nil {
		return errors.New("not MARK/MASK (like 0xe00/0xf00)")
	}
	v := MarkMask{netwatch.Mark(mark), netwatch.Mark(mask)}
	if err := v.Check(); err != nil {
		return err
	}
	*m = v
	return nil
}

func (m MarkMask) String() string { return m.Mark.String() + "/" + m.Mask.String() }

// OwnProtocol is the routing protocol a program stamps on what it installs,
// so that `ip route show proto N` lists it: 2 (kernel) or 4 to 255. 0, 1
// and 3 mean something else to the kernel or to iproute2 (unspec,
// redirect, boot). Kernel is allowed: systemd-networkd never removes
// routes and rules of that protocol. Text: a number or an iproute2 name
// (static, dhcp, ...).
type OwnProtocol netwatch.Protocol

// Check reports why p cannot be stamped on owned objects, or nil.
func (p OwnProtocol) Check() error {
	if netwatch.Protocol(p) < netwatch.ProtoStatic && netwatch.Protocol(p) != netwatch.ProtoKernel {
		return fmt.Errorf("protocol %d means something to the kernel (0 unspec, 1 redirect, 3 boot): use 2 (kernel) or 4 to 255", uint8(p))
	}
	return nil
}

// Set parses and checks a protocol number or name.
func (p *OwnProtocol) Set(s string) error {
	v, ok := parseProtocol(s)
	if !ok {
		return errors.New("not a protocol: a number (2, or 4 to 255) or an iproute2 name such as static")
	}
	if err := v.Check(); err != nil {
		return err
	}
	*p = v
	return nil
}

func parseProtocol(s string) (OwnProtocol, bool) {
	if n, err := strconv.ParseUint(s, 0, 8); err == nil {
		return OwnProtocol(n), true
	}
	for i := range 256 {
		if netwatch.Protocol(i).String() == s {
			return OwnProtocol(i), true
		}
	}
	return 0, false
}

func (p OwnProtocol) String() string { return strconv.Itoa(int(p)) }

// LinkName is a network interface's name as the kernel accepts one: 1 to
// 15 bytes, no '/', ':' or white space, not "." or "..", and, though the
// kernel takes them, no control characters.
type LinkName string

// Check reports why the kernel would refuse n, or nil.
func (n LinkName) Check() error {
	switch {
	case n == "":
		return errors.New("empty link name")
	case len(n) > 15:
		return errors.New("longer than 15 bytes, the kernel's limit for a link name")
	case n == "." || n == ".." || strings.ContainsAny(string(n), "/: \t\n\v\f\r"):
		return fmt.Errorf("%q is not a name the kernel accepts for a link", string(n))
	case strings.ContainsFunc(string(n), func(r rune) bool { return r < ' ' || r == 0x7f }):
		return fmt.Errorf("%q: a link name with control characters is refused", string(n))
	}
	return nil
}

// Set checks a link name.
func (n *LinkName) Set(s string) error {
	if err := LinkName(s).Check(); err != nil {
		return err
	}
	*n = LinkName(s)
	return nil
}

func (n LinkName) String() string { return string(n) }

// Prefixes is a repeatable flag of CIDR prefixes: each Set adds one,
// masked (10.0.0.0/16, not 10.0.0.5/16), without a zone, once.
type Prefixes []netip.Prefix

// Set parses and adds a prefix.
func (ps *Prefixes) Set(s string) error {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return errors.New("not a CIDR prefix (like 10.8.0.0/16 or fd00::/8)")
	case p.Addr().Zone() != "":
		return errors.New("a prefix has no zone")
	case p.Addr().Is4In6():
		return fmt.Errorf("write the IPv4 form of %v", p)
	case p != p.Masked():
		return fmt.Errorf("host bits set (did you mean %v?)", p.Masked())
	}
	if !slices.Contains(*ps, p) {
		*ps = append(*ps, p)
	}
	return nil
}

func (ps Prefixes) String() string {
	ss := make([]string, len(ps))
	for i, p := range ps {
		ss[i] = p.String()
	}
	return strings.Join(ss, ",")
}
