package ciliumnode

import (
	"cmp"
	"fmt"
	"iter"
	"net/netip"
	"slices"
)

// Peer is what a PeerSource keeps of one CiliumNode.
type Peer struct {
	// Name is the CiliumNode's (and the Kubernetes node's) name.
	Name string
	// Addrs are the node's spec.addresses of type InternalIP: valid unicast addresses only
	// (IPv4 as IPv4, never 4in6; no zone), sorted, without duplicates. Shared between
	// snapshots: do not modify.
	Addrs []netip.Addr
	// Encrypting reports whether spec.encryption.key is non-zero: the node takes part in
	// node encryption. A node opted out (the control plane) has no key.
	Encrypting bool
	// Problem says why the entry is not all that the CiliumNode says now; "" when it is.
	// Either the object was skipped (it did not decode, or was larger than 4 MiB) and the
	// entry is its last good one, or it had more than MaxNodeAddrs InternalIPs and the
	// rest were left out.
	Problem string
}

// Equal reports whether p and q are the same peer with the same addresses, mode and
// problem.
func (p Peer) Equal(q Peer) bool {
	return p.Name == q.Name && p.Encrypting == q.Encrypting && p.Problem == q.Problem && slices.Equal(p.Addrs, q.Addrs)
}

// Peers is an immutable snapshot of every CiliumNode, by name. The zero value is empty.
// A Peers may be shared between goroutines and kept as long as needed.
type Peers struct {
	// peers is sorted by Name, names unique; neither it nor the Peers it points to are
	// modified once the Peers is made. Pointers, not values, so that a change copies 8
	// bytes a node rather than a whole Peer: 40 KB for 5,000 nodes.
	peers []*Peer
	// skipped are the CiliumNodes that did not decode and have no last good entry: Name
	// and Problem only, sorted by name, none in peers.
	skipped []*Peer
	// dropped counts the CiliumNodes that the watch added beyond MaxPeerBytes: left out.
	dropped int
	// bytes is the cost of peers and skipped.
	bytes int
}

// Len returns the number of nodes.
func (ps Peers) Len() int { return len(ps.peers) }

// Get returns the node called name.
func (ps Peers) Get(name string) (Peer, bool) {
	i, ok := ps.find(name)
	if !ok {
		return Peer{}, false
	}
	return *ps.peers[i], true
}

// All yields every node, sorted by name.
func (ps Peers) All() iter.Seq[Peer] {
	return func(yield func(Peer) bool) {
		for _, p := range ps.peers {
			if !yield(*p) {
				return
			}
		}
	}
}

// Encrypting returns the InternalIPs of every encrypting node other than self, sorted and
// without duplicates: the addresses whose traffic Cilium encrypts, so the ones that need
// the tunnel MTU. An address that an encrypting node and another node both claim is in it.
// It returns at most MaxPeerAddrs, the lowest; leftOut counts the others.
func (ps Peers) Encrypting(self string) (addrs []netip.Addr, leftOut int) {
	for _, p := range ps.peers {
		if p.Encrypting && p.Name != self {
			addrs = append(addrs, p.Addrs...)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	if len(addrs) > MaxPeerAddrs {
		leftOut = len(addrs) - MaxPeerAddrs
		addrs = slices.Clip(addrs[:MaxPeerAddrs])
	}
	return addrs, leftOut
}

// Problems returns the CiliumNodes whose entry is not all they say, sorted by name: the
// entries with a Problem, and the nodes skipped without a last good entry (Name and
// Problem only; Get does not return them).
func (ps Peers) Problems() []Peer {
	var out []Peer
	for _, p := range ps.peers {
		if p.Problem != "" {
			out = append(out, *p)
		}
	}
	for _, p := range ps.skipped {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Dropped returns the number of CiliumNodes that the watch added beyond MaxPeerBytes, which
// are left out until a list succeeds.
func (ps Peers) Dropped() int { return ps.dropped }

// EncryptingCount returns the number of encrypting nodes, self included.
func (ps Peers) EncryptingCount() int {
	n := 0
	for _, p := range ps.peers {
		if p.Encrypting {
			n++
		}
	}
	return n
}

// Equal reports whether ps and qs hold the same nodes, equal one by one, and the same
// problems.
func (ps Peers) Equal(qs Peers) bool {
	eq := func(p, q *Peer) bool { return p == q || p.Equal(*q) }
	return slices.EqualFunc(ps.peers, qs.peers, eq) && slices.EqualFunc(ps.skipped, qs.skipped, eq) && ps.dropped == qs.dropped
}

// String summarizes the snapshot for logs: "3 nodes, 2 encrypting".
func (ps Peers) String() string {
	return fmt.Sprintf("%d nodes, %d encrypting", ps.Len(), ps.EncryptingCount())
}

func (ps Peers) find(name string) (int, bool) { return find(ps.peers, name) }

func find(list []*Peer, name string) (int, bool) {
	return slices.BinarySearchFunc(list, name, func(p *Peer, n string) int { return cmp.Compare(p.Name, n) })
}

// set returns a copy of list in which p replaces the entry of its name, or is added.
func set(list []*Peer, p *Peer) []*Peer {
	i, ok := find(list, p.Name)
	if ok {
		out := slices.Clone(list)
		out[i] = p
		return out
	}
	out := make([]*Peer, 0, len(list)+1)
	out = append(out, list[:i]...)
	out = append(out, p)
	return append(out, list[i:]...)
}

// del returns a copy of list without the entry called name.
func del(list []*Peer, name string) []*Peer {
	i, ok := find(list, name)
	if !ok {
		return list
	}
	out := make([]*Peer, 0, len(list)-1)
	out = append(out, list[:i]...)
	return append(out, list[i+1:]...)
}

// with returns a copy of ps in which p replaces the node of its name, or is added. A node
// the snapshot has no room for (MaxPeerBytes) is counted as dropped instead.
func (ps Peers) with(p Peer) Peers {
	if _, ok := ps.find(p.Name); !ok && ps.full(p.Name, p.cost()) {
		ps.dropped++
		return ps
	}
	ps.bytes += p.cost() - ps.costOf(p.Name)
	ps.peers, ps.skipped = set(ps.peers, &p), del(ps.skipped, p.Name)
	return ps
}

// withSkipped returns a copy of ps in which the node called name is marked as skipped for
// problem: its last good entry stands, marked, or it is listed among the skipped.
func (ps Peers) withSkipped(name, problem string) Peers {
	if i, ok := ps.find(name); ok {
		p := *ps.peers[i]
		p.Problem = problem
		ps.bytes += p.cost() - ps.peers[i].cost()
		ps.peers = set(ps.peers, &p)
		return ps
	}
	sk := &Peer{Name: name, Problem: problem}
	if _, ok := find(ps.skipped, name); !ok && ps.full(name, sk.cost()) {
		ps.dropped++
		return ps
	}
	ps.bytes += sk.cost() - ps.costOf(name)
	ps.skipped = set(ps.skipped, sk)
	return ps
}

// costOf returns the cost of the entry or the skipped node called name, 0 without one.
func (ps Peers) costOf(name string) int {
	if i, ok := ps.find(name); ok {
		return ps.peers[i].cost()
	}
	if i, ok := find(ps.skipped, name); ok {
		return ps.skipped[i].cost()
	}
	return 0
}

// full reports whether ps has no room for a new node called name that costs n.
func (ps Peers) full(name string, n int) bool {
	_, ok := find(ps.skipped, name)
	return !ok && ps.bytes+n > MaxPeerBytes
}

// without returns a copy of ps without the node called name.
func (ps Peers) without(name string) Peers {
	ps.bytes -= ps.costOf(name)
	ps.peers, ps.skipped = del(ps.peers, name), del(ps.skipped, name)
	return ps
}

// peersOf makes a snapshot of nodes, which it sorts; of two nodes of one name (a server
// bug) the later stands.
func peersOf(nodes []Peer) Peers {
	slices.SortStableFunc(nodes, func(a, b Peer) int { return cmp.Compare(a.Name, b.Name) })
	out := make([]*Peer, 0, len(nodes))
	bytes := 0
	for i := range nodes {
		if i+1 < len(nodes) && nodes[i+1].Name == nodes[i].Name {
			continue
		}
		out = append(out, &nodes[i])
		bytes += nodes[i].cost()
	}
	return Peers{peers: out, bytes: bytes}
}
