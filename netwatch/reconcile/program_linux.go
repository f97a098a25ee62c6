//go:build linux

package reconcile

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/marksplit/marksplit/netwatch"
)

// Program is a command around a policy: the standard flags of a program
// that owns a table and a rule priority, and the loop that runs it. A
// program sets its name and defaults, adds its own flags to Flags (with
// the flag values of this package: MarkMask, LinkName, Prefixes), and
// hands Main a function that checks them and returns the policy:
//
//	p := &reconcile.Program{Name: "pin", Usage: "pin --link LINK", Table: 920, Priority: 920, Protocol: 242}
//	var link reconcile.LinkName
//	p.Flags().Var(&link, "link", "the `link` to pin to")
//	p.Main(func() (func(netwatch.View) (reconcile.Desired, bool), error) { … })
type Program struct {
	// Name begins every line the program prints: "pin: started".
	Name string
	// Usage follows "usage: " on the first line of -h.
	Usage string
	// Table, Priority and Protocol are the defaults of --table, --priority
	// and --protocol before Flags, and their values once parsed: what the
	// program owns, in both families, and stamps on what it installs. A
	// zero Table or Priority is not owned.
	Table    OwnTable
	Priority OwnPriority
	Protocol OwnProtocol
	// NetNS is --netns: the path of the network namespace to work in; ""
	// is the process's own.
	NetNS string
	// Resync is --resync: how often the kernel's state is re-read as a
	// safety net (0 never, else at least 10 s: a re-read of a full table
	// takes seconds). Its default is 5 minutes unless set before Flags.
	Resync time.Duration
	// AllowShared lets the program own a table or priority that a known
	// program keeps for itself (OwnTable.Shared, OwnPriority.Shared), which
	// Run otherwise refuses: owning Cilium's table 2004 removes Cilium's
	// routes there.
	AllowShared bool
	// Cache names the route tables the policy reads besides Table (such
	// as netwatch.TableMain); the cache holds no others.
	Cache []netwatch.Table
	// Reconciler, when set, is the loop Run runs, with its hooks and
	// tuning; Run sets its Watcher, Applier and Policy, its Resync, and its
	// Logger unless set.
	Reconciler *Reconciler

	fs *flag.FlagSet
}

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
	fs.Var(&p.Table, "table", "routing `table` owned by "+p.Name+", every route in it, both families: 1 to 4294967295, but not 252 to 255")
	fs.Var(&p.Priority, "priority", "rule `priority` owned by "+p.Name+", every rule at it, both families: 1 to 32765")
	fs.Var(&p.Protocol, "protocol", "routing `protocol` stamped on what "+p.Name+" installs: 2 (kernel) or 4 to 255, or an iproute2 name such as static")
	fs.StringVar(&p.NetNS, "netns", "", "network namespace, as a `path` (/run/netns/NAME, /proc/PID/ns/net); default: this process's")
	fs.DurationVar(&p.Resync, "resync", p.Resync, "re-read the kernel's state this often, as a safety net: at least 10s, or 0 to disable")
	p.fs = fs
	return fs
}

// Main runs the program on the command line until SIGINT or SIGTERM, and
// exits as Run says.
func (p *Program) Main(build func() (func(netwatch.View) (Desired, bool), error)) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := p.Run(ctx, os.Args[1:], os.Stderr, build)
	stop()
	os.Exit(code)
}

// Run is the whole program: it parses args, calls build for the policy,
// and runs the loop until ctx ends. It returns the exit code: 0 when ctx
// ends (and for -h, after the usage), 2 with one line naming the flag for
// a bad command line or an error of build, 1 with one line when it cannot
// start. Its log goes to stderr: a line per change, and the watcher's own
// lines only when they warn.
func (p *Program) Run(ctx context.Context, args []string, stderr io.Writer, build func() (func(netwatch.View) (Desired, bool), error)) int {
	fs := p.Flags()
	policy, err := p.parse(fs, args, build)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(stderr, "usage: %s [flags]\n", strings.TrimSuffix(p.Usage, " [flags]"))
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "%s: %s\n", p.Name, strings.ReplaceAll(err.Error(), "\n", " "))
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	wlog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := p.serve(ctx, policy, log, wlog); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", p.Name, err)
		return 1
	}
	return 0
}

func (p *Program) parse(fs *flag.FlagSet, args []string, build func() (func(netwatch.View) (Desired, bool), error)) (func(netwatch.View) (Desired, bool), error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
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

// serve runs the watcher and the loop in p.NetNS until ctx ends.
func (p *Program) serve(ctx context.Context, policy func(netwatch.View) (Desired, bool), log, wlog *slog.Logger) error {
	opts := netwatch.Options{RouteTables: p.Cache, Logger: wlog}
	if p.Table != 0 {
		opts.RouteTables = append([]netwatch.Table{netwatch.Table(p.Table)}, p.Cache...)
	}
	if p.NetNS != "" {
		ns, err := netwatch.OpenNetNS(p.NetNS)
		if err != nil {
			return err
		}
		defer ns.Close() // after the watcher and the applier, which use it
		opts.NetNS = ns
	}
	a, err := netwatch.DialApplier(opts.NetNS)
	if err != nil {
		return err
	}
	defer a.Close()
	w := netwatch.New(opts)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	r := p.Reconciler
	if r == nil {
		r = &Reconciler{}
	}
	r.Watcher, r.Applier, r.Policy, r.Resync = w, a, policy, p.Resync
	if r.Logger == nil {
		r.Logger = log
	}
	log.Info(p.Name+": started", "table", p.Table, "priority", p.Priority, "protocol", p.Protocol)
	return r.Run(ctx)
}
