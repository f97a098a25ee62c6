//go:build linux

package fakekernel

import (
	"net/netip"
	"sync/atomic"

	"github.com/mdlayher/netlink"
)

// Program is another program's rtnetlink socket. The Kernel's own methods
// (AddRoute, DelRule, …) stand for changes nobody asked for over netlink,
// whose events carry port 0 as the kernel's own do; a Program's changes
// are announced with its port and the sequence of a request, as the kernel
// announces a program's requests. Tests use it to tell apart who changed
// what (netwatch's Event.Origin).
type Program struct {
	k   *Kernel
	c   *FakeConn
	seq atomic.Uint32
}

// DialProgram opens a Program's socket.
func (k *Kernel) DialProgram() (*Program, error) {
	c, err := k.DialConn(nil, 0)
	if err != nil {
		return nil, err
	}
	return &Program{k: k, c: c}, nil
}

// Port is the program's netlink port: its events carry it.
func (p *Program) Port() uint32 { return p.c.PID() }

// Close closes the program's socket.
func (p *Program) Close() error { return p.c.Close() }

func (p *Program) origin() *origin { return &origin{s: p.c.sock, seq: p.seq.Add(1)} }

// AddRoute is Kernel.AddRoute as the program's request.
func (p *Program) AddRoute(r Route) error {
	return p.k.setRoute(r, netlink.Create|netlink.Excl, p.origin()).err("add route " + r.String())
}

// ReplaceRoute is Kernel.ReplaceRoute as the program's request.
func (p *Program) ReplaceRoute(r Route) error {
	return p.k.setRoute(r, netlink.Create|netlink.Replace, p.origin()).err("replace route " + r.String())
}

// DelRoute is Kernel.DelRoute as the program's request.
func (p *Program) DelRoute(r Route) error { return p.k.unsetRoute(r, p.origin()) }

// AddRule is Kernel.AddRule as the program's request.
func (p *Program) AddRule(r Rule) error { return p.k.addRule(r, p.origin()) }

// DelRule is Kernel.DelRule as the program's request.
func (p *Program) DelRule(r Rule) error { return p.k.removeRule(r, p.origin()) }

// AddAddr is Kernel.AddAddr as the program's request.
func (p *Program) AddAddr(index uint32, prefix netip.Prefix) error {
	return p.k.addAddr(index, prefix, p.origin())
}

// DelAddr is Kernel.DelAddr as the program's request.
func (p *Program) DelAddr(index uint32, prefix netip.Prefix) error {
	return p.k.removeAddrBy(index, prefix, p.origin())
}
