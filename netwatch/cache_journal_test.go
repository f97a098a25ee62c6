package netwatch

import (
	"errors"
	"slices"
	"testing"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
)

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

// TestFindingsClaimed: a difference a re-dump found is published with the
// origin of the event that arrives after it and explains it (the kernel
// announced the change late), and as the re-dump's when no event does.
func TestFindingsClaimed(t *testing.T) {
	w := New(Options{NetNS: fakeNetNS(nopDialer{})})
	sub := w.Subscribe(16, nil)
	defer sub.Close()
	rule := Rule{Family: IPv4, Priority: 70, Table: 900, Action: ActionToTable}
	other := Rule{Family: IPv4, Priority: 71, Table: 900, Action: ActionToTable}
	w.mu.Lock()
	w.holdFinding(Event{Deleted: true, Kind: KindRule, Rule: rule})
	w.holdFinding(Event{Deleted: true, Kind: KindRule, Rule: other})
	w.mu.Unlock()
	if !w.hasFindings() {
		t.Fatal("findings not held")
	}
	// While they are held, the cache has changes the journal has not: a
	// view's Changes says it is not complete.
	var mark uint64
	w.Read(func(v View) {
		var complete bool
		if _, mark, complete = v.Changes(0); complete {
			t.Error("Changes complete while findings are held")
		}
	})
	ip := Origin{Kind: OriginProgram, Port: 42, PID: 42, Comm: "ip"}
	// The late event: the rule is no longer in the cache, so it changes
	// nothing, and claims its finding.
	w.applyBatch([]change{{Event: Event{Deleted: true, Kind: KindRule, Rule: rule, Origin: ip}}})
	w.settleFindings()
	var got []Event
	for range 2 {
		got = append(got, <-sub.Events())
	}
	if got[0].Rule.Priority != 70 || got[0].Origin != ip {
		t.Errorf("first published %+v, want rule 70 with the program's origin", got[0])
	}
	if got[1].Rule.Priority != 71 || got[1].Origin.Kind != OriginResync {
		t.Errorf("second published %+v, want rule 71 as the re-dump's", got[1])
	}
	if w.hasFindings() {
		t.Errorf("findings left after settling")
	}
	w.Read(func(v View) {
		changes, _, complete := v.Changes(mark)
		if n := len(slices.Collect(changes)); !complete || n != 2 {
			t.Errorf("Changes after settling: %d, complete %v; want the 2 findings, complete", n, complete)
		}
	})
}

// nopDialer dials nothing: for a Watcher that never runs.
type nopDialer struct{}

func (nopDialer) Dial(rtnl.DialConfig) (rtnl.Conn, error) { return nil, errors.New("nopDialer") }
