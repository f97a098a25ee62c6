package pathprobe

import "net/netip"

// Via names how a Result was measured.
const (
	ViaResponder = "responder"
	ViaICMPEcho  = "icmp-echo"
)

// Result is what one search found about one peer.
type Result struct {
	// Peer is the address searched.
	Peer netip.Addr
	// PathMTU is the largest IP packet, in bytes, that crossed the path (on
	// every source port probed); 0 when Unreachable. It lies on the
	// search's grid or is a size tried as such (max, a ladder rung, the
	// base): with the default grid, floor16(PathMTU − 60) on IPv4 (− 80 on
	// IPv6) equals that of the path's true size.
	PathMTU int
	// Unreachable reports that the search reached no verdict: in some
	// round no base-size probe was answered (the peer, its responder or the
	// path is down). The caller changes nothing.
	Unreachable bool
	// Probes is the number of packets sent in this search.
	Probes int
	// Via is ViaResponder or ViaICMPEcho: what answered (ViaResponder when
	// nothing did and ICMP echo was not tried).
	Via string
}
