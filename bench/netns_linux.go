//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// netNS is a fresh anonymous network namespace, held by a goroutine
// locked to an OS thread that lives in it. Children enter it with
// nsenter --net=Path(); it goes away with Close or with the process.
type netNS struct {
	fd   int
	path string
	work chan func()
	done chan struct{}
}

func newNetNS() (*netNS, error) {
	ns := &netNS{work: make(chan func()), done: make(chan struct{})}
	errc := make(chan error, 1)
	goLocked(func() {
		defer close(ns.done)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		tid := unix.Gettid()
		fd, err := unix.Open("/proc/self/task/"+strconv.Itoa(tid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open network namespace handle: %w", err)
			return
		}
		ns.fd = fd
		ns.path = "/proc/" + strconv.Itoa(os.Getpid()) + "/task/" + strconv.Itoa(tid) + "/ns/net"
		errc <- nil
		for fn := range ns.work {
			fn()
		}
	})
	if err := <-errc; err != nil {
		<-ns.done
		return nil, err
	}
	return ns, nil
}

// goLocked runs fn on a new goroutine locked to an OS thread other than
// the main one; the thread is never unlocked, so it ends with fn and takes
// the namespace it unshared with it.
func goLocked(fn func()) { go runLocked(fn, nil) }

func runLocked(fn func(), locked chan<- struct{}) {
	runtime.LockOSThread()
	if locked != nil {
		close(locked)
	}
	if unix.Gettid() == unix.Getpid() {
		next := make(chan struct{})
		go runLocked(fn, next)
		<-next
		runtime.UnlockOSThread()
		return
	}
	fn()
}

// Close releases the namespace: its thread exits and the handle is closed.
func (ns *netNS) Close() {
	close(ns.work)
	<-ns.done
	unix.Close(ns.fd)
}

// Path names the namespace for nsenter --net=PATH.
func (ns *netNS) Path() string { return ns.path }

// Do runs fn on the thread that lives in the namespace: sockets it opens
// belong to the namespace and may be used from any goroutine afterwards.
func (ns *netNS) Do(fn func() error) error {
	var err error
	ran := make(chan struct{})
	ns.work <- func() {
		defer close(ran)
		err = fn()
	}
	<-ran
	return err
}

// command returns name with args to be run inside the namespace; it is
// killed when ctx ends.
func (ns *netNS) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + ns.path, name}, args...)...)
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
func kernelUnavailable() string {
	if os.Geteuid() != 0 {
		return "not running as root"
	}
	for _, bin := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found in PATH"
		}
	}
	ns, err := newNetNS()
	if err != nil {
		return err.Error()
	}
	ns.Close()
	return ""
}

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
