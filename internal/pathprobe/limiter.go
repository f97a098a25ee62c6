package pathprobe

import (
	"context"
	"sync"
	"time"
)

// limiter paces packets to a rate with a burst (GCRA: a theoretical
// arrival time that each packet pushes by 1/rate). Over any interval T it
// lets at most burst + rate·T packets through. Safe for concurrent use.
type limiter struct {
	interval time.Duration // 1/rate; 0: no limit
	burst    int

	mu  sync.Mutex
	tat time.Time // guarded by mu
}

func newLimiter(rate float64, burst int) *limiter {
	l := &limiter{burst: max(burst, 1)}
	if rate > 0 {
		l.interval = time.Duration(float64(time.Second) / rate)
	}
	return l
}

// reserve takes n packets' worth at now and returns how long the caller
// must wait before sending them (0: at once).
func (l *limiter) reserve(now time.Time, n int) time.Duration {
	if l.interval == 0 {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tat.Before(now) {
		l.tat = now
	}
	l.tat = l.tat.Add(time.Duration(n) * l.interval)
	return max(l.tat.Sub(now)-time.Duration(l.burst)*l.interval, 0)
}

// wait reserves n packets and sleeps until they may be sent, or until ctx
// ends (the reservation is kept: a cancelled search still counts).
func (l *limiter) wait(ctx context.Context, n int) error {
	d := l.reserve(time.Now(), n)
	if d == 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// allow takes n packets' worth at now if that keeps within the burst, and
// reports whether it did: a limiter for what must not wait.
func (l *limiter) allow(now time.Time, n int) bool {
	if l.interval == 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	tat := l.tat
	if tat.Before(now) {
		tat = now
	}
	tat = tat.Add(time.Duration(n) * l.interval)
	if tat.Sub(now) > time.Duration(l.burst)*l.interval {
		return false
	}
	l.tat = tat
	return true
}
