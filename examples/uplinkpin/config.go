package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/marksplit/marksplit/netwatch"
)

// Defaults. Table and priority 920 collide with nothing known: Cilium uses
// priorities 1, 8–10, 20, 100, 109–112 and tables 200–202, 2004, 2005,
// 10+N, 300+N; Tailscale table 52 and priorities 5210–5270; the marksplit
// agent 900 (protocol 109); vpnbypass 910 (241). Protocol 242 is in no
// iproute2 or daemon list.
const (
	defaultTable    = 920
	defaultPriority = 920
	defaultProtocol = 242
	defaultResync   = 5 * time.Minute
)

// options are the parsed command line.
type options struct {
	cfg    Config
	netns  string
	resync time.Duration
}

// parseArgs parses and checks the command line. It returns flag.ErrHelp
// after printing the usage to stderr for -h, and otherwise an error of one
// line that names the flag.
func parseArgs(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("uplinkpin", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	uplink := fs.String("uplink", "", "the link marked packets leave by (required)")
	mark := fs.String("mark", "", "MARK[/MASK] of the packets to pin (required)")
	table := fs.String("table", strconv.Itoa(defaultTable), "routing table owned by uplinkpin (every route in it, both families)")
	prio := fs.String("priority", strconv.Itoa(defaultPriority), "rule priority owned by uplinkpin (every rule at it, both families)")
	proto := fs.String("protocol", strconv.Itoa(defaultProtocol), "routing protocol number stamped on what uplinkpin installs (1-255)")
	netns := fs.String("netns", "", "network namespace, as a path (/run/netns/NAME, /proc/PID/ns/net); default: this process's")
	resync := fs.Duration("resync", defaultResync, "re-read the kernel's state this often, as a safety net (0 disables)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "usage: uplinkpin --uplink LINK --mark MARK[/MASK] [flags]")
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
	var err error
	if *uplink == "" {
		return options{}, errors.New("--uplink is required: the link marked packets leave by")
	}
	if c.Uplink, err = parseLinkName(*uplink); err != nil {
		return options{}, fmt.Errorf("--uplink %q: %w", *uplink, err)
	}
	if *mark == "" {
		return options{}, errors.New("--mark is required: MARK[/MASK] of the packets to pin")
	}
	if c.Mark, c.Mask, err = parseMark(*mark); err != nil {
		return options{}, fmt.Errorf("--mark %q: %w", *mark, err)
	}
	if c.Table, err = parseTable(*table); err != nil {
		return options{}, fmt.Errorf("--table %q: %w", *table, err)
	}
	if c.Priority, err = parsePriority(*prio); err != nil {
		return options{}, fmt.Errorf("--priority %q: %w", *prio, err)
	}
	if c.Protocol, err = parseProtocol(*proto); err != nil {
		return options{}, fmt.Errorf("--protocol %q: %w", *proto, err)
	}
	if o.resync < 0 {
		return options{}, fmt.Errorf("--resync %v: must not be negative", o.resync)
	}
	return o, nil
}

func parseLinkName(s string) (string, error) {
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

// parseMark parses MARK[/MASK] in decimal or 0x hex. Without a mask, the
// mask is all ones, as with ip-rule(8) and as the kernel reports it.
func parseMark(s string) (mark, mask netwatch.Mark, err error) {
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

func parseTable(s string) (netwatch.Table, error) {
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

func parsePriority(s string) (uint32, error) {
	p, err := strconv.ParseUint(s, 0, 32)
	switch {
	case err != nil:
		return 0, errors.New("not a rule priority (1 to 4294967295)")
	case p == 0 || p == 32766 || p == 32767:
		return 0, errors.New("reserved for the kernel's local, main and default rules; choose another")
	}
	return uint32(p), nil
}

func parseProtocol(s string) (netwatch.Protocol, error) {
	p, err := strconv.ParseUint(s, 0, 8)
	if err != nil || p == 0 {
		return 0, errors.New("not a protocol number (1 to 255)")
	}
	return netwatch.Protocol(p), nil
}
