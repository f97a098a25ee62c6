//go:build linux

package netwatchtest

import (
	"fmt"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Behavior is what the fake kernel does where real kernels differ by
// version or build configuration. New uses DefaultBehavior; NewWith takes
// one, and NetNS.Behavior reads it from the running kernel, so a test that
// compares the fake with the real kernel compares like with like.
type Behavior struct {
	// MulticastRules: rule dumps include the default rules of the
	// multicast-routing families 128 and 129 (RTNL_FAMILY_IPMR,
	// RTNL_FAMILY_IP6MR), as kernels built with
	// CONFIG_IP_MROUTE_MULTIPLE_TABLES and CONFIG_IPV6_MROUTE_MULTIPLE_TABLES
	// show them. Without it a rule request of those families fails with
	// EAFNOSUPPORT, as there.
	MulticastRules bool
}

// DefaultBehavior is the behaviour of the distributions' kernels (Debian's
// 5.10, 6.1 and 6.12, and most others), which New follows.
var DefaultBehavior = Behavior{MulticastRules: true}

// Behavior asks the kernel of ns how it behaves where kernels differ, and
// fails the test if it cannot tell.
func (ns *NetNS) Behavior(t testing.TB) Behavior {
	t.Helper()
	b, err := probeBehavior(ns.fd)
	if err != nil {
		t.Fatalf("netwatchtest: probe the kernel's behaviour: %v", err)
	}
	return b
}

func probeBehavior(nsfd int) (Behavior, error) {
	var b Behavior
	c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: nsfd})
	if err != nil {
		return b, err
	}
	defer c.Close()
	// A fresh namespace's rule dump: the multicast-routing families'
	// default rules are there when the kernel has multiple tables for them.
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETRULE, Flags: netlink.Request | netlink.Dump},
		Data:   make([]byte, unix.SizeofRtMsg),
	})
	if err != nil {
		return b, fmt.Errorf("rule dump: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) > 0 && (m.Data[0] == familyIPMR || m.Data[0] == familyIP6MR) {
			b.MulticastRules = true
		}
	}
	return b, nil
}
