package mtupolicy_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
)

func TestDefaultConfig(t *testing.T) {
	want := mtupolicy.Config{TunnelLink: "cilium_wg0", Mark: 0xe00, Mask: 0xf00, Table: 900, Priority: 900,
		Protocol: 109, Repair: true}
	if diff := cmp.Diff(want, mtupolicy.DefaultConfig(), cmpNet); diff != "" {
		t.Errorf("DefaultConfig (-want +got):\n%s", diff)
	}
	if err := mtupolicy.DefaultConfig().Validate(); err == nil || !strings.Contains(err.Error(), "nothing selected") {
		t.Errorf("DefaultConfig().Validate() = %v, want the empty selection refused", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*mtupolicy.Config)
		want   string // "" for valid
	}{
		{name: "prefixes", change: func(*mtupolicy.Config) {}},
		{name: "underlay link only", change: func(c *mtupolicy.Config) { c.Prefixes, c.UnderlayLink = nil, "enp7s0" }},
		{name: "both", change: func(c *mtupolicy.Config) { c.UnderlayLink = "enp7s0" }},
		{name: "IPv6 prefix", change: func(c *mtupolicy.Config) { c.Prefixes = []netip.Prefix{pfx("2001:db8::/32")} }},
		{name: "mask equal to the mark", change: func(c *mtupolicy.Config) { c.Mark, c.Mask = 0xe00, 0xe00 }},
		{name: "full mask", change: func(c *mtupolicy.Config) { c.Mask = 0xffffffff }},
		{name: "peers", change: func(c *mtupolicy.Config) { c.Prefixes, c.Peers = nil, true }},
		{name: "peers and prefixes", change: func(c *mtupolicy.Config) { c.Peers = true }, want: "mtupolicy: peers select the table's routes themselves"},
		{name: "peers and an underlay link", change: func(c *mtupolicy.Config) { c.Prefixes, c.UnderlayLink, c.Peers = nil, "enp7s0", true }, want: "no prefixes or underlay link with them"},
		{name: "table above 255", change: func(c *mtupolicy.Config) { c.Table = 100000 }},
		{name: "protocol static", change: func(c *mtupolicy.Config) { c.Protocol = netwatch.ProtoStatic }},

		{name: "empty selection", change: func(c *mtupolicy.Config) { c.Prefixes = nil }, want: "mtupolicy: nothing selected"},
		{name: "table 0", change: func(c *mtupolicy.Config) { c.Table = 0 }, want: "mtupolicy: table 0 is reserved"},
		{name: "table 252", change: func(c *mtupolicy.Config) { c.Table = 252 }, want: "mtupolicy: table 252 is reserved"},
		{name: "table 253", change: func(c *mtupolicy.Config) { c.Table = 253 }, want: "mtupolicy: table 253 is reserved"},
		{name: "table main", change: func(c *mtupolicy.Config) { c.Table = 254 }, want: "mtupolicy: table 254 is reserved"},
		{name: "table local", change: func(c *mtupolicy.Config) { c.Table = 255 }, want: "mtupolicy: table 255 is reserved"},
		{name: "priority 0", change: func(c *mtupolicy.Config) { c.Priority = 0 }, want: "mtupolicy: priority 0 is the kernel's local rule"},
		{name: "priority 32766", change: func(c *mtupolicy.Config) { c.Priority = 32766 }, want: "mtupolicy: priority 32766 is at or after the main table's rule"},
		{name: "priority 32767", change: func(c *mtupolicy.Config) { c.Priority = 32767 }, want: "mtupolicy: priority 32767 is at or after the main table's rule"},
		{name: "priority 40000", change: func(c *mtupolicy.Config) { c.Priority = 40000 }, want: "mtupolicy: priority 40000 is at or after the main table's rule (32766)"},
		{name: "mask does not cover the mark", change: func(c *mtupolicy.Config) { c.Mark, c.Mask = 0x1e00, 0xf00 }, want: "mtupolicy: mask 0xf00 does not cover mark 0x1e00 (bits 0x1000 outside it)"},
		{name: "mask 0", change: func(c *mtupolicy.Config) { c.Mask = 0 }, want: "mtupolicy: mask 0 matches every packet"},
		{name: "mark 0", change: func(c *mtupolicy.Config) { c.Mark = 0 }, want: "mtupolicy: mark 0/0xf00"},
		{name: "protocol kernel", change: func(c *mtupolicy.Config) { c.Protocol = netwatch.ProtoKernel }},
		{name: "protocol boot", change: func(c *mtupolicy.Config) { c.Protocol = netwatch.ProtoBoot }, want: "mtupolicy: protocol 3 means something to the kernel"},
		{name: "protocol unspec", change: func(c *mtupolicy.Config) { c.Protocol = 0 }, want: "mtupolicy: protocol 0"},
		{name: "prefix with host bits", change: func(c *mtupolicy.Config) { c.Prefixes = []netip.Prefix{pfx("10.0.0.5/16")} }, want: "mtupolicy: prefix 10.0.0.5/16 has host bits set: did you mean 10.0.0.0/16?"},
		{name: "zero prefix", change: func(c *mtupolicy.Config) { c.Prefixes = []netip.Prefix{{}} }, want: "mtupolicy: prefix invalid Prefix is not valid"},
		{name: "4in6 prefix", change: func(c *mtupolicy.Config) { c.Prefixes = []netip.Prefix{pfx("::ffff:10.0.0.0/104")} }, want: "write the IPv4 form"},
		{name: "no tunnel link", change: func(c *mtupolicy.Config) { c.TunnelLink = "" }, want: "mtupolicy: no tunnel link"},
		{name: "tunnel link name too long", change: func(c *mtupolicy.Config) { c.TunnelLink = "cilium_wg0_toolong" }, want: "longer than 15 bytes"},
		{name: "underlay link name too long", change: func(c *mtupolicy.Config) { c.UnderlayLink = "enp7s0enp7s0enp7s0" }, want: "longer than 15 bytes"},
		{name: "underlay link is the tunnel link", change: func(c *mtupolicy.Config) { c.UnderlayLink = "cilium_wg0" }, want: "is the tunnel link"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := config()
			tt.change(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			case err != nil && strings.Contains(err.Error(), "\n"):
				t.Errorf("Validate() = %q: want one line", err)
			}
			// An invalid config never yields anything to plan (nor does
			// Desired for peers: DesiredPeers is their policy).
			if _, ok := mtupolicy.Desired(node().View(), c, mtupolicy.ModeOn); ok != (err == nil && !c.Peers) {
				t.Errorf("Desired ok = %v with Validate() = %v", ok, err)
			}
		})
	}
}
