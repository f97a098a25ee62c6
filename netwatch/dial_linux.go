//go:build linux

package netwatch

import (
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// KernelDialer dials the kernel's rtnetlink, in the network namespace NetNS
// (a file descriptor of /proc/.../ns/net) or, when NetNS is 0, in the
// calling thread's namespace.
type KernelDialer struct {
	NetNS int
}

// Dial opens a NETLINK_ROUTE socket with strict dump checking, joins
// cfg.Groups and sets the receive buffer.
func (d KernelDialer) Dial(cfg DialConfig) (Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: d.NetNS, Strict: true})
	if err != nil {
		return nil, fmt.Errorf("netwatch: dial rtnetlink: %w", err)
	}
	if err := c.SetOption(netlink.ExtendedAcknowledge, true); err != nil {
		c.Close()
		return nil, fmt.Errorf("netwatch: enable extended acks: %w", err)
	}
	for _, g := range cfg.Groups {
		if err := c.JoinGroup(g); err != nil {
			c.Close()
			return nil, fmt.Errorf("netwatch: join rtnetlink group %d: %w", g, err)
		}
	}
	if cfg.ReadBuffer > 0 {
		if err := c.SetReadBuffer(cfg.ReadBuffer); err != nil {
			c.Close()
			return nil, fmt.Errorf("netwatch: set receive buffer to %d bytes: %w", cfg.ReadBuffer, err)
		}
	}
	return c, nil
}
