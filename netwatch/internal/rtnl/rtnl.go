// Package rtnl is netwatch's transport seam: the part of an rtnetlink
// socket netwatch uses, so that netwatch/netwatchtest's fake kernel can stand in
// for the real one in this module's tests. Programs never need it: a
// netwatch.NetNS that the fake kernel did not hand out dials the kernel.
package rtnl

import (
	"iter"
	"time"

	"github.com/mdlayher/netlink"
)

// Conn is the part of a *netlink.Conn that netwatch uses. The real kernel
// and netwatch/netwatchtest's fake kernel both provide it.
type Conn interface {
	// Execute sends a request and returns its replies; an error reply is
	// returned as a *netlink.OpError.
	Execute(m netlink.Message) ([]netlink.Message, error)
	// Send sends a request without waiting, to start a dump.
	Send(m netlink.Message) (netlink.Message, error)
	// ReceiveIter yields the messages of one datagram, or of a whole
	// multi-part dump; the final DONE message is not yielded.
	ReceiveIter() iter.Seq2[netlink.Message, error]
	// ReceiveDatagram reads one datagram, as it came, into b or, when it
	// is longer, into a new buffer, and returns it. Dumps are read this
	// way: a million routes arrive without a Message each.
	ReceiveDatagram(b []byte) ([]byte, error)
	// ReceiveBatch waits for a datagram, then reads every datagram queued
	// without waiting again, appending them to b as they came (netlink
	// messages are self-delimiting, so the result reads as one stream of
	// messages). It stops once it read about 256 KiB, which bounds a
	// round. It returns what it read and, when a read failed after some
	// data (ENOBUFS), that error with it.
	ReceiveBatch(b []byte) ([]byte, error)
	// SetReadDeadline unblocks a pending receive.
	SetReadDeadline(t time.Time) error
	// PID is the socket's netlink port ID: replies to its own requests
	// carry it.
	PID() uint32
	Close() error
}

// DialConfig says what kind of socket Dial opens.
type DialConfig struct {
	// Groups are the rtnetlink multicast groups (RTNLGRP_* numbers) to
	// join. Empty for a request socket.
	Groups []uint32
	// ReadBuffer is the receive buffer size in bytes; 0 keeps the default.
	ReadBuffer int
	// MessageBuffer is the largest datagram the socket's Receive and
	// Execute read, in bytes; 0 is the dialer's default, which fits any
	// dump. A request socket that only reads acknowledgements asks for
	// less: the buffers come from a pool that the garbage collector
	// empties, and each one it misses is allocated whole.
	MessageBuffer int
}

// Dialer opens rtnetlink sockets.
type Dialer interface {
	Dial(cfg DialConfig) (Conn, error)
}
