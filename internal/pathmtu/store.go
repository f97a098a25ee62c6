package pathmtu

import (
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
)

// Source is where a peer's path MTU came from, in order of trust.
type Source int

// Sources.
const (
	SourceNone     Source = iota // no value: the tunnel MTU
	SourceDeclared               // --path-mtu: the operator's
	SourceLearned                // from a PMTU exception, which the kernel recorded from ICMP
	SourceProbed                 // from a search with probes
)

func (s Source) String() string {
	switch s {
	case SourceNone:
		return "none"
	case SourceDeclared:
		return "declared"
	case SourceLearned:
		return "learned"
	case SourceProbed:
		return "probed"
	}
	return "unknown(" + strconv.Itoa(int(s)) + ")"
}

// State sums a peer's value up against the tunnel MTU, for metrics.
type State int

// States.
const (
	StateUnknown      State = iota // no value
	StateFull                      // the path carries the tunnel MTU
	StateReduced                   // the route carries a smaller inner MTU
	StateBelowMinimum              // the inner MTU is below the family's minimum: not installed
)

// States lists every State, for metrics.
var States = []State{StateFull, StateReduced, StateBelowMinimum, StateUnknown}

func (s State) String() string {
	switch s {
	case StateUnknown:
		return "unknown"
	case StateFull:
		return "full"
	case StateReduced:
		return "reduced"
	case StateBelowMinimum:
		return "below_minimum"
	}
	return "unknown(" + strconv.Itoa(int(s)) + ")"
}

// Value is a peer's path MTU: Path bytes from Source, in effect Since,
// last confirmed at Measured (its age is the time since). The zero Value
// is "not known".
type Value struct {
	Path     int
	Source   Source
	Since    time.Time
	Measured time.Time
}

// Age is how long ago v was last measured (or declared).
func (v Value) Age(now time.Time) time.Duration { return now.Sub(v.Measured).Truncate(time.Second) }

// Change is a peer's value changing from From to To.
type Change struct {
	Peer     netip.Addr
	From, To Value
}

// Direction is "lower", "raise" or "same" (a value gone: "lower" would be
// wrong; it is "forget").
func (c Change) Direction() string {
	switch {
	case c.To.Source == SourceNone:
		return "forget"
	case c.From.Source == SourceNone || c.To.Path < c.From.Path:
		return "lower"
	case c.To.Path > c.From.Path:
		return "raise"
	}
	return "same"
}

// DefaultRaiseAfter is the least time between the two measurements that
// must agree before a value goes up: RFC 8899's raise timer is 600 s; two
// searches minutes apart sample different moments of the path (a
// different ECMP leg, a flapping link).
const DefaultRaiseAfter = 5 * time.Minute

// A Store keeps each peer's path MTU. Make it with NewStore.
type Store struct {
	// Now is the clock (time.Now unless a test's).
	Now func() time.Time
	// RaiseAfter is the least time between the two agreeing measurements
	// that raise a value (DefaultRaiseAfter).
	RaiseAfter time.Duration

	declared DeclaredList
	mu       sync.Mutex
	tunnel   int // the tunnel MTU; 0 not known
	peers    map[netip.Addr]*entry
}

type entry struct {
	v         Value
	pending   int // a higher path measured once, waiting for a second
	pendingAt time.Time
}

// NewStore returns a Store with the operator's declared values.
func NewStore(declared DeclaredList) *Store {
	return &Store{Now: time.Now, RaiseAfter: DefaultRaiseAfter, declared: declared, peers: make(map[netip.Addr]*entry)}
}

// SetTunnelMTU records the tunnel MTU: no measured value goes above what
// it carries.
func (s *Store) SetTunnelMTU(mtu int) {
	s.mu.Lock()
	s.tunnel = mtu
	s.mu.Unlock()
}

// SetPeers makes peers the store's peers: a new peer gets its declared
// value, if any; a peer no longer among them is forgotten. It returns the
// changes.
func (s *Store) SetPeers(peers []netip.Addr) []Change {
	now := s.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var cs []Change
	in := make(map[netip.Addr]bool, len(peers))
	for _, p := range peers {
		p = p.Unmap()
		in[p] = true
		if _, ok := s.peers[p]; ok {
			continue
		}
		e := &entry{}
		if path, ok := s.declared.lookup(p); ok {
			e.v = Value{Path: path, Source: SourceDeclared, Since: now, Measured: now}
			cs = append(cs, Change{Peer: p, To: e.v})
		}
		s.peers[p] = e
	}
	for p, e := range s.peers {
		if !in[p] {
			delete(s.peers, p)
			if e.v.Source != SourceNone {
				cs = append(cs, Change{Peer: p, From: e.v})
			}
		}
	}
	return cs
}

// Declared reports whether peer's value is declared: it is not probed.
func (s *Store) Declared(peer netip.Addr) bool {
	_, ok := s.declared.lookup(peer.Unmap())
	return ok
}

// Observe records a measurement from src (SourceLearned or SourceProbed):
// the path to peer carries path bytes. A lower value than the current one
// takes effect at once; a higher one only when a second measurement
// agrees at least RaiseAfter after the first; a declared peer, or one not
// among the peers, ignores it. A search whose peer did not answer is no
// measurement: do not call Observe for it. It reports the change, if any.
func (s *Store) Observe(peer netip.Addr, path int, src Source) (Change, bool) {
	peer = peer.Unmap()
	now := s.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.peers[peer]
	if !ok || e.v.Source == SourceDeclared || path <= 0 {
		return Change{}, false
	}
	if s.tunnel > 0 {
		path = min(path, PathFor(peer, s.tunnel))
	}
	cur := e.v
	switch {
	case cur.Source == SourceNone || path < cur.Path:
		e.v = Value{Path: path, Source: src, Since: now, Measured: now}
		e.pending = 0
		return Change{Peer: peer, From: cur, To: e.v}, true
	case path == cur.Path:
		e.v.Measured = now
		e.pending = 0
		return Change{}, false
	case e.pending == path && now.Sub(e.pendingAt) >= s.RaiseAfter:
		e.v = Value{Path: path, Source: src, Since: now, Measured: now}
		e.pending = 0
		return Change{Peer: peer, From: cur, To: e.v}, true
	case e.pending != path:
		e.pending, e.pendingAt = path, now
	}
	return Change{}, false
}

// Get returns peer's value; the zero Value when none is known.
func (s *Store) Get(peer netip.Addr) Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.peers[peer.Unmap()]; ok {
		return e.v
	}
	return Value{}
}

// Peer is one peer's value and state, for verify and the metrics.
type Peer struct {
	Addr  netip.Addr
	Value Value
	Inner int // InnerMTU of the value, at most the tunnel MTU; 0 unknown
	State State
}

// Peer returns peer's value and state.
func (s *Store) Peer(peer netip.Addr) Peer {
	peer = peer.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	var v Value
	if e, ok := s.peers[peer]; ok {
		v = e.v
	}
	return s.peer(peer, v)
}

// Judge returns what v would make of peer's route at the current tunnel
// MTU (its inner MTU and state), whether or not v is peer's value: a
// caller compares a change's From and To with it.
func (s *Store) Judge(peer netip.Addr, v Value) Peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peer(peer.Unmap(), v)
}

// Peers returns every peer's value, in no order.
func (s *Store) Peers() []Peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Peer, 0, len(s.peers))
	for a, e := range s.peers {
		out = append(out, s.peer(a, e.v))
	}
	return out
}

func (s *Store) peer(a netip.Addr, v Value) Peer {
	p := Peer{Addr: a, Value: v}
	if v.Source == SourceNone {
		return p
	}
	p.Inner = InnerMTU(a, v.Path)
	if s.tunnel > 0 && (p.Inner > s.tunnel || v.Path >= PathFor(a, s.tunnel)) {
		// A packet of exactly the tunnel MTU is not padded beyond it.
		p.Inner = s.tunnel
	}
	switch {
	case s.tunnel > 0 && p.Inner >= s.tunnel:
		p.State = StateFull
	case p.Inner < int(mtupolicy.MinMTU(family(a))):
		p.State = StateBelowMinimum
	default:
		p.State = StateReduced
	}
	return p
}

// Inner returns the peers' inner MTUs, mtupolicy's input.
func (s *Store) Inner() mtupolicy.InnerMTUs {
	m := make(mtupolicy.InnerMTUs)
	for _, p := range s.Peers() {
		if p.Inner > 0 {
			m[p.Addr] = uint32(p.Inner)
		}
	}
	return m
}

// Counts returns the number of peers in each state, and the smallest
// inner MTU of a peer whose value is installed (full or reduced): the MTU
// Cilium's pod plane would need (0 when none is known).
func (s *Store) Counts() (byState map[State]int, smallest int) {
	byState = make(map[State]int, len(States))
	for _, p := range s.Peers() {
		byState[p.State]++
		if (p.State == StateFull || p.State == StateReduced) && (smallest == 0 || p.Inner < smallest) {
			smallest = p.Inner
		}
	}
	return byState, smallest
}

func family(a netip.Addr) netwatch.Family { return netwatch.FamilyOf(a) }
