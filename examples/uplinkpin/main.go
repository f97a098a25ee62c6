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

// command is uplinkpin's command line: the standard flags, and --uplink
// and --mark into c; build checks them and returns the policy. The policy
// reads the main table too.
func command(c *Config) (*program.Program, func() (func(netwatch.View) (reconcile.Desired, bool), error)) {
	p := &program.Program{Name: "uplinkpin", Usage: "--uplink LINK --mark MARK/MASK",
		Table: 920, Priority: 920, Protocol: 242, Cache: []netwatch.Table{netwatch.TableMain}}
	*c = Config{}
	var mark reconcile.MarkMask
	p.Flags().Var((*reconcile.LinkName)(&c.Uplink), "uplink", "the `link` marked packets leave by (required)")
	p.Flags().Var(&mark, "mark", "`MARK/MASK` of the packets to pin (required)")
	return p, func() (func(netwatch.View) (reconcile.Desired, bool), error) {
		if c.Uplink == "" || mark == (reconcile.MarkMask{}) {
			return nil, errors.New("--uplink and --mark are required: the link marked packets leave by, and their MARK/MASK")
		}
		c.Mark, c.Mask = mark.Mark, mark.Mask
		c.Table, c.Priority, c.Protocol = netwatch.Table(p.Table), uint32(p.Priority), netwatch.Protocol(p.Protocol)
		return func(v netwatch.View) (reconcile.Desired, bool) { return c.Desired(v), true }, nil
	}
}
