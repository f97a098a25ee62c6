package netwatch

import "testing"

// TestJournal: the journal keeps the last 2048 changes (as View.Changes
// says), in order, and says when a mark's changes have left it.
func TestJournal(t *testing.T) {
	var j journal
	for i := range 2100 {
		j.add(Event{Link: Link{Index: uint32(i)}}, false)
	}
	count := func(mark uint64) (n int, first uint32, complete bool) {
		evs, complete := j.since(mark)
		first = ^uint32(0)
		for ev := range evs {
			if n == 0 {
				first = ev.Link.Index
			}
			n++
		}
		return n, first, complete
	}
	if n, first, complete := count(0); n != 2048 || first != 2100-2048 || complete {
		t.Errorf("since(0) = %d changes from %d, complete %v; want the last 2048, from 52, incomplete", n, first, complete)
	}
	if n, first, complete := count(2000); n != 100 || first != 2000 || !complete {
		t.Errorf("since(2000) = %d changes from %d, complete %v; want 100 from 2000, complete", n, first, complete)
	}
	if n, _, complete := count(5000); n != 0 || complete {
		t.Errorf("since(5000), a mark of another cache: %d changes, complete %v; want none, incomplete", n, complete)
	}
}
