package pathmtu

import "net/netip"

// Overhead is what WireGuard adds to an inner packet on an underlay of
// the family of peer: 60 bytes on IPv4 (IPv4 20, UDP 8, WireGuard's
// header 16 and tag 16), 80 on IPv6 (a 40-byte IP header).
func Overhead(peer netip.Addr) int {
	if peer.Unmap().Is4() {
		return 60
	}
	return 80
}

// InnerMTU is the largest inner packet a path of path bytes to peer
// carries: floor16(path − Overhead(peer)), because kernel WireGuard pads
// the plaintext to a multiple of 16 but never beyond the MTU; 0 for a path
// too small to carry anything.
func InnerMTU(peer netip.Addr, path int) int {
	in := path - Overhead(peer)
	if in <= 0 {
		return 0
	}
	return in &^ 15
}

// PathFor is the smallest path size whose InnerMTU is inner: what a path
// must carry for an inner packet of inner bytes.
func PathFor(peer netip.Addr, inner int) int {
	return inner + Overhead(peer)
}
