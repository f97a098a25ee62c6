package main

import (
	"fmt"
	"hash/maphash"
	"sort"
	"strings"
	"time"
)

// Repairs during a fight are summed up, not logged one by one: while
// another program undoes what the agent made (between a fight's warning and
// its end), a change whose line the agent already logged in the last
// recentTTL is the same repair again. It is counted, and one line every
// summaryEvery (and one when the last fight ends) gives the counts:
//
//	fight: 3450 repairs in 5s of 22 objects undone again (route-replace 3450); each one's line is left out while the fight lasts
//
// Every other change keeps its own line, as always.
const (
	summaryEvery = 5 * time.Second
	recentTTL    = time.Minute
	// maxRecent bounds the lines remembered (by a hash each).
	maxRecent = 4096
)

// repairLog writes change lines to emit, summing up repeated repairs while
// a fight lasts. It is used from the Reconciler's goroutine alone.
type repairLog struct {
	emit   func(string)
	now    func() time.Time
	seed   maphash.Seed
	fights int                  // fights going on
	recent map[uint64]time.Time // lines logged lately, by hash: when

	// The summary under way.
	since   time.Time
	counts  map[string]int // repairs by kind
	objects map[uint64]struct{}
}

func newRepairLog(emit func(string)) *repairLog {
	return &repairLog{emit: emit, now: time.Now, seed: maphash.MakeSeed(), recent: make(map[uint64]time.Time)}
}

// change logs line, or counts it as kind when it repeats a recent line
// during a fight.
func (r *repairLog) change(kind, line string) {
	h := maphash.String(r.seed, line)
	now := r.now()
	if at, ok := r.recent[h]; ok && r.fights > 0 && now.Sub(at) < recentTTL {
		if r.counts == nil {
			r.since, r.counts, r.objects = now, make(map[string]int), make(map[uint64]struct{})
		}
		r.counts[kind]++
		r.objects[h] = struct{}{}
		r.recent[h] = now
		r.pass()
		return
	}
	r.remember(h, now)
	r.emit(line)
}

// remember notes that the line of hash h was logged at now.
func (r *repairLog) remember(h uint64, now time.Time) {
	if _, ok := r.recent[h]; !ok && len(r.recent) >= maxRecent {
		for k, at := range r.recent {
			if now.Sub(at) >= recentTTL {
				delete(r.recent, k)
			}
		}
		if len(r.recent) >= maxRecent {
			clear(r.recent)
		}
	}
	r.recent[h] = now
}

// fight is told of each fight's start and end.
func (r *repairLog) fight(over bool) {
	if !over {
		r.fights++
		return
	}
	if r.fights > 0 {
		r.fights--
	}
	if r.fights == 0 {
		r.flush()
	}
}

// pass writes the summary once it covers summaryEvery.
func (r *repairLog) pass() {
	if r.counts != nil && r.now().Sub(r.since) >= summaryEvery {
		r.flush()
	}
}

// flush writes the summary under way, if any.
func (r *repairLog) flush() {
	if r.counts == nil {
		return
	}
	kinds := make([]string, 0, len(r.counts))
	total := 0
	for k, n := range r.counts {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(kinds)
	r.emit(fmt.Sprintf("fight: %d repairs in %v of %d objects undone again (%s); each one's line is left out while the fight lasts",
		total, r.now().Sub(r.since).Round(100*time.Millisecond), len(r.objects), strings.Join(kinds, ", ")))
	r.counts, r.objects = nil, nil
}
