package pathprobe

import (
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Responder defaults.
const (
	// DefaultResponderRate is the answers a Responder sends per second:
	// every node probes at DefaultRate (20 packets/s) spread over all its
	// peers, so a node receives about 20 probes a second in all, whatever
	// the cluster's size; ten times that leaves room for bursts.
	DefaultResponderRate = 200
	// DefaultResponderBurst is the answers it may send at once: a few
	// rounds from a few nodes.
	DefaultResponderBurst = 50
)

// Responder answers other nodes' probes: a UDP echo of a probe's size that
// answers only sources Allow accepts, at a bounded rate, with a 20-byte
// answer that states the size received (never more than the probe). Set
// its fields before Serve; Serve may be called once.
type Responder struct {
	// Allow reports whether to answer probes from an address (the
	// cluster's other nodes). nil answers nobody. It should not accept
	// the node's own addresses: a local process could then spend the
	// answers' budget. It is called for every datagram, so must be fast.
	Allow func(netip.Addr) bool
	// Port is the UDP port to serve on (DefaultPort).
	Port uint16
	// Rate is the answers per second, over all sources
	// (DefaultResponderRate).
	Rate float64
	// Burst is the answers it may send at once (DefaultResponderBurst).
	Burst int
	// Logger receives the reason Serve stops (default: discard).
	Logger *slog.Logger

	once sync.Once
	lim  *limiter

	answered, refused, malformed, limited, sendErrors atomic.Uint64
}

// ResponderStats counts what a Responder received and did.
type ResponderStats struct {
	Answered   uint64 // probes answered (counted before the answer is sent)
	Refused    uint64 // datagrams from sources Allow did not accept
	Malformed  uint64 // datagrams from accepted sources that are not probes
	Limited    uint64 // probes not answered: over the rate
	SendErrors uint64 // answers the kernel did not send (of Answered)
}

// Stats returns the counts so far.
func (r *Responder) Stats() ResponderStats {
	return ResponderStats{
		Answered: r.answered.Load(), Refused: r.refused.Load(), Malformed: r.malformed.Load(),
		Limited: r.limited.Load(), SendErrors: r.sendErrors.Load(),
	}
}

func (r *Responder) init() {
	r.once.Do(func() {
		if r.Port == 0 {
			r.Port = DefaultPort
		}
		if r.Rate == 0 {
			r.Rate = DefaultResponderRate
		}
		if r.Burst == 0 {
			r.Burst = DefaultResponderBurst
		}
		if r.Logger == nil {
			r.Logger = slog.New(slog.DiscardHandler)
		}
		r.lim = newLimiter(r.Rate, r.Burst)
	})
}

// answer decides what to send back for a datagram of size bytes from src
// whose first bytes are b: ok reports whether to send the answer in out.
// It counts what it decided.
func (r *Responder) answer(now time.Time, src netip.Addr, b []byte, size int, out *[headerLen]byte) (ok bool) {
	if r.Allow == nil || !r.Allow(src) {
		r.refused.Add(1)
		return false
	}
	m, ok := parse(b)
	if !ok || m.typ != typeProbe || int(m.length) != size || size < headerLen {
		r.malformed.Add(1)
		return false
	}
	if !r.lim.allow(now, 1) {
		r.limited.Add(1)
		return false
	}
	message{typ: typeAnswer, nonce: m.nonce, length: uint32(size)}.put(out[:])
	r.answered.Add(1)
	return true
}
