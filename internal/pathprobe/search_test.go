package pathprobe

import (
	"context"
	"errors"
	"math/bits"
	"net/netip"
	"testing"
)

// fakePath answers probes as a path would: a probe passes when it fits
// the leg its source hashes to (legs[src % len(legs)]). It drops the
// probes listed in drop (by the order they were sent, from 0) and answers
// nothing while down is true or after downAfter probes.
type fakePath struct {
	legs      []int
	drop      map[int]bool
	down      bool
	downAfter int // 0: never
	sent      int
	rounds    int
}

func (f *fakePath) exchange(ctx context.Context, peer netip.Addr, probes []probe) ([]bool, error) {
	f.rounds++
	answered := make([]bool, len(probes))
	for i, p := range probes {
		n := f.sent
		f.sent++
		if f.down || f.drop[n] || (f.downAfter > 0 && n >= f.downAfter) {
			continue
		}
		answered[i] = p.size <= f.legs[p.src%len(f.legs)]
	}
	return answered, ctx.Err()
}

func newTestSearch(x exchanger, peer netip.Addr) *search {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		panic(err)
	}
	s := &search{x: x, pace: func(context.Context, int) error { return nil }, peer: peer,
		base: cfg.Base4, sources: cfg.Sources, tries: cfg.Tries, ladder: cfg.Ladder, grid: grid{cfg.Step, cfg.Offset4}}
	if peer.Is6() {
		s.base, s.grid.offset = cfg.Base6, cfg.Offset6
	}
	return s
}

var (
	peer4 = netip.MustParseAddr("10.2.0.1")
	peer6 = netip.MustParseAddr("fd00:2::1")
)

func floor16(n int) int { return n &^ 15 }

// TestSearchEveryPathSize searches every path size from the base to max
// and checks that the size found passes, and gives the inner MTU the true
// size gives (floor16(P − 60) on IPv4, floor16(P − 80) on IPv6).
func TestSearchEveryPathSize(t *testing.T) {
	for _, tc := range []struct {
		peer     netip.Addr
		base     int
		overhead int
		max      int
	}{
		{peer4, DefaultBase4, 60, 1450},
		{peer4, DefaultBase4, 60, 1500},
		{peer6, DefaultBase6, 80, 1450},
		{peer6, DefaultBase6, 80, 9000},
	} {
		worst := 0
		for p := tc.base; p <= tc.max+20; p++ {
			f := &fakePath{legs: []int{p}}
			res, err := newTestSearch(f, tc.peer).run(t.Context(), tc.max)
			if err != nil {
				t.Fatal(err)
			}
			want := min(p, tc.max)
			if res.Unreachable || res.PathMTU > want || res.PathMTU < tc.base {
				t.Fatalf("%s max %d path %d: got %+v", tc.peer, tc.max, p, res)
			}
			if got, want := floor16(res.PathMTU-tc.overhead), floor16(want-tc.overhead); got != want {
				t.Errorf("%s max %d path %d: found %d: inner MTU %d, want %d", tc.peer, tc.max, p, res.PathMTU, got, want)
			}
			if p >= tc.max && (res.PathMTU != tc.max || res.Probes != DefaultSources+1) {
				t.Errorf("%s max %d path %d: got %+v, want max in one round", tc.peer, tc.max, p, res)
			}
			if res.Probes != f.sent {
				t.Errorf("%s path %d: Probes %d, sent %d", tc.peer, p, res.Probes, f.sent)
			}
			worst = max(worst, f.rounds)
		}
		t.Logf("%s max %d: at most %d rounds (%d packets a round)", tc.peer, tc.max, worst, DefaultSources+1)
		// Each size of the ladder and the search fails at most once in
		// Tries rounds: max, the ladder's climb, and the grid's bits.
		limit := DefaultTries*(1+1+bits.Len(uint((tc.max-tc.base)/DefaultStep))) + len(DefaultLadder)
		if worst > limit {
			t.Errorf("%s max %d: %d rounds, want at most %d", tc.peer, tc.max, worst, limit)
		}
	}
}

func TestSearch(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer netip.Addr
		path fakePath
		max  int
		want Result
	}{{
		name: "full path: one round",
		peer: peer4, path: fakePath{legs: []int{1500}}, max: 1450,
		want: Result{PathMTU: 1450, Probes: 5},
	}, {
		name: "ECMP: the smallest leg",
		peer: peer4, path: fakePath{legs: []int{1450, 1450, 1304, 1450}}, max: 1450,
		want: Result{PathMTU: 1296},
	}, {
		name: "a ladder rung",
		peer: peer4, path: fakePath{legs: []int{1368}}, max: 1450,
		want: Result{PathMTU: 1368},
	}, {
		name: "one lost probe does not lower",
		peer: peer4, path: fakePath{legs: []int{1450}, drop: map[int]bool{2: true}}, max: 1450,
		want: Result{PathMTU: 1450, Probes: 7}, // the second round retries source 1 only
	}, {
		name: "lost base: unreachable",
		peer: peer4, path: fakePath{legs: []int{1450}, drop: map[int]bool{0: true, 1: true, 5: true, 6: true}}, max: 1450,
		want: Result{Unreachable: true, Probes: 7}, // the second round: the base and source 0
	}, {
		name: "down: unreachable",
		peer: peer4, path: fakePath{legs: []int{1450}, down: true}, max: 1450,
		want: Result{Unreachable: true, Probes: 10},
	}, {
		name: "down in the middle: unreachable",
		peer: peer4, path: fakePath{legs: []int{1300}, downAfter: 12}, max: 1450,
		want: Result{Unreachable: true},
	}, {
		name: "below the base: unreachable",
		peer: peer4, path: fakePath{legs: []int{1100}}, max: 1450,
		want: Result{Unreachable: true},
	}, {
		name: "max below the base",
		peer: peer4, path: fakePath{legs: []int{1500}}, max: 1000,
		want: Result{PathMTU: 1000, Probes: 4},
	}, {
		name: "IPv6 below the minimum: unreachable",
		peer: peer6, path: fakePath{legs: []int{1279}}, max: 1450,
		want: Result{Unreachable: true},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := newTestSearch(&tc.path, tc.peer).run(t.Context(), tc.max)
			if err != nil {
				t.Fatal(err)
			}
			tc.want.Peer = tc.peer
			if tc.want.Probes == 0 {
				tc.want.Probes = res.Probes
			}
			if res != tc.want {
				t.Errorf("got %+v, want %+v", res, tc.want)
			}
		})
	}
}

// TestSearchPace checks that every packet is paced, and that the pacer's
// error ends the search.
func TestSearchPace(t *testing.T) {
	f := &fakePath{legs: []int{1300}}
	s := newTestSearch(f, peer4)
	paced := 0
	s.pace = func(_ context.Context, n int) error { paced += n; return nil }
	if _, err := s.run(t.Context(), 1450); err != nil {
		t.Fatal(err)
	}
	if paced != f.sent {
		t.Errorf("paced %d packets, sent %d", paced, f.sent)
	}
	stop := errors.New("stop")
	s = newTestSearch(&fakePath{legs: []int{1300}}, peer4)
	s.pace = func(context.Context, int) error { return stop }
	if _, err := s.run(t.Context(), 1450); !errors.Is(err, stop) {
		t.Errorf("got %v, want the pacer's error", err)
	}
}

func TestGrid(t *testing.T) {
	g := grid{step: 16, offset: 60}
	for _, tc := range []struct{ n, above, floor int }{
		{1292, 1308, 1292}, {1291, 1292, 1276}, {1293, 1308, 1292}, {60, 76, 60}, {0, 12, -4},
	} {
		if a, f := g.above(tc.n), g.floor(tc.n); a != tc.above || f != tc.floor {
			t.Errorf("%d: above %d floor %d, want %d %d", tc.n, a, f, tc.above, tc.floor)
		}
	}
}
