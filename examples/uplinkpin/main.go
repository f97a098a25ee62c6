//go:build linux

package main

import (
	"errors"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

func main() {
	c := newCommand()
	c.Main(c.policy)
}

// command is the standard flags, --uplink and --mark; it caches main too.
type command struct {
	*reconcile.Program
	cfg  Config
	mark reconcile.MarkMask
}

func newCommand() *command {
	c := &command{Program: &reconcile.Program{Name: "uplinkpin", Usage: "uplinkpin --uplink LINK --mark MARK/MASK",
		Table: 920, Priority: 920, Protocol: 242, Cache: []netwatch.Table{netwatch.TableMain},
		Reconciler: &reconcile.Reconciler{Describe: netwatch.Op.DescribeWhole}}}
	c.Flags().Var((*reconcile.LinkName)(&c.cfg.Uplink), "uplink", "the `link` marked packets leave by (required)")
	c.Flags().Var(&c.mark, "mark", "`MARK/MASK` of the packets to pin (required)")
	return c
}

// policy checks what the flags cannot, and returns the policy.
func (c *command) policy() (func(netwatch.View) (reconcile.Desired, bool), error) {
	if c.cfg.Uplink == "" || c.mark == (reconcile.MarkMask{}) {
		return nil, errors.New("--uplink and --mark are required: the link marked packets leave by, and their MARK/MASK")
	}
	c.cfg.Mark, c.cfg.Mask, c.cfg.Table, c.cfg.Priority, c.cfg.Protocol = c.mark.Mark, c.mark.Mask, netwatch.Table(c.Table), uint32(c.Priority), netwatch.Protocol(c.Protocol)
	return func(v netwatch.View) (reconcile.Desired, bool) { return c.cfg.Desired(v), true }, nil
}
