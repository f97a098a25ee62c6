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

// errUnsubscribed ends a subscription its owner closed.
var errUnsubscribed = errors.New("netwatch: unsubscribed")

// Subscription delivers every change to the cache, in order: events, and
// after a resync the differences it found, as events.
type Subscription struct {
	w    *Watcher
	c    chan Event
	once sync.Once
	err  error // guarded by w.mu

	// Until start has seen its view, events are held here with their
	// journal numbers; guarded by mu.
	mu      sync.Mutex
	holding bool
	held    []heldEvent
}

type heldEvent struct {
	n  uint64
	ev Event
}

// Subscribe starts a subscription with room for buf undelivered events.
// If start is not nil it is called with the view the first event follows,
// so that view plus the events is the whole story. start runs as Read's
// callback does, with the cache read-locked: it must compute from the view
// and return, without calling the watcher's methods.
func (w *Watcher) Subscribe(buf int, start func(View)) *Subscription {
	s := &Subscription{w: w, c: make(chan Event, buf), holding: true}
	w.mu.Lock()
	w.subs[s] = struct{}{}
	w.mu.Unlock()
	// Changes made from here on are held; those the view below shows
	// already are dropped, the later ones delivered.
	w.mu.RLock()
	mark := w.journal.next
	if start != nil {
		start(w.view())
	}
	w.mu.RUnlock()
	s.release(mark)
	return s
}

// release delivers the held events numbered mark and later and stops
// holding.
func (s *Subscription) release(mark uint64) {
	s.mu.Lock()
	lagged := false
	for _, h := range s.held {
		if h.n < mark {
			continue
		}
		select {
		case s.c <- h.ev:
			continue
		default:
			lagged = true
		}
		break
	}
	// A lagging subscription keeps holding (so that nothing is sent past
	// the gap) until it ends; w.mu is taken only without s.mu, as publish
	// takes them in the other order.
	s.held, s.holding = nil, lagged
	s.mu.Unlock()
	if lagged {
		s.w.mu.Lock()
		s.end(ErrLagged)
		s.w.mu.Unlock()
	}
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
	s.end(errUnsubscribed)
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
func (w *Watcher) publish(c change) {
	ev := c.Event
	ev.Created = ev.Kind == KindRoute && !ev.Deleted && c.how&howExcl != 0
	n := w.journal.next
	w.journal.add(ev, ev.Created)
	for s := range w.subs {
		s.mu.Lock()
		if s.holding {
			s.held = append(s.held, heldEvent{n, ev})
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		select {
		case s.c <- ev:
		default:
			s.end(ErrLagged)
		}
	}
}

// publishResync publishes a difference a full re-dump found.
func (w *Watcher) publishResync(ev Event) {
	ev.Origin = Origin{Kind: OriginResync}
	w.publish(change{Event: ev})
}

// holdFinding keeps a difference a targeted re-dump found until the drain
// after it: its event may be on its way. Called with mu held.
func (w *Watcher) holdFinding(ev Event) { w.findings = append(w.findings, ev) }

func (w *Watcher) hasFindings() bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return len(w.findings) > 0
}

// claim publishes, with ev's origin, the finding that ev (an event that
// changed nothing, the cache having it already) explains. Called with mu
// held.
func (w *Watcher) claim(ev Event) {
	for i, f := range w.findings {
		if sameChange(f, ev) {
			f.Origin = ev.Origin
			w.findings = slices.Delete(w.findings, i, i+1)
			w.publish(change{Event: f})
			return
		}
	}
}

// settleFindings publishes the findings no event claimed, as the
// re-dump's.
func (w *Watcher) settleFindings() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.publishFindings()
}

// publishFindings publishes the findings left as the re-dump's; called
// with mu held.
func (w *Watcher) publishFindings() {
	for _, f := range w.findings {
		w.publishResync(f)
	}
	w.findings = w.findings[:0]
}

// sameChange reports whether event ev is the change f: the same operation
// on the same object (a deletion names the object as it was).
func sameChange(f, ev Event) bool {
	if f.Kind != ev.Kind || f.Deleted != ev.Deleted {
		return false
	}
	switch f.Kind {
	case KindLink:
		return f.Link.Index == ev.Link.Index
	case KindAddr:
		return f.Addr.key() == ev.Addr.key()
	case KindRoute:
		if f.Deleted {
			return f.Route.Key() == ev.Route.Key() && sameRoute(f.Route, ev.Route)
		}
		return f.Route.Matches(ev.Route)
	}
	return sameRule(f.Rule, ev.Rule)
}

// diffStates publishes the changes between two states as events:
// deletions first, then additions and changes.
func diffStates(old, next *state, emit func(Event)) {
	for i, l := range old.links {
		if _, ok := next.links[i]; !ok {
			emit(Event{Deleted: true, Kind: KindLink, Link: l})
		}
	}
	for k, a := range old.addrs {
		if _, ok := next.addrs[k]; !ok {
			emit(Event{Deleted: true, Kind: KindAddr, Addr: a})
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
			emit(Event{Kind: KindLink, Link: l})
		}
	}
	for k, a := range next.addrs {
		if o, ok := old.addrs[k]; !ok || o != a {
			emit(Event{Kind: KindAddr, Addr: a})
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
		emit(Event{Deleted: true, Kind: KindRule, Rule: o})
	}
	for j, n := range next {
		if !used[j] {
			added = append(added, n)
		}
	}
	for _, n := range added {
		emit(Event{Kind: KindRule, Rule: n})
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
				emit(Event{Deleted: true, Kind: KindRoute, Route: r})
			}
			return true
		})
	}
	for id, nt := range next {
		ot := old[id]
		nt.all(func(r Route) bool {
			if ot == nil || !containsRoute(ot.getAll(r.Key()), r) {
				emit(Event{Kind: KindRoute, Route: r})
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
