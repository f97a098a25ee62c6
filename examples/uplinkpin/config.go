package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
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
	mark := fs.String("mark", "", "MARK/MASK of the packets to pin (required)")
	table := fs.String("table", strconv.Itoa(defaultTable), "routing table owned by uplinkpin (every route in it, both families)")
	prio := fs.String("priority", strconv.Itoa(defaultPriority), "rule priority owned by uplinkpin (every rule at it, both families)")
	proto := fs.String("protocol", strconv.Itoa(defaultProtocol), "routing protocol number stamped on what uplinkpin installs (1-255, or an iproute2 name such as static)")
	netns := fs.String("netns", "", "network namespace, as a path (/run/netns/NAME, /proc/PID/ns/net); default: this process's")
	resync := fs.Duration("resync", defaultResync, "re-read the kernel's state this often, as a safety net (0 disables)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "usage: uplinkpin --uplink LINK --mark MARK/MASK [flags]")
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
	if *uplink == "" {
		return options{}, errors.New("--uplink is required: the link marked packets leave by")
	}
	if err := reconcile.LinkName(*uplink).Check(); err != nil {
		return options{}, fmt.Errorf("--uplink %q: %w", *uplink, err)
	}
	c.Uplink = *uplink
	if *mark == "" {
		return options{}, errors.New("--mark is required: MARK/MASK of the packets to pin")
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
