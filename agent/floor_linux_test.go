//go:build linux

package main

import (
	"encoding/binary"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/marksplit/marksplit/netwatch"
	"golang.org/x/sys/unix"
)

// floorEnv makes the test binary the floor repairer instead of running
// tests (TestMain).
const floorEnv = "MARKSPLIT_TEST_FLOOR_REPAIRER"

// floorRule is the floor repairer's rule: the agent's, at a priority and
// table of its own and stamped static, so that the agent leaves it alone
// and the two repair by turns in one namespace.
var floorRule = netwatch.Rule{Family: netwatch.IPv4, Priority: 950, Table: 950, Action: netwatch.ActionToTable,
	Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: netwatch.ProtoStatic}

// floorRepairer is the least a repairer of a rule can do, as a process
// of its own in the namespace: it reads the IPv4 rule notifications with
// a blocking recvfrom and, at a deletion of floorRule, sends the rule back
// in one prebuilt request — no cache, no plan, no log.
// BenchmarkKernelRuleRestore measures it beside the agent, by turns, as
// the reference: what the kernel, the scheduler and the listener cost on
// this machine at this moment. It says "ready" once it listens, and
// returns the exit code.
func floorRepairer() int {
	runtime.LockOSThread()
	mc, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return 1
	}
	if err := unix.Bind(mc, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.RTNLGRP_IPV4_RULE - 1)}); err != nil {
		return 1
	}
	req, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return 1
	}
	os.Stdout.WriteString("ready\n")
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		<-c
		os.Exit(0)
	}()
	// RTM_NEWRULE: not fwmark 0xe00/0xf00 lookup 950 pref 950 proto
	// static, floorRule.
	attr := func(b []byte, typ uint16, v uint32) []byte {
		b = binary.NativeEndian.AppendUint16(b, 8)
		b = binary.NativeEndian.AppendUint16(b, typ)
		return binary.NativeEndian.AppendUint32(b, v)
	}
	msg := make([]byte, unix.NLMSG_HDRLEN, 128)
	msg = append(msg, unix.AF_INET, 0, 0, 0, 0, 0, 0, unix.FR_ACT_TO_TBL)
	msg = binary.NativeEndian.AppendUint32(msg, unix.FIB_RULE_INVERT)
	msg = attr(msg, unix.FRA_PRIORITY, floorRule.Priority)
	msg = attr(msg, unix.FRA_TABLE, uint32(floorRule.Table))
	msg = attr(msg, unix.FRA_FWMARK, uint32(floorRule.Mark))
	msg = attr(msg, unix.FRA_FWMASK, uint32(floorRule.Mask))
	msg = append(msg, 5, 0, unix.FRA_PROTOCOL, 0, uint8(floorRule.Protocol), 0, 0, 0)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], unix.RTM_NEWRULE)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	buf := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(mc, buf, 0)
		if err != nil {
			continue // ENOBUFS: nothing to catch up on, the next deletion comes
		}
		for b := buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				break
			}
			if binary.NativeEndian.Uint16(b[4:]) == unix.RTM_DELRULE && rulePriority(b[unix.NLMSG_HDRLEN:l]) == floorRule.Priority {
				unix.Sendto(req, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
			}
			b = b[min((l+3)&^3, len(b)):]
		}
	}
}

// rulePriority reads FRA_PRIORITY from a fib_rule_hdr and its attributes.
func rulePriority(data []byte) uint32 {
	if len(data) < 12 {
		return 0
	}
	for a := data[12:]; len(a) >= 4; {
		l := int(binary.NativeEndian.Uint16(a))
		if l < 4 || l > len(a) {
			return 0
		}
		if binary.NativeEndian.Uint16(a[2:]) == unix.FRA_PRIORITY && l == 8 {
			return binary.NativeEndian.Uint32(a[4:])
		}
		a = a[min((l+3)&^3, len(a)):]
	}
	return 0
}
