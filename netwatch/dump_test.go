//go:build linux

package netwatch

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nlmsg builds one netlink message as the kernel puts it in a datagram.
func nlmsg(typ uint16, flags netlink.HeaderFlags, seq uint32, body []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body)+3)
	binary.NativeEndian.PutUint32(b[0:4], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint16(b[6:8], uint16(flags))
	binary.NativeEndian.PutUint32(b[8:12], seq)
	b = append(b, body...)
	return append(b, make([]byte, (4-len(body)%4)%4)...)
}

func errno(code unix.Errno) []byte {
	return binary.NativeEndian.AppendUint32(nil, uint32(-int32(code)))
}

// TestScanDump: the end of a dump, its interruption and the kernel's
// errors are read from a datagram's headers; broken framing is an error,
// never a silent end.
func TestScanDump(t *testing.T) {
	const seq = 7
	route := nlmsg(unix.RTM_NEWROUTE, netlink.Multi, seq, make([]byte, unix.SizeofRtMsg))
	// An error with the request's header echoed (capped) and the
	// extended acknowledgement's text.
	ack := append(errno(unix.EINVAL), nlmsg(unix.RTM_GETROUTE, netlink.Request|netlink.Dump, seq, nil)...)
	ack = append(ack, 4+14, 0, unix.NLMSGERR_ATTR_MSG, 0)
	ack = append(ack, "Invalid table\x00"...)
	ack = append(ack, 0, 0)
	for _, tc := range []struct {
		name      string
		d         []byte
		end, intr bool
		err       error  // matched with errors.Is
		msg       string // the extended acknowledgement's text
	}{
		{name: "parts", d: append(route, route...)},
		{name: "done", d: append(route, nlmsg(unix.NLMSG_DONE, netlink.Multi, seq, errno(0))...), end: true},
		{name: "done without a code", d: nlmsg(unix.NLMSG_DONE, netlink.Multi, seq, nil), end: true},
		{name: "interrupted", d: append(nlmsg(unix.RTM_NEWROUTE, netlink.Multi|netlink.DumpInterrupted, seq, nil), route...), intr: true},
		{name: "interrupted done", d: nlmsg(unix.NLMSG_DONE, netlink.Multi|netlink.DumpInterrupted, seq, errno(0)), end: true, intr: true},
		{name: "done with an error", d: nlmsg(unix.NLMSG_DONE, netlink.Multi, seq, errno(unix.ENOENT)), end: true, err: unix.ENOENT},
		{name: "error with text", d: nlmsg(unix.NLMSG_ERROR, netlink.Capped|netlink.AcknowledgeTLVs, seq, ack), end: true, err: unix.EINVAL, msg: "Invalid table"},
		{name: "single part", d: nlmsg(unix.RTM_NEWLINK, 0, seq, nil), end: true},
		{name: "another request's", d: nlmsg(unix.RTM_NEWROUTE, netlink.Multi, seq+1, nil), end: true, err: errMalformed},
		{name: "truncated header", d: route[:10], end: true, err: errMalformed},
		{name: "length past the end", d: route[:unix.NLMSG_HDRLEN+4], end: true, err: errMalformed},
		{name: "short error", d: nlmsg(unix.NLMSG_ERROR, 0, seq, []byte{1}), end: true, err: errMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end, intr, err := scanDump(tc.d, seq)
			if end != tc.end || intr != tc.intr || (err == nil) != (tc.err == nil) || tc.err != nil && !errors.Is(err, tc.err) {
				t.Fatalf("scanDump = end %v, intr %v, %v; want end %v, intr %v, %v", end, intr, err, tc.end, tc.intr, tc.err)
			}
			var oe *netlink.OpError
			if tc.msg != "" && (!errors.As(err, &oe) || oe.Message != tc.msg) {
				t.Fatalf("error %#v, want the kernel's text %q", err, tc.msg)
			}
		})
	}
}

// TestReleaseDumpBuffers checks that the buffers a sync lets go are
// unreachable: a resliced array would keep every one alive (2 MiB of a
// 1,000,000-route cache's heap, before this test).
func TestReleaseDumpBuffers(t *testing.T) {
	w := &Watcher{}
	for range dumpBuffers {
		w.dumpBufs = append(w.dumpBufs, make([]byte, 8))
	}
	array := w.dumpBufs // the same array as the kept slice's
	w.releaseDumpBuffers()
	if len(w.dumpBufs) != 1 || &w.dumpBufs[0] != &array[0] {
		t.Fatalf("%d buffers kept, want the first", len(w.dumpBufs))
	}
	for i, b := range array[1:] {
		if b != nil {
			t.Fatalf("released buffer %d still referenced by the kept array", i+1)
		}
	}
}
