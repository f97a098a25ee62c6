package reconcile

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
)

// TestProgramRefuses: a command line that would burn a core (--resync=1ns,
// issue 38 PF2) or own what Cilium or Tailscale keep (issue 38 PS1: a
// program removed Cilium's "fwmark 0x200/0xf00 lookup 2004") exits 2 with
// one line, before the policy is built; AllowShared lets the program own
// a shared table or priority.
func TestProgramRefuses(t *testing.T) {
	built := errors.New("built")
	build := func() (func(netwatch.View) (Desired, bool), error) { return nil, built }
	for _, tt := range []struct {
		args   string
		allow  bool
		want   string // the one line, or "built" when it got as far as build
		wantRC int
	}{
		{"--resync=1ns", false, "p: --resync 1ns: below the floor of 10s (0 disables it)", 2},
		{"--resync=9s", false, "below the floor of 10s", 2},
		{"--resync=10s", false, "built", 2},
		{"--resync=0", false, "built", 2},
		{"--table=2004", false, "p: Cilium's table 2004: p would remove what is there; choose another", 2},
		{"--table=52", false, "Tailscale's table 52", 2},
		{"--priority=100", false, "Cilium's rule priority 100", 2},
		{"--priority=5240", false, "Tailscale's rule priority 5240", 2},
		{"--table=2004 --priority=100", true, "built", 2},
		{"--table=2006 --priority=101", false, "built", 2},
	} {
		t.Run(tt.args, func(t *testing.T) {
			p := &Program{Name: "p", Table: 900, Priority: 900, AllowShared: tt.allow}
			var out strings.Builder
			rc := p.Run(context.Background(), strings.Fields(tt.args), &out, build)
			if rc != tt.wantRC || !strings.Contains(out.String(), tt.want) || strings.Count(out.String(), "\n") != 1 {
				t.Errorf("exit %d, output %q; want %d and one line containing %q", rc, out.String(), tt.wantRC, tt.want)
			}
		})
	}
}

// TestShared pins the tables and priorities known programs keep.
func TestShared(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{OwnTable(2004).Shared(), "Cilium's table 2004"},
		{OwnTable(200).Shared(), "Cilium's table 200"},
		{OwnTable(52).Shared(), "Tailscale's table 52"},
		{OwnTable(203).Shared(), ""},
		{OwnTable(900).Shared(), ""},
		{OwnPriority(1).Shared(), "Cilium's rule priority 1"},
		{OwnPriority(111).Shared(), "Cilium's rule priority 111"},
		{OwnPriority(5210).Shared(), "Tailscale's rule priority 5210"},
		{OwnPriority(5271).Shared(), ""},
		{OwnPriority(900).Shared(), ""},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
