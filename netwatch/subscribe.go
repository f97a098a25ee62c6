//go:build linux

package netwatch

import (
	"errors"
	"slices"
	"sync"
)

// ErrLagged ends a subscription whose reader fell behind by more events
// than its buffer holds. Nothing is dropped silently: the reader
// subscribes again and starts from a fresh view.
var ErrLagged = errors.New("netwatch: subscriber fell behind; events were not delivered")

// ErrUnsubscribed ends a subscription its owner closed.
var ErrUnsubscribed = errors.New("netwatch: unsubscribed")

// Subscription delivers every change to the cache, in order: events, and
// after a resync the differences it found, as events.
type Subscription struct {
	w    *Watcher
	c    chan Event
	once sync.Once
	err  error
}

// Subscribe starts a subscription with room for buf undelivered events.
// If start is not nil it is called with the view the first event
// follows, so that view plus the events is the whole story.
func (w *Watcher) Subscribe(buf int, start func(View)) *Subscription {
	s := &Subscription{w: w, c: make(chan Event, buf)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if start != nil {
		start(View{s: w.st, j: &w.journal, changed: w.changed})
	}
	w.subs[s] = struct{}{}
	return s
}

// Events returns the channel of events. It is closed when the
// subscription ends; Err then says why.
func (s *Subscription) Events() <-chan Event { return s.c }

// Err returns why the subscription ended, or nil while it runs.
func (s *Subscription) Err() error {
	s.w.mu.RLock()
	defer s.w.mu.RUnlock()
	return s.err
}

// Close ends the subscription. It is safe to call more than once.
func (s *Subscription) Close() {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	s.end(ErrUnsubscribed)
}

// end is called with w.mu held.
func (s *Subscription) end(err error) {
	s.once.Do(func() {
		s.err = err
		delete(s.w.subs, s)
		close(s.c)
	})
}

// publish records ev in the journal and sends it to every subscriber;
// called with w.mu held for writing.
func (w *Watcher) publish(ev Event) {
	created := ev.Kind == KindRoute && ev.Op == EventNew && ev.excl
	ev.replace, ev.appendRoute, ev.excl, ev.prepend, ev.dumped = false, false, false, false, false
	w.journal.add(ev, created)
	for s := range w.subs {
		select {
		case s.c <- ev:
		default:
			s.end(ErrLagged)
		}
	}
}

// publishResync publishes a difference a re-dump found.
func (w *Watcher) publishResync(ev Event) {
	ev.Origin = Origin{Kind: OriginResync}
	w.publish(ev)
}

// diffStates publishes the changes between two states as events:
// deletions first, then additions and changes.
func diffStates(old, next *state, emit func(Event)) {
	for i, l := range old.links {
		if _, ok := next.links[i]; !ok {
			emit(Event{Op: EventDel, Kind: KindLink, Link: l})
		}
	}
	for k, a := range old.addrs {
		if _, ok := next.addrs[k]; !ok {
			emit(Event{Op: EventDel, Kind: KindAddr, Addr: a})
		}
	}
	for f := range old.rules {
		diffRules(old.rules[f], next.rules[f], emit)
	}
	for f := range old.tables {
		diffTables(old.tables[f], next.tables[f], emit)
	}
	for i, l := range next.links {
		if o, ok := old.links[i]; !ok || o != l {
			emit(Event{Op: EventNew, Kind: KindLink, Link: l})
		}
	}
	for k, a := range next.addrs {
		if o, ok := old.addrs[k]; !ok || o != a {
			emit(Event{Op: EventNew, Kind: KindAddr, Addr: a})
		}
	}
}

// diffRules emits the rules only in old as deletions and those only in next
// as additions, counting duplicates.
func diffRules(old, next []Rule, emit func(Event)) {
	used := make([]bool, len(next))
	var added []Rule
outer:
	for _, o := range old {
		for j, n := range next {
			if !used[j] && sameRule(o, n) {
				used[j] = true
				continue outer
			}
		}
		emit(Event{Op: EventDel, Kind: KindRule, Rule: o})
	}
	for j, n := range next {
		if !used[j] {
			added = append(added, n)
		}
	}
	for _, n := range added {
		emit(Event{Op: EventNew, Kind: KindRule, Rule: n})
	}
}

// diffTables emits route changes between two sets of tables of one family.
func diffTables(old, next map[Table]*table, emit func(Event)) {
	for id, ot := range old {
		nt := next[id]
		ot.all(func(r Route) bool {
			// A route still there with other attributes is reported once,
			// as new.
			if nt == nil || !slices.ContainsFunc(nt.getAll(r.Key()), func(n Route) bool { return sameRoute(n, r) }) {
				emit(Event{Op: EventDel, Kind: KindRoute, Route: r})
			}
			return true
		})
	}
	for id, nt := range next {
		ot := old[id]
		nt.all(func(r Route) bool {
			if ot == nil || !containsRoute(ot.getAll(r.Key()), r) {
				emit(Event{Op: EventNew, Kind: KindRoute, Route: r})
			}
			return true
		})
	}
}

func containsRoute(rs []Route, r Route) bool {
	for _, c := range rs {
		if c.Equal(r) {
			return true
		}
	}
	return false
}
