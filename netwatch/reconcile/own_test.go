package reconcile

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
)

// TestPlanRefusesReserved holds Plan to what a program may own, whatever
// path the scope took: a typo in a config must not cut a node off. Each
// case is one that planned the removal of the kernel's own routes or rules
// before Plan checked the scope.
func TestPlanRefusesReserved(t *testing.T) {
	gw := netip.MustParseAddr("192.0.2.1")
	host := netwatch.Snapshot{
		Links: []netwatch.Link{{Index: 2, Name: "eth0", MTU: 1500}},
		Routes: []netwatch.Route{
			{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: gw, Index: 2, Type: netwatch.RouteUnicast, Protocol: netwatch.ProtoDHCP},
			{Family: netwatch.IPv4, Table: netwatch.TableLocal, Dst: netip.MustParsePrefix("192.0.2.5/32"), Index: 2, Type: netwatch.RouteLocal, Scope: netwatch.ScopeHost, Protocol: netwatch.ProtoKernel},
		},
		Rules: []netwatch.Rule{
			{Family: netwatch.IPv4, Priority: 0, Table: netwatch.TableLocal, Action: netwatch.ActionToTable},
			{Family: netwatch.IPv4, Priority: 32766, Table: netwatch.TableMain, Action: netwatch.ActionToTable},
			{Family: netwatch.IPv4, Priority: 32767, Table: 253, Action: netwatch.ActionToTable},
		},
	}
	for _, tt := range []struct {
		name string
		own  Owned
		want string
	}{
		{"Own(TableMain, 0)", Own(OwnTable(netwatch.TableMain), 0), "table 254 is reserved"},
		{"Own(0, 32766)", Own(0, 32766), "priority 32766 is at or after"},
		{"Own(255, 0)", Own(255, 0), "table 255 is reserved"},
		{"Own(253, 0)", Own(253, 0), "table 253 is reserved"},
		{"Own(252, 0)", Own(252, 0), "table 252 is reserved"},
		{"Own(0, 32767)", Own(0, 32767), "priority 32767 is at or after"},
		{"Own(900, 32767)", Own(900, 32767), "priority 32767 is at or after"},
		{"main, IPv4 only", Own(OwnTable(netwatch.TableMain), 900).Only(netwatch.IPv4), "table 254 is reserved"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ops, err := Plan(host.View(), Desired{Own: tt.own})
			var pe *PlanError
			if !errors.As(err, &pe) || ops != nil {
				t.Fatalf("Plan = %v, %v; want no operations and a *PlanError", ops, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want …%s…", err, tt.want)
			}
		})
	}
	// Priority 0 cannot be owned at all: Own leaves a zero out, and a
	// hand-built Owned owns nothing.
	for _, o := range []Owned{Own(0, 0), {}} {
		ops, err := Plan(host.View(), Desired{Own: o})
		if err != nil || len(ops) != 0 {
			t.Errorf("Plan(%+v) = %v, %v; want nothing to do", o, ops, err)
		}
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
