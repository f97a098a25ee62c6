package pathprobe

import (
	"encoding/binary"
	"net/netip"
)

// The wire format, in the UDP payload of a probe and of its answer (and in
// the data of an ICMP echo request):
//
//	0      4   5    6         8            16          20
//	| "MSPP" | 1 | type | 0 0 | nonce (8) | length (4) | zeros…
//
// type 1 is a probe, whose length is its own UDP payload length (the
// receiver checks it); type 2 is an answer, whose length is the UDP payload
// length the responder received. An answer is always headerLen bytes: never
// more than the probe it answers, so a responder cannot amplify, and the
// reverse path's MTU does not matter.
const (
	headerLen = 20

	typeProbe  = 1
	typeAnswer = 2
	version    = 1

	ip4Header = 20
	ip6Header = 40
	// l4Header is the UDP header, and the ICMP echo header: both 8 bytes.
	l4Header = 8

	// minSize4 and minSize6 are the smallest probes, in bytes of IP packet.
	minSize4 = ip4Header + l4Header + headerLen
	minSize6 = ip6Header + l4Header + headerLen
	// maxSize is the largest probe: an IPv6 payload length is 16 bits.
	maxSize = 65535
)

var magic = [4]byte{'M', 'S', 'P', 'P'}

// message is a probe or an answer, decoded.
type message struct {
	typ    byte
	nonce  uint64
	length uint32
}

// put writes m's header into b (at least headerLen bytes); the rest of b is
// left as it is.
func (m message) put(b []byte) {
	_ = b[headerLen-1]
	copy(b, magic[:])
	b[4] = version
	b[5] = m.typ
	b[6], b[7] = 0, 0
	binary.BigEndian.PutUint64(b[8:], m.nonce)
	binary.BigEndian.PutUint32(b[16:], m.length)
}

// parse decodes the header at the start of b, and reports whether it is
// one of ours.
func parse(b []byte) (message, bool) {
	if len(b) < headerLen || [4]byte(b[:4]) != magic || b[4] != version || b[6] != 0 || b[7] != 0 {
		return message{}, false
	}
	m := message{typ: b[5], nonce: binary.BigEndian.Uint64(b[8:]), length: binary.BigEndian.Uint32(b[16:])}
	if m.typ != typeProbe && m.typ != typeAnswer {
		return message{}, false
	}
	return m, true
}

// overhead is the bytes of a probe to peer that are not its payload: the
// IP header and the UDP (or ICMP echo) header.
func overhead(peer netip.Addr) int {
	if peer.Is4() {
		return ip4Header + l4Header
	}
	return ip6Header + l4Header
}
