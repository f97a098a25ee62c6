//go:build linux

package netwatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// scanDump checks the headers of a dump's datagram d, a reply to request
// seq: it reports whether d ends the dump (NLMSG_DONE, an error, or a
// reply that is not multi-part), whether a message carries
// NLM_F_DUMP_INTR, and the kernel's error, if any.
func scanDump(d []byte, seq uint32) (end, intr bool, err error) {
	for len(d) > 0 {
		h, body, rest, err := nextMessage(d)
		if err != nil {
			return true, intr, err
		}
		d = rest
		if h.Sequence != seq {
			return true, intr, malformed("reply with sequence %d to request %d", h.Sequence, seq)
		}
		intr = intr || h.Flags&netlink.DumpInterrupted != 0
		switch h.Type {
		case netlink.Done, netlink.Error:
			return true, intr, replyError(h, body)
		}
		end = h.Flags&netlink.Multi == 0
	}
	return end, intr, nil
}

// nextMessage splits the first netlink message off d.
func nextMessage(d []byte) (h netlink.Header, body, rest []byte, err error) {
	if len(d) < unix.NLMSG_HDRLEN {
		return h, nil, nil, malformed("truncated netlink header of %d bytes", len(d))
	}
	l := int(binary.NativeEndian.Uint32(d[0:4]))
	if l < unix.NLMSG_HDRLEN || l > len(d) {
		return h, nil, nil, malformed("netlink message length %d out of range", l)
	}
	h = netlink.Header{
		Length:   uint32(l),
		Type:     netlink.HeaderType(binary.NativeEndian.Uint16(d[4:6])),
		Flags:    netlink.HeaderFlags(binary.NativeEndian.Uint16(d[6:8])),
		Sequence: binary.NativeEndian.Uint32(d[8:12]),
		PID:      binary.NativeEndian.Uint32(d[12:16]),
	}
	return h, d[unix.NLMSG_HDRLEN:l], d[min((l+3)&^3, len(d)):], nil
}

// replyError returns the error an NLMSG_DONE or NLMSG_ERROR message
// carries, nil for none, as *netlink.OpError with the kernel's extended
// acknowledgement text.
func replyError(h netlink.Header, body []byte) error {
	if len(body) < 4 {
		if h.Type == netlink.Done {
			return nil
		}
		return malformed("error message of %d bytes", len(body))
	}
	code := int32(binary.NativeEndian.Uint32(body[0:4]))
	if code == 0 {
		return nil
	}
	oe := &netlink.OpError{Op: "receive", Err: unix.Errno(-code)}
	// After the code: for NLMSG_ERROR the request's header (all of the
	// request without NLM_F_CAPPED), then the acknowledgement's attributes.
	tlvs := body[4:]
	if h.Type == netlink.Error {
		skip := unix.NLMSG_HDRLEN
		if h.Flags&netlink.Capped == 0 && len(tlvs) >= 4 {
			skip = int(binary.NativeEndian.Uint32(tlvs[0:4]))
		}
		tlvs = tlvs[min((skip+3)&^3, len(tlvs)):]
	}
	if h.Flags&netlink.AcknowledgeTLVs != 0 {
		for a := (attrs{b: tlvs}); a.next(); {
			if a.typ == unix.NLMSGERR_ATTR_MSG {
				oe.Message = strings.TrimRight(string(a.val), "\x00")
			}
		}
	}
	return oe
}

// addDatagram adds the messages of a dump's datagram to s, up to the one
// that ends the dump.
func (s *state) addDatagram(d []byte, tables tableFilter) error {
	var (
		c    compactRoute
		last *table // of the previous route: a dump lists a table's routes together
	)
	for len(d) > 0 {
		h, body, rest, err := nextMessage(d)
		if err != nil {
			return err
		}
		d = rest
		switch h.Type {
		case netlink.Done, netlink.Error:
			return nil
		case unix.RTM_NEWROUTE:
			// The bulk of any dump. Most routes go straight into their
			// table's store; the others are decoded into a Route and
			// added, still without building an Event.
			if decodeCompact(body, tables, &c) {
				if last == nil || last.family != c.family || last.id != c.table {
					last = s.table(c.family, c.table, true)
				}
				if c.family == IPv4 && last.m4.add(c.k4, c.v4) {
					last.countLink(c.v4.oif, 1)
					continue
				}
				if c.family == IPv6 && last.m6.add(c.k6, c.v6) {
					last.countLink(c.v6.oif, 1)
					continue
				}
			}
			r, err := decodeRoute(body, tables)
			switch {
			case errors.Is(err, errSkip):
				continue
			case err != nil:
				return fmt.Errorf("netwatch: dump: %w", err)
			}
			s.addDumped(r)
			continue
		}
		last = nil
		ev, err := decode(netlink.Message{Header: h, Data: body}, tables)
		switch {
		case errors.Is(err, errSkip):
			continue
		case err != nil:
			return fmt.Errorf("netwatch: dump: %w", err)
		}
		ev.how |= howDumped
		s.apply(&ev)
	}
	return nil
}

// rtextFilterSkipStats is RTEXT_FILTER_SKIP_STATS (linux/rtnetlink.h),
// which x/sys/unix does not have.
const rtextFilterSkipStats = 1 << 3

// dumpRequest builds the header of a strict dump request.
func dumpRequest(d dumpOf) []byte {
	typ, af, t := d.typ, d.af, d.table
	switch typ {
	case unix.RTM_GETLINK:
		// Without IFLA_EXT_MASK the kernel sizes link dump datagrams
		// for ordinary links and leaves out, silently, a link whose
		// message is longer (hundreds of altnames, many VFs); with any
		// mask it sizes them for the longest. Statistics are not cached.
		b := make([]byte, unix.SizeofIfInfomsg, unix.SizeofIfInfomsg+8)
		b[0] = af
		b = binary.NativeEndian.AppendUint16(b, 8)
		b = binary.NativeEndian.AppendUint16(b, unix.IFLA_EXT_MASK)
		return binary.NativeEndian.AppendUint32(b, rtextFilterSkipStats)
	case unix.RTM_GETADDR:
		b := make([]byte, unix.SizeofIfAddrmsg)
		b[0] = af
		return b
	case unix.RTM_GETROUTE:
		b := make([]byte, unix.SizeofRtMsg, unix.SizeofRtMsg+16)
		b[0] = af
		if t != 0 {
			b = binary.NativeEndian.AppendUint16(b, 8)
			b = binary.NativeEndian.AppendUint16(b, unix.RTA_TABLE)
			b = binary.NativeEndian.AppendUint32(b, uint32(t))
		}
		if d.oif != 0 {
			// With strict checking the kernel filters by output link
			// itself: a route is listed when one of its paths leaves
			// by it (fib_info_nh_uses_dev, and IPv6's equivalent).
			b = binary.NativeEndian.AppendUint16(b, 8)
			b = binary.NativeEndian.AppendUint16(b, unix.RTA_OIF)
			b = binary.NativeEndian.AppendUint32(b, d.oif)
		}
		return b
	default: // RTM_GETRULE
		b := make([]byte, 12)
		b[0] = af
		return b
	}
}

// dumpOf says what a dump lists: a message type and family, and for
// routes the table (0: all) and the output link (0: any).
type dumpOf struct {
	typ   uint16
	af    uint8
	table Table
	oif   uint32
}

// rtnlBarrier returns once the kernel has finished the change whose event
// triggered a re-dump. Route dumps do not take the RTNL lock, so a dump
// started on the event of a link going down could run before the kernel
// flushes that link's IPv4 routes, which it does after sending the event
// but under the same lock. Deleting an address of a link that does not
// exist takes the lock, so it returns after that change finished, and it
// changes nothing (ENODEV).
func rtnlBarrier(rc rtnl.Conn) {
	b := make([]byte, unix.SizeofIfAddrmsg)
	b[0] = unix.AF_INET
	binary.NativeEndian.PutUint32(b[4:8], 0x7fffffff)
	rc.Execute(netlink.Message{Header: netlink.Header{Type: unix.RTM_DELADDR, Flags: netlink.Request | netlink.Acknowledge}, Data: b})
}
