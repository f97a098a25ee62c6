//go:build linux

package fakekernel

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The kernel's multicast congestion (af_netlink.c): an overflow sets
// NETLINK_S_CONGESTED and reports ENOBUFS once; while the flag is set
// every event for the socket is dropped, silently, even when its queue has
// room again; reading the queue empty clears it. A watcher that resyncs on
// the socket that overflowed therefore loses what changes while it drains
// the old queue. TestKernelCongestion and TestCongestion run one scenario
// on the kernel and on the fake and expect the same trace.

// congestionTrace runs the congestion scenario on a multicast socket sub
// whose receive buffer holds a few route events: add(i) adds route i and
// returns once the kernel (or the fake) has sent its event; receive reads
// one datagram. It returns what the socket gave, in order: "ENOBUFS", or
// the number of the route an event was about; "empty" when nothing was
// left.
func congestionTrace(t *testing.T, add func(i int), receive func() (msgs []netlink.Message, err error, empty bool), route func(netlink.Message) int) []string {
	t.Helper()
	var trace []string
	read := func() bool {
		msgs, err, empty := receive()
		switch {
		case empty:
			trace = append(trace, "empty")
			return false
		case errors.Is(err, unix.ENOBUFS):
			trace = append(trace, "ENOBUFS")
		case err != nil:
			t.Fatal(err)
		}
		for _, m := range msgs {
			trace = append(trace, fmt.Sprint(route(m)))
		}
		return true
	}
	for i := range 64 {
		add(i) // overflows after a few
	}
	read() // the overflow
	read() // one queued event: the queue is not empty yet
	add(100)
	for read() { // drain: route 100 was dropped although there was room
	}
	add(101) // the queue was read empty: events come again
	read()
	return trace
}

func TestKernelCongestion(t *testing.T) {
	ns := newNS(t)
	runIP(t, ns, "link", "set", "dev", "lo", "up")
	sub, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: ns.FD(), Groups: 1 << (unix.RTNLGRP_IPV4_ROUTE - 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	trace := congestionTrace(t,
		func(i int) { runIP(t, ns, "route", "add", fmt.Sprintf("10.%d.%d.0/24", i/256, i%256), "dev", "lo") },
		func() ([]netlink.Message, error, bool) {
			sub.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			msgs, err := sub.Receive()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, nil, true
			}
			return msgs, err, false
		},
		routeNumber)
	checkCongestion(t, trace)
}

// checkCongestion checks a trace of congestionTrace: the overflow, the
// events that fitted (0, 1, ... in order), nothing of route 100, then
// route 101.
func checkCongestion(t *testing.T, trace []string) {
	t.Helper()
	ok := len(trace) > 4 && trace[0] == "ENOBUFS" && trace[len(trace)-2] == "empty" && trace[len(trace)-1] == "101"
	for i, s := range trace[1 : len(trace)-2] {
		ok = ok && s == fmt.Sprint(i)
	}
	if !ok {
		t.Fatalf("trace %v, want ENOBUFS, the events that fitted from 0, empty, 101", trace)
	}
}

func TestCongestion(t *testing.T) {
	k := newKernel(t)
	lo := k.AddLink("eth0", "veth", 1500, true)
	sub := dialFake(t, k, []uint32{unix.RTNLGRP_IPV4_ROUTE}, 4096)
	trace := congestionTrace(t,
		func(i int) {
			r := Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i / 256), byte(i % 256), 0}), 24), Index: lo, Scope: unix.RT_SCOPE_LINK}
			if err := k.AddRoute(r); err != nil {
				t.Fatal(err)
			}
		},
		func() ([]netlink.Message, error, bool) {
			if !sub.sock.pending() {
				return nil, nil, true
			}
			var msgs []netlink.Message
			for m, err := range sub.ReceiveIter() {
				if err != nil {
					return nil, err, false
				}
				msgs = append(msgs, m)
			}
			return msgs, nil, false
		},
		routeNumber)
	checkCongestion(t, trace)
}

// routeNumber returns i of the event about 10.i/256.i%256.0/24.
func routeNumber(m netlink.Message) int {
	var rm rtnetlink.RouteMessage
	if err := rm.UnmarshalBinary(m.Data); err != nil || rm.Attributes.Dst == nil {
		return -1
	}
	d := rm.Attributes.Dst.To4()
	return int(d[1])*256 + int(d[2])
}
