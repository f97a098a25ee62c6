//go:build linux

package program

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// TestProgramRefuses: a command line that would burn a core (--resync=1ns,
// issue 38 PF2) or own what Cilium or Tailscale keep (issue 38 PS1: a
// program removed Cilium's "fwmark 0x200/0xf00 lookup 2004") exits 2 with
// one line, before anything runs; AllowShared lets the program own a
// shared table or priority, and build may set it (the agent's
// --allow-shared). The rest runs plan on a fake kernel: exit 0, nothing
// to print.
func TestProgramRefuses(t *testing.T) {
	k := netwatchtest.New()
	t.Cleanup(func() { k.Close() })
	for _, tt := range []struct {
		args   string
		allow  bool
		want   string // the one line; "" for none
		wantRC int
	}{
		{"--resync=1ns", false, "p: --resync 1ns: below the floor of 10s (0 disables it)", 2},
		{"--resync=9s", false, "below the floor of 10s", 2},
		{"--resync=10s", false, "", 0},
		{"--resync=0", false, "", 0},
		{"--table=2004", false, "p: Cilium's table 2004: p would remove what is there; choose another", 2},
		{"--table=52", false, "Tailscale's table 52", 2},
		{"--priority=100", false, "Cilium's rule priority 100", 2},
		{"--priority=5240", false, "Tailscale's rule priority 5240", 2},
		{"--table=2004 --priority=100", true, "", 0},
		{"--table=2006 --priority=101", false, "", 0},
	} {
		t.Run(tt.args, func(t *testing.T) {
			p := &Program{Name: "p", Table: 900, Priority: 900, NetNS: k.NetNS()}
			build := func() (func(netwatch.View) (reconcile.Desired, bool), error) {
				p.AllowShared = tt.allow
				own := reconcile.Own(p.Table, p.Priority)
				return func(netwatch.View) (reconcile.Desired, bool) { return reconcile.Desired{Own: own}, true }, nil
			}
			var out strings.Builder
			rc := p.Run(context.Background(), append([]string{"plan"}, strings.Fields(tt.args)...), &out, &out, build)
			lines := 1
			if tt.want == "" {
				lines = 0
			}
			if rc != tt.wantRC || !strings.Contains(out.String(), tt.want) || strings.Count(out.String(), "\n") != lines {
				t.Errorf("exit %d, output %q; want %d and %d line containing %q", rc, out.String(), tt.wantRC, lines, tt.want)
			}
		})
	}
}

// TestHelp holds every program's help to one style: the usage line with
// the subcommands, and each flag, the program's own too, with two dashes.
func TestHelp(t *testing.T) {
	p := &Program{Name: "pin", Usage: "--link LINK", Table: 920, Priority: 920, Protocol: 242}
	p.Flags().String("link", "", "the `link` to pin to")
	var out strings.Builder
	if rc := p.Run(context.Background(), []string{"--help"}, &out, &out, nil); rc != 0 {
		t.Fatalf("--help: exit %d", rc)
	}
	help := out.String()
	if !strings.HasPrefix(help, "usage: pin [run|once|plan|cleanup] --link LINK [flags]\n") {
		t.Errorf("help begins %q", strings.SplitN(help, "\n", 2)[0])
	}
	for _, f := range []string{"--link link\n", "--netns path\n", "--priority priority\n", "--protocol value\n", "--resync duration\n", "--table table\n"} {
		if !strings.Contains(help, "  "+f) {
			t.Errorf("help has no %q:\n%s", f, help)
		}
	}
	for l := range strings.Lines(help) {
		if strings.HasPrefix(strings.TrimSpace(l), "-") && !strings.HasPrefix(strings.TrimSpace(l), "--") {
			t.Errorf("help line %q names a flag with one dash", l)
		}
	}
	if !strings.Contains(help, "(default 920)") || !strings.Contains(help, "(default 5m0s)") {
		t.Errorf("help does not show the defaults:\n%s", help)
	}
}

// TestBadCommandLine: each bad command line exits 2 with one line naming
// the flag with two dashes, as the help does, before the policy is built.
func TestBadCommandLine(t *testing.T) {
	build := func() (func(netwatch.View) (reconcile.Desired, bool), error) {
		t.Error("build called")
		return nil, nil
	}
	for _, tt := range []struct{ args, want string }{
		{"--nope", "p: flag provided but not defined: --nope\n"},
		{"--table", "p: flag needs an argument: --table\n"},
		{"--table main", `p: invalid value "main" for flag --table: not a table number`},
		{"plan --resync x", `p: invalid value "x" for flag --resync: parse error`},
		{"pin", `p: unknown command "pin" (want run, once, plan or cleanup)` + "\n"},
		{"once extra", `p: unexpected argument "extra"` + "\n"},
	} {
		t.Run(tt.args, func(t *testing.T) {
			p := &Program{Name: "p", Table: 900, Priority: 900}
			var out strings.Builder
			rc := p.Run(context.Background(), strings.Fields(tt.args), &out, &out, build)
			if rc != 2 || !strings.HasPrefix(out.String(), tt.want) || strings.Count(out.String(), "\n") != 1 {
				t.Errorf("exit %d, output %q; want 2 and one line starting %q", rc, out.String(), tt.want)
			}
		})
	}
}

// TestSecondSignal: the first signal ends the context, as SIGTERM asks a
// program to stop; the second ends the program at once, with status 1 and
// one line.
func TestSecondSignal(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exited := make(chan int, 1)
	var out strings.Builder
	go signals("p", sigs, make(chan struct{}), cancel, &out, func(code int) { exited <- code })
	sigs <- syscall.SIGTERM
	<-ctx.Done()
	select {
	case code := <-exited:
		t.Fatalf("exit(%d) after one signal", code)
	default:
	}
	sigs <- syscall.SIGINT
	if code := <-exited; code != 1 || out.String() != "p: interrupt again: exiting at once\n" {
		t.Errorf("after the second signal: exit(%d), %q; want exit(1), one line", code, out.String())
	}
}
