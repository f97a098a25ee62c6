package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// Defaults. Table and priority 910 collide with nothing known: Cilium uses
// priorities 1, 8–10, 20, 100, 109–112 and tables 200–202, 2004, 2005,
// 10+N, 300+N; Tailscale table 52 and priorities 5210–5270; the marksplit
// agent 900 (protocol 109); uplinkpin 920 (242). Protocol 241 is in no
// iproute2 or daemon list.
const (
	defaultLink     = "tailscale0"
	defaultMark     = "0x80000/0xff0000" // Tailscale's "this packet is mine" bit
	defaultTable    = 910
	defaultPriority = 910
	defaultProtocol = 241
	defaultResync   = 5 * time.Minute
)

// options are the parsed command line.
type options struct {
	cfg    Config
	netns  string
	resync time.Duration
}

type prefixFlag []string

func (p *prefixFlag) String() string     { return strings.Join(*p, ",") }
func (p *prefixFlag) Set(s string) error { *p = append(*p, s); return nil }

// parseArgs parses and checks the command line. It returns flag.ErrHelp
// after printing the usage to stderr for -h, and otherwise an error of one
// line that names the flag.
func parseArgs(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("vpnbypass", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var prefixes prefixFlag
	fs.Var(&prefixes, "prefix", "CIDR to send through the VPN link (repeatable, at least one)")
	link := fs.String("link", defaultLink, "the VPN link")
	mark := fs.String("mark", defaultMark, "MARK/MASK the VPN puts on its own packets; they bypass the table")
	table := fs.String("table", strconv.Itoa(defaultTable), "routing table owned by vpnbypass (every route in it, both families)")
	prio := fs.String("priority", strconv.Itoa(defaultPriority), "rule priority owned by vpnbypass (every rule at it, both families)")
	proto := fs.String("protocol", strconv.Itoa(defaultProtocol), "routing protocol number stamped on what vpnbypass installs (1-255, or an iproute2 name such as static)")
	netns := fs.String("netns", "", "network namespace, as a path (/run/netns/NAME, /proc/PID/ns/net); default: this process's")
	resync := fs.Duration("resync", defaultResync, "re-read the kernel's state this often, as a safety net (0 disables)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "usage: vpnbypass --prefix CIDR [--prefix CIDR...] [flags]")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
		}
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o := options{netns: *netns, resync: *resync}
	c := &o.cfg
	if err := reconcile.LinkName(*link).Check(); err != nil {
		return options{}, fmt.Errorf("--link %q: %w", *link, err)
	}
	c.Link = *link
	if len(prefixes) == 0 {
		return options{}, errors.New("--prefix is required: the CIDRs to send through the VPN link (repeatable)")
	}
	for _, s := range prefixes {
		p, err := parsePrefix(s)
		if err != nil {
			return options{}, fmt.Errorf("--prefix %q: %w", s, err)
		}
		if !slices.Contains(c.Prefixes, p) {
			c.Prefixes = append(c.Prefixes, p)
		}
	}
	var mm reconcile.MarkMask
	if err := mm.Set(*mark); err != nil {
		return options{}, fmt.Errorf("--mark %q: %w", *mark, err)
	}
	c.Mark, c.Mask = mm.Mark, mm.Mask
	var tab reconcile.Table
	if err := tab.Set(*table); err != nil {
		return options{}, fmt.Errorf("--table %q: %w", *table, err)
	}
	c.Table = netwatch.Table(tab)
	var pri reconcile.Priority
	if err := pri.Set(*prio); err != nil {
		return options{}, fmt.Errorf("--priority %q: %w", *prio, err)
	}
	c.Priority = uint32(pri)
	var prot reconcile.Protocol
	if err := prot.Set(*proto); err != nil {
		return options{}, fmt.Errorf("--protocol %q: %w", *proto, err)
	}
	c.Protocol = netwatch.Protocol(prot)
	if o.resync < 0 {
		return options{}, fmt.Errorf("--resync %v: must not be negative", o.resync)
	}
	return o, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, errors.New("not a CIDR prefix (like 10.8.0.0/16 or fd00::/8)")
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, errors.New("a prefix has no zone")
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("host bits set (did you mean %v?)", p.Masked())
	}
	return p, nil
}
