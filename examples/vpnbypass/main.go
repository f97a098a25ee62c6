//go:build linux

package main

import (
	"errors"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/program"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

func main() {
	var c Config
	p, build := command(&c)
	p.Main(build)
}

// command is vpnbypass's command line: the standard flags, and --prefix,
// --link and --mark into c; build checks them and returns the policy. The
// policy reads no route table but its own.
func command(c *Config) (*program.Program, func() (func(netwatch.View) (reconcile.Desired, bool), error)) {
	p := &program.Program{Name: "vpnbypass", Usage: "--prefix CIDR [--prefix CIDR...]",
		Table: 910, Priority: 910, Protocol: 241}
	*c = Config{Link: "tailscale0"}
	mark := reconcile.MarkMask{Mark: 0x80000, Mask: 0xff0000}
	p.Flags().Var((*reconcile.Prefixes)(&c.Prefixes), "prefix", "`CIDR` to send through the VPN link (repeatable, at least one)")
	p.Flags().Var((*reconcile.LinkName)(&c.Link), "link", "the VPN `link`")
	p.Flags().Var(&mark, "mark", "`MARK/MASK` the VPN puts on its own packets; they bypass the table")
	return p, func() (func(netwatch.View) (reconcile.Desired, bool), error) {
		if len(c.Prefixes) == 0 {
			return nil, errors.New("--prefix is required: the CIDRs to send through the VPN link (repeatable)")
		}
		c.Mark, c.Mask = mark.Mark, mark.Mask
		c.Table, c.Priority, c.Protocol = netwatch.Table(p.Table), uint32(p.Priority), netwatch.Protocol(p.Protocol)
		return func(v netwatch.View) (reconcile.Desired, bool) { return c.Desired(v), true }, nil
	}
}
