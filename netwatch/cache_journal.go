package netwatch

import "iter"

// journalLen is how many of the latest changes a cache keeps for
// View.Changes.
const journalLen = 2048

// journal is a ring of the latest changes. The change numbered n (from 0)
// is at ring[n%journalLen]; next numbers the one to come.
type journal struct {
	ring []journalEntry
	next uint64
}

type journalEntry struct {
	ev Event
	// created is set on a route the kernel announced as new to its key
	// (NLM_F_EXCL): a program that creates a route does not undo anything.
	created bool
}

func (j *journal) add(ev Event, created bool) {
	if j.ring == nil {
		j.ring = make([]journalEntry, journalLen)
	}
	j.ring[j.next%journalLen] = journalEntry{ev, created}
	j.next++
}

// entries yields the changes numbered mark and later that the ring still
// holds, and whether it holds them all.
func (j *journal) entries(mark uint64) (iter.Seq[journalEntry], bool) {
	from, complete := mark, true
	if mark > j.next {
		from, complete = j.next, false // a mark of another cache
	}
	if j.next-from > journalLen {
		from, complete = j.next-journalLen, false
	}
	next := j.next
	return func(yield func(journalEntry) bool) {
		for n := from; n < next; n++ {
			if !yield(j.ring[n%journalLen]) {
				return
			}
		}
	}, complete
}

func (j *journal) since(mark uint64) (iter.Seq[Event], bool) {
	es, complete := j.entries(mark)
	return func(yield func(Event) bool) {
		for e := range es {
			if !yield(e.ev) {
				return
			}
		}
	}, complete
}
