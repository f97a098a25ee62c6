package pathprobe

import (
	"context"
	"net/netip"
)

// probe is one packet of a round: its size in bytes of IP packet, sent from
// source number src.
type probe struct {
	src  int
	size int
}

// exchanger sends the probes of one round to a peer together and reports
// which of them were answered before the round's timeout. A probe the
// kernel refused to send (larger than the route's MTU, no route) counts as
// lost; an error means the search cannot go on (a closed socket, ctx).
type exchanger interface {
	exchange(ctx context.Context, peer netip.Addr, probes []probe) ([]bool, error)
}

// verdict is what rounds of probes said about one size.
type verdict int

const (
	// noVerdict: some round had its base-size probe lost as well.
	noVerdict verdict = iota
	pass
	fail
)

// grid is the binary search's set of sizes: offset + k·step.
type grid struct{ step, offset int }

// above is the smallest size of the grid strictly above n.
func (g grid) above(n int) int {
	r := ((n-g.offset)%g.step + g.step) % g.step // n ≡ offset + r
	return n - r + g.step
}

// floor is the largest size of the grid at or below n.
func (g grid) floor(n int) int { return g.above(n) - g.step }

// search is one path-MTU search: the ladder, then the binary search, over
// rounds that an exchanger carries and a limiter paces.
type search struct {
	x       exchanger
	pace    func(ctx context.Context, n int) error
	peer    netip.Addr
	base    int
	sources int
	tries   int
	ladder  []int
	grid    grid

	probes int
	rounds int
}

// run searches the sizes up to max (max first, then the ladder, then the
// grid) and returns what it found. An error comes from the exchanger or
// pace only.
func (s *search) run(ctx context.Context, max int) (Result, error) {
	res := Result{Peer: s.peer}
	s.base = min(s.base, max)
	lo, hi, err := s.ladderStep(ctx, max)
	for err == nil && lo > 0 {
		g := s.grid.above(lo)
		if g >= hi {
			break
		}
		n := (hi-1-g)/s.grid.step + 1 // grid sizes in (lo, hi)
		mid := g + (n-1)/2*s.grid.step
		var v verdict
		v, err = s.try(ctx, mid)
		switch v {
		case pass:
			lo = mid
		case fail:
			hi = mid
		default:
			lo = 0
		}
	}
	res.Probes = s.probes
	if err != nil {
		return res, err
	}
	if lo == 0 {
		res.Unreachable = true
		return res, nil
	}
	res.PathMTU = lo
	return res, nil
}

// ladderStep tries max, then the ladder's rungs between the base and max,
// smallest first, up to the first that fails; it returns the largest size
// that passed (0: no verdict) and the smallest that failed (max+1 when
// none did). Climbing from the base, a search meets at most one failing
// rung, and a failing size costs Tries rounds where a passing one costs
// one.
func (s *search) ladderStep(ctx context.Context, max int) (lo, hi int, err error) {
	hi = max + 1
	v, err := s.try(ctx, max)
	switch {
	case err != nil || v == noVerdict:
		return 0, hi, err
	case v == pass:
		return max, hi, nil
	}
	lo, hi = s.base, max
	for _, rung := range s.ladder {
		if rung <= lo || rung >= hi {
			continue
		}
		v, err := s.try(ctx, rung)
		switch {
		case err != nil || v == noVerdict:
			return 0, hi, err
		case v == fail:
			return lo, rung, nil
		}
		lo = rung
	}
	return lo, hi, nil
}

// try probes size from every source, with a base-size probe in each round,
// for at most s.tries rounds: it passes once every source had an answer at
// that size, fails when every round lost one while its base-size probe was
// answered, and has no verdict otherwise. A size at or below the base is
// its own base: it passes or has no verdict.
func (s *search) try(ctx context.Context, size int) (verdict, error) {
	pending := make([]int, s.sources)
	for i := range pending {
		pending[i] = i
	}
	withBase := size > s.base
	lostWithBase := 0
	probes := make([]probe, 0, s.sources+1)
	for range s.tries {
		probes = probes[:0]
		if withBase {
			probes = append(probes, probe{src: s.rounds % s.sources, size: s.base})
		}
		for _, src := range pending {
			probes = append(probes, probe{src: src, size: size})
		}
		s.rounds++
		if err := s.pace(ctx, len(probes)); err != nil {
			return noVerdict, err
		}
		s.probes += len(probes)
		answered, err := s.x.exchange(ctx, s.peer, probes)
		if err != nil {
			return noVerdict, err
		}
		first := 0
		if withBase {
			first = 1
		}
		kept := pending[:0]
		for i, src := range pending {
			if !answered[first+i] {
				kept = append(kept, src)
			}
		}
		pending = kept
		if len(pending) == 0 {
			return pass, nil
		}
		if withBase && answered[0] {
			lostWithBase++
		}
	}
	if lostWithBase == s.tries {
		return fail, nil
	}
	return noVerdict, nil
}
