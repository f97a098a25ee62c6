//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"

	"github.com/marksplit/marksplit/internal/nstest"
)

// netNS is a fresh anonymous network namespace (nstest's, which the test
// kit's NetNS also holds). Children enter it with nsenter --net=Path(); it
// goes away with Close or with the process.
type netNS struct{ *nstest.NS }

func newNetNS() (*netNS, error) {
	ns, err := nstest.New()
	if err != nil {
		return nil, err
	}
	return &netNS{ns}, nil
}

// command returns name with args to be run inside the namespace; it is
// killed when ctx ends.
func (ns *netNS) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + ns.Path(), name}, args...)...)
}

// ip runs ip(8) in the namespace.
func (ns *netNS) ip(args ...string) error {
	cmd := ns.command(context.Background(), "ip", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %q: %w: %s", args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// kernelUnavailable says why namespaces cannot be made here, or "".
func kernelUnavailable() string { return nstest.Unavailable() }

// topo is the seed topology of the agent's end-to-end tests: a node
// namespace with enp7s0 (veth, MTU 1450, 10.0.0.5/16, no prefix route) to
// a gateway namespace holding 10.0.0.1/16, the DHCP client's routes (the
// gateway on link; 10.0.0.0/16 via it, lowered to 1355 by the old
// approach), and cilium_wg0 (tun, MTU 1355, up).
type topo struct {
	node, gw *netNS
	oif      uint32 // enp7s0's index
}

func newTopo() (_ *topo, err error) {
	t := &topo{}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if t.node, err = newNetNS(); err != nil {
		return nil, err
	}
	if t.gw, err = newNetNS(); err != nil {
		return nil, err
	}
	// IPv6 link-local addresses would otherwise appear (and add their
	// routes) a second or two after the veth comes up, when DAD ends:
	// the table must hold still between a count and a measurement.
	for _, ns := range []*netNS{t.node, t.gw} {
		if err := ns.Do(func() error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/default/accept_dad", []byte("0"), 0)
		}); err != nil {
			return nil, fmt.Errorf("disable DAD: %w", err)
		}
	}
	steps := []struct {
		ns   *netNS
		args string
	}{
		{t.node, "link set lo up"},
		{t.gw, "link set lo up"},
		{t.node, "link add name enp7s0 mtu 1450 type veth peer name gw0 mtu 1450 netns " + t.gw.Path()},
		{t.gw, "addr add 10.0.0.1/16 dev gw0"},
		{t.gw, "link set gw0 up"},
		{t.node, "addr add 10.0.0.5/16 dev enp7s0 noprefixroute"},
		{t.node, "link set enp7s0 up"},
		{t.node, "route add 10.0.0.1 dev enp7s0 proto dhcp scope link src 10.0.0.5"},
		{t.node, "route add 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5 mtu 1355"},
		{t.node, "tuntap add mode tun name cilium_wg0"},
		{t.node, "link set cilium_wg0 mtu 1355 up"},
	}
	for _, s := range steps {
		if err := s.ns.ip(strings.Fields(s.args)...); err != nil {
			return nil, err
		}
	}
	err = t.node.Do(func() error {
		ifi, err := net.InterfaceByName("enp7s0")
		if err != nil {
			return err
		}
		t.oif = uint32(ifi.Index)
		return nil
	})
	return t, err
}

// Close removes both namespaces (and with them the links, routes and rules).
// It is safe to call twice.
func (t *topo) Close() {
	if t.node != nil {
		t.node.Close()
		t.node = nil
	}
	if t.gw != nil {
		t.gw.Close()
		t.gw = nil
	}
}
