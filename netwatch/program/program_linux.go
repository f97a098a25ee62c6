//go:build linux

package program

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// Program is a command around a policy: the standard flags and
// subcommands of a program that owns a table and a rule priority, and
// the loop that runs it. A program sets its name and defaults, adds its
// own flags to Flags (with reconcile's flag values: MarkMask, LinkName,
// Prefixes), and hands Main a function that checks them and returns the
// policy:
//
//	p := &program.Program{Name: "pin", Usage: "--link LINK", Table: 920, Priority: 920, Protocol: 242}
//	var link reconcile.LinkName
//	p.Flags().Var(&link, "link", "the `link` to pin to")
//	p.Main(func() (func(netwatch.View) (reconcile.Desired, bool), error) { … })
type Program struct {
	// Name begins every line the program prints: "pin: started".
	Name string
	// Usage is the program's own flags, for the first line of --help:
	// "usage: pin [run|once|plan|cleanup] --link LINK [flags]".
	Usage string
	// Table, Priority and Protocol are the defaults of --table, --priority
	// and --protocol before Flags, and their values once parsed: what the
	// program owns, in both families, and stamps on what it installs. A
	// zero Table or Priority is not owned.
	Table    reconcile.OwnTable
	Priority reconcile.OwnPriority
	Protocol reconcile.OwnProtocol
	// NetNS, when set, is the network namespace the program works in
	// unless --netns names another: a test sets netwatchtest's fake
	// kernel here (Kernel.NetNS) to run main's own settings on the fake.
	// The Program does not close it. Nil is the process's own namespace.
	NetNS *netwatch.NetNS
	// Resync is --resync: how often the kernel's state is re-read as a
	// safety net (0 never, else at least 10 s: a re-read of a full table
	// takes seconds). Its default is 5 minutes unless set before Flags.
	Resync time.Duration
	// AllowShared lets the program own a table or priority that a known
	// program keeps for itself (reconcile.OwnTable.Shared,
	// OwnPriority.Shared), which Run otherwise refuses: owning Cilium's
	// table 2004 removes Cilium's routes there.
	AllowShared bool
	// Cache names the route tables the policy reads besides Table (such
	// as netwatch.TableMain); the cache holds no others.
	Cache []netwatch.Table
	// Reconciler, when set, is the loop Run runs, with its hooks and
	// tuning; Run sets its Watcher, Applier and Policy, its Resync, and its
	// Logger unless set.
	Reconciler *reconcile.Reconciler

	fs    *flag.FlagSet
	netns string // --netns
	cmd   string // the subcommand
}

// The subcommands, the first argument when it is not a flag.
const (
	cmdRun     = "run"
	cmdOnce    = "once"
	cmdPlan    = "plan"
	cmdCleanup = "cleanup"
)

// minResync is the shortest period of --resync: a re-read of a full
// table takes seconds, and one every nanosecond burnt a core for ever.
const minResync = 10 * time.Second

// Flags returns the program's flag set, holding --table, --priority,
// --protocol, --netns and --resync; a program adds its own to it before
// Run.
func (p *Program) Flags() *flag.FlagSet {
	if p.fs != nil {
		return p.fs
	}
	if p.Resync == 0 {
		p.Resync = 5 * time.Minute
	}
	fs := flag.NewFlagSet(p.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	OwnerFlags(fs, p.Name, &p.Table, &p.Priority, &p.Protocol)
	fs.StringVar(&p.netns, "netns", "", "network namespace to work in, as a `path` (/run/netns/NAME, /proc/PID/ns/net); default: this process's")
	fs.DurationVar(&p.Resync, "resync", p.Resync, "re-read the kernel's state this often, as a safety net: at least 10s, or 0 to disable")
	p.fs = fs
	return fs
}

// parse reads the subcommand and the flags, checks them, and calls build.
func (p *Program) parse(args []string, build func() (func(netwatch.View) (reconcile.Desired, bool), error)) (func(netwatch.View) (reconcile.Desired, bool), error) {
	fs := p.Flags()
	p.cmd = cmdRun
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case cmdRun, cmdOnce, cmdPlan, cmdCleanup:
			p.cmd, args = args[0], args[1:]
		case "help":
			return nil, flag.ErrHelp
		default:
			return nil, fmt.Errorf("unknown command %q (want run, once, plan or cleanup)", args[0])
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errors.New(FlagError(err))
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case p.Resync < 0:
		return nil, fmt.Errorf("--resync %v: must not be negative", p.Resync)
	case p.Resync > 0 && p.Resync < minResync:
		return nil, fmt.Errorf("--resync %v: below the floor of %v (0 disables it)", p.Resync, minResync)
	}
	for _, n := range []string{p.Table.Shared(), p.Priority.Shared()} {
		if n != "" && !p.AllowShared {
			return nil, fmt.Errorf("%s: %s would remove what is there; choose another", n, p.Name)
		}
	}
	return build()
}

// usage writes the help: the usage line, the subcommands, the flags.
func (p *Program) usage(w io.Writer) {
	u := strings.TrimPrefix(strings.TrimSuffix(strings.TrimSpace(p.Usage), "[flags]"), p.Name+" ")
	if u != "" && !strings.HasSuffix(u, " ") {
		u += " "
	}
	fmt.Fprintf(w, "usage: %s [run|once|plan|cleanup] %s[flags]\n\n", p.Name, u)
	fmt.Fprintf(w, "  run      keep the kernel at the policy until SIGINT or SIGTERM (the default)\n")
	fmt.Fprintf(w, "  once     one pass: apply, print each change, exit 0 when converged\n")
	fmt.Fprintf(w, "  plan     print the changes a pass would make; change nothing\n")
	fmt.Fprintf(w, "  cleanup  remove every route and rule %s owns\n\nFlags:\n", p.Name)
	PrintFlags(w, p.Flags())
}
