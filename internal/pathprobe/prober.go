package pathprobe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
)

// ErrClosed is returned by Search on a closed Prober.
var ErrClosed = errors.New("pathprobe: prober closed")

// Prober measures path MTUs to peers, one Search at a time or many at once,
// all under one rate limit.
type Prober struct {
	cfg     Config
	lim     *limiter
	udp     exchanger // nil: not available (the family's sockets could not be opened)
	udp6    exchanger
	icmp    exchanger // nil unless Config.ICMPEcho
	icmp6   exchanger
	log     *slog.Logger
	closers []func() error
}

// newProber is NewProber without the sockets: exchangers are set by the
// caller.
func newProber(cfg Config) (*Prober, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Prober{cfg: cfg, lim: newLimiter(cfg.Rate, cfg.Sources+1), log: cfg.Logger}, nil
}

// Search measures the path MTU to peer: the largest IP packet, up to max
// bytes (the largest size worth trying: the MTU of the main route to peer),
// that crosses the path from every source port. It waits for the rate
// limit and for each round's answers; it returns an error only for a
// closed Prober, a family it has no sockets for, a bad max, a kernel error
// other than a lost probe, or ctx.
func (p *Prober) Search(ctx context.Context, peer netip.Addr, max int) (Result, error) {
	peer = peer.Unmap()
	if !peer.IsValid() {
		return Result{}, fmt.Errorf("pathprobe: search: invalid peer address")
	}
	minSize, base, udp, icmp := minSize4, p.cfg.Base4, p.udp, p.icmp
	g := grid{step: p.cfg.Step, offset: p.cfg.Offset4}
	if peer.Is6() {
		minSize, base, udp, icmp = minSize6, p.cfg.Base6, p.udp6, p.icmp6
		g.offset = p.cfg.Offset6
	}
	if max < minSize || max > maxSize {
		return Result{Peer: peer}, fmt.Errorf("pathprobe: search %s: max %d: want %d to %d", peer, max, minSize, maxSize)
	}
	if udp == nil {
		return Result{Peer: peer}, fmt.Errorf("pathprobe: search %s: no sockets for this family", peer)
	}
	res, err := p.searchVia(ctx, udp, peer, base, g, max)
	res.Via = ViaResponder
	if err != nil || !res.Unreachable || icmp == nil {
		p.log.Debug("path MTU search", "peer", peer, "path_mtu", res.PathMTU, "unreachable", res.Unreachable, "probes", res.Probes, "via", res.Via, "error", err)
		return res, err
	}
	sent := res.Probes
	res, err = p.searchVia(ctx, icmp, peer, base, g, max)
	res.Via = ViaICMPEcho
	res.Probes += sent
	p.log.Debug("path MTU search", "peer", peer, "path_mtu", res.PathMTU, "unreachable", res.Unreachable, "probes", res.Probes, "via", res.Via, "error", err)
	return res, err
}

func (p *Prober) searchVia(ctx context.Context, x exchanger, peer netip.Addr, base int, g grid, max int) (Result, error) {
	s := search{
		x:       x,
		pace:    p.lim.wait,
		peer:    peer,
		base:    base,
		sources: p.cfg.Sources,
		tries:   p.cfg.Tries,
		ladder:  p.cfg.Ladder,
		grid:    g,
	}
	return s.run(ctx, max)
}

// Close closes the Prober's sockets; a Search under way returns an error.
// It is safe to call twice.
func (p *Prober) Close() error {
	var errs []error
	for _, c := range p.closers {
		errs = append(errs, c())
	}
	p.closers = nil
	return errors.Join(errs...)
}
