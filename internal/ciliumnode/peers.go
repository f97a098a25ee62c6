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
}

// Equal reports whether p and q are the same peer with the same addresses and mode.
func (p Peer) Equal(q Peer) bool {
	return p.Name == q.Name && p.Encrypting == q.Encrypting && slices.Equal(p.Addrs, q.Addrs)
}

// Peers is an immutable snapshot of every CiliumNode, by name. The zero value is empty.
// A Peers may be shared between goroutines and kept as long as needed.
type Peers struct {
	// peers is sorted by Name, names unique; neither it nor the Peers it points to are
	// modified once the Peers is made. Pointers, not values, so that a change copies 8
	// bytes a node rather than a whole Peer: 40 KB for 5,000 nodes.
	peers []*Peer
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
func (ps Peers) Encrypting(self string) []netip.Addr {
	var addrs []netip.Addr
	for _, p := range ps.peers {
		if p.Encrypting && p.Name != self {
			addrs = append(addrs, p.Addrs...)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}

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

// Equal reports whether ps and qs hold the same nodes, equal one by one.
func (ps Peers) Equal(qs Peers) bool {
	return slices.EqualFunc(ps.peers, qs.peers, func(p, q *Peer) bool { return p == q || p.Equal(*q) })
}

// String summarizes the snapshot for logs: "3 nodes, 2 encrypting".
func (ps Peers) String() string {
	return fmt.Sprintf("%d nodes, %d encrypting", ps.Len(), ps.EncryptingCount())
}

func (ps Peers) find(name string) (int, bool) {
	return slices.BinarySearchFunc(ps.peers, name, func(p *Peer, n string) int { return cmp.Compare(p.Name, n) })
}

// with returns a copy of ps in which p replaces the node of its name, or is added.
func (ps Peers) with(p Peer) Peers {
	i, ok := ps.find(p.Name)
	if ok {
		out := slices.Clone(ps.peers)
		out[i] = &p
		return Peers{out}
	}
	out := make([]*Peer, 0, len(ps.peers)+1)
	out = append(out, ps.peers[:i]...)
	out = append(out, &p)
	return Peers{append(out, ps.peers[i:]...)}
}

// without returns a copy of ps without the node called name.
func (ps Peers) without(name string) Peers {
	i, ok := ps.find(name)
	if !ok {
		return ps
	}
	out := make([]*Peer, 0, len(ps.peers)-1)
	out = append(out, ps.peers[:i]...)
	return Peers{append(out, ps.peers[i+1:]...)}
}

// peersOf makes a snapshot of nodes, which it sorts; of two nodes of one name (a server
// bug) the later stands.
func peersOf(nodes []Peer) Peers {
	slices.SortStableFunc(nodes, func(a, b Peer) int { return cmp.Compare(a.Name, b.Name) })
	out := make([]*Peer, 0, len(nodes))
	for i := range nodes {
		if i+1 < len(nodes) && nodes[i+1].Name == nodes[i].Name {
			continue
		}
		out = append(out, &nodes[i])
	}
	return Peers{out}
}

// wireObject is the part of a CiliumNode that matters here, as the API sends it in lists
// and watch events. The fields of a Status (the object of an ERROR event) share it, so
// that an event is decoded in one pass from the stream.
type wireObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Spec struct {
		Addresses []struct {
			Type string `json:"type"`
			IP   string `json:"ip"`
		} `json:"addresses"`
		Encryption struct {
			Key int64 `json:"key"`
		} `json:"encryption"`
	} `json:"spec"`

	// Of a Status.
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// peer checks a CiliumNode and returns what is kept of it, with the InternalIPs that are
// not valid unicast addresses (they are left out). A list's items may omit apiVersion and
// kind; if present they must be CiliumNode's.
func (o *wireObject) peer() (p Peer, invalid []string, err error) {
	switch {
	case (o.APIVersion != "" || o.Kind != "") && (o.APIVersion != apiVersion || o.Kind != kind):
		return Peer{}, nil, fmt.Errorf("got %q %q, want %s %s", o.APIVersion, o.Kind, apiVersion, kind)
	case o.Metadata.Name == "":
		return Peer{}, nil, fmt.Errorf("%s without metadata.name", kind)
	}
	p = Peer{Name: o.Metadata.Name, Encrypting: o.Spec.Encryption.Key != 0}
	for _, a := range o.Spec.Addresses {
		if a.Type != "InternalIP" {
			continue
		}
		addr, err := netip.ParseAddr(a.IP)
		addr = addr.Unmap()
		if err != nil || addr.Zone() != "" || addr.IsUnspecified() || addr.IsLoopback() || addr.IsMulticast() {
			invalid = append(invalid, a.IP)
			continue
		}
		p.Addrs = append(p.Addrs, addr)
	}
	slices.SortFunc(p.Addrs, netip.Addr.Compare)
	p.Addrs = slices.Clip(slices.Compact(p.Addrs))
	return p, invalid, nil
}
