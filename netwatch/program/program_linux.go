//go:build linux

package program

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
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
	// table 2004 removes Cilium's routes there. build may set it.
	AllowShared bool
	// Cache names the route tables the policy reads besides Table (such
	// as netwatch.TableMain); the cache holds no others.
	Cache []netwatch.Table
	// Reconciler, when set, is the loop Run runs, with its hooks and
	// tuning; Run sets its Watcher, Applier and Policy, its Resync, and its
	// Logger unless set.
	Reconciler *reconcile.Reconciler
	// Version, when set, adds --version, which prints "NAME VERSION".
	Version string
	// Help, when set, is printed by --help after the subcommands and
	// before the flags: what the program does, how its flags go together.
	Help string
	// Commands are the program's own subcommands beside run, once, plan
	// and cleanup (the agent's verify and health).
	Commands []Command
	// Logger is the program's log, on stderr unless build sets it (from
	// the program's --log-format, say): a line per change with run, and
	// the watcher's lines, and the error that ends the program with status
	// 1 ("run failed: …"). Nil: text, the watcher's lines only when they
	// warn, and the error in one line "NAME: …" on stderr.
	Logger *slog.Logger
	// Start, when set, starts what the policy reads besides the kernel
	// (an API's objects, a device) and, with run, the program's own
	// servers: run, once, plan and a Command that watches call it once the
	// watcher runs, before the first pass, with a context that ends when
	// the subcommand does (its goroutines go through Session.Go). once,
	// plan and the Commands then call wait, when not nil, and stop at its
	// error: it returns once the policy's inputs are known, or says what is
	// missing. cleanup does not call Start: it removes what is owned
	// whatever the inputs say.
	Start func(ctx context.Context, s *Session) (wait func(context.Context) error, err error)
	// StopHolder says how to stop a running holder of the table or the
	// priority, in cleanup's refusal beside one that still owns something
	// (cleanup removes nothing then, as the holder would put it back);
	// default "stop it first".
	StopHolder string

	fs    *flag.FlagSet
	netns string // --netns
	cmd   string // the subcommand
	own   *Command
	vers  bool // --version
}

// A Command is one of a Program's own subcommands: it takes the program's
// flags and its own, and build's checks, and then runs instead of a loop.
type Command struct {
	// Name is the subcommand, the first argument: "verify".
	Name string
	// Usage is its line in --help, after the name: its own flags, two
	// spaces, and what it does.
	Usage string
	// Flags, when set, adds the command's own flags to the program's.
	Flags func(fs *flag.FlagSet)
	// Watch runs the command as plan runs: in the namespace, with the
	// watcher synced, an Applier (to ask the kernel), and Start's inputs
	// known; without it the Session has no Watcher and no Applier.
	Watch bool
	// Run is the command; an error ends the program with status 1.
	Run func(ctx context.Context, s *Session) error
}

// A Session is one subcommand's run of a Program, as Start and a
// Command see it.
type Session struct {
	Command string            // the subcommand
	Watcher *netwatch.Watcher // running
	Applier *netwatch.Applier // nil with plan
	Logger  *slog.Logger      // the program's log
	Stdout  io.Writer         // what the subcommand prints goes here

	g sync.WaitGroup
}

// Go runs f in a goroutine that the subcommand waits for once its context
// has ended, for a few seconds at most (then it says so in the log).
func (s *Session) Go(f func()) { s.g.Go(f) }

// Command is the subcommand of the command line, once Run has parsed it:
// build reads it to check only what the subcommand needs.
func (p *Program) Command() string { return p.cmd }

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
	if p.Version != "" && fs.Lookup("version") == nil {
		fs.BoolVar(&p.vers, "version", false, "print the version and exit")
	}
	p.cmd, p.own = cmdRun, nil
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case cmdRun, cmdOnce, cmdPlan, cmdCleanup:
			p.cmd, args = args[0], args[1:]
		case "help":
			return nil, flag.ErrHelp
		default:
			if p.own = p.command(args[0]); p.own == nil {
				return nil, fmt.Errorf("unknown command %q (want %s)", args[0], p.commandList(" or "))
			}
			p.cmd, args = args[0], args[1:]
			addFlags(fs, p.own.Flags)
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
		if a := fs.Arg(0); a == cmdRun || a == cmdOnce || a == cmdPlan || a == cmdCleanup || p.command(a) != nil {
			return nil, fmt.Errorf("unexpected argument %q: the command comes first (%s %s [flags])", a, p.Name, a)
		}
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case p.vers:
		return nil, nil
	case p.Resync < 0:
		return nil, fmt.Errorf("--resync %v: must not be negative", p.Resync)
	case p.Resync > 0 && p.Resync < minResync:
		return nil, fmt.Errorf("--resync %v: below the floor of %v (0 disables it)", p.Resync, minResync)
	}
	policy, err := build()
	if err != nil {
		return nil, err
	}
	// After build, which may set AllowShared from a flag of its own.
	for _, n := range []string{p.Table.Shared(), p.Priority.Shared()} {
		if n != "" && !p.AllowShared && (p.own == nil || p.own.Watch) {
			return nil, fmt.Errorf("%s: %s would remove what is there; choose another", n, p.Name)
		}
	}
	return policy, nil
}

// command returns the Command named name, or nil.
func (p *Program) command(name string) *Command {
	for i := range p.Commands {
		if p.Commands[i].Name == name {
			return &p.Commands[i]
		}
	}
	return nil
}

// commandList lists the subcommands: "run, once, plan or cleanup".
func (p *Program) commandList(last string) string {
	names := []string{cmdRun, cmdOnce, cmdPlan, cmdCleanup}
	for _, c := range p.Commands {
		names = append(names, c.Name)
	}
	return strings.Join(names[:len(names)-1], ", ") + last + names[len(names)-1]
}

// usage writes the help: the usage line, the subcommands, the program's
// Help, the flags (the Commands' among them).
func (p *Program) usage(w io.Writer) {
	u := strings.TrimPrefix(strings.TrimSuffix(strings.TrimSpace(p.Usage), "[flags]"), p.Name+" ")
	if u != "" && !strings.HasSuffix(u, " ") {
		u += " "
	}
	fmt.Fprintf(w, "usage: %s [%s] %s[flags]\n\n", p.Name, strings.ReplaceAll(p.commandList(", "), ", ", "|"), u)
	fmt.Fprintf(w, "  run      keep the kernel at the policy until SIGINT or SIGTERM (the default)\n")
	fmt.Fprintf(w, "  once     one pass: apply, print each change, exit 0 when converged\n")
	fmt.Fprintf(w, "  plan     print the changes a pass would make; change nothing\n")
	fmt.Fprintf(w, "  cleanup  remove every route and rule %s owns\n", p.Name)
	fs := flag.NewFlagSet(p.Name, flag.ContinueOnError)
	addFlags(fs, func(fs *flag.FlagSet) { p.Flags().VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) }) })
	for _, c := range p.Commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.Name, strings.ReplaceAll(c.Usage, "\n", "\n           "))
		addFlags(fs, c.Flags)
	}
	if h := strings.TrimSpace(p.Help); h != "" {
		fmt.Fprintf(w, "\n%s\n", h)
	}
	fmt.Fprintf(w, "\nFlags:\n")
	PrintFlags(w, fs)
}

// addFlags defines on fs the flags that add defines, but for those fs
// already has.
func addFlags(fs *flag.FlagSet, add func(*flag.FlagSet)) {
	if add == nil {
		return
	}
	more := flag.NewFlagSet("", flag.ContinueOnError)
	add(more)
	more.VisitAll(func(f *flag.Flag) {
		if fs.Lookup(f.Name) == nil {
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
}
