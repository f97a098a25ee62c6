//go:build linux

package reconcile

import (
	"github.com/marksplit/marksplit/netwatch"

	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// objectID names one kernel object for the per-object rate limit and for
// fights: a route by its key, a rule by all of it (rules have no key).
type objectID struct {
	route netwatch.RouteKey
	rule  netwatch.Rule
}

func opObjectID(op netwatch.Op) objectID {
	if op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete {
		return ruleID(op.Rule)
	}
	return objectID{route: op.Route.Key()}
}

func ruleID(r netwatch.Rule) objectID {
	r.State = 0 // the kernel's, not part of the rule
	return objectID{rule: r}
}

// object is what the Reconciler knows of an object it has changed.
type object struct {
	name, text string // Fight.Object and Fight.Line
	// tokens is the rate limit's bucket, as of at.
	tokens float64
	at     time.Time
	// made is set while the kernel holds the object as the Reconciler
	// last made it, as far as the journal tells: a change by another
	// program then is an undo.
	made    bool
	touched time.Time

	undos       int
	first, last time.Time // of the episode's first and last undo
	maxGap      time.Duration
	by          netwatch.Origin
	fighting    bool
	ep          *episode // while fighting
	// wrote is the route the Reconciler last wrote to this key (hasWrote);
	// diverged is set once the kernel was seen to keep it otherwise
	// (diverging).
	wrote              netwatch.Route
	hasWrote, diverged bool
}

// episode is a fight with one program, over as many objects as it undoes
// at a time: one warning, one OnFight at its start and one at its end,
// however many objects (a program flushing the table fights over all of
// its routes at once).
type episode struct {
	lead    *object // the first object, which the lines name
	by      netwatch.Origin
	first   time.Time
	objects int // fighting now
	all     int // in the episode so far
	undos   int // of the objects that are over
}

// observe reads the journal since the last pass: who changed the objects
// the Reconciler made.
func (l *loop) observe(v netwatch.View, now time.Time) {
	entries, next, complete := v.Changes(l.mark)
	l.mark = next
	if !complete {
		// Changes were lost to the journal: whoever made them, they are
		// not counted as undos.
		for _, o := range l.objs {
			o.made = false
		}
		for h, po := range l.plain {
			po.made = false
			l.plain[h] = po
		}
	}
	if len(l.objs) == 0 && len(l.plain) == 0 {
		return
	}
	for e := range entries {
		var id objectID
		switch e.Kind {
		case netwatch.KindRoute:
			id = objectID{route: e.Route.Key()}
		case netwatch.KindRule:
			id = ruleID(e.Rule)
		default:
			continue
		}
		o := l.objs[id]
		if o == nil {
			h := l.objectHash(id)
			po, ok := l.plain[h]
			if !ok || !po.made {
				continue // unknown, or not as made: no undo, and nothing to note
			}
			if or := e.Origin; or.Kind == netwatch.OriginProgram && or.Port != l.port && !e.Created {
				o = l.lookup(id) // an undo: it is a full object from now on
			} else if or.Kind != netwatch.OriginSelf && !(or.Kind == netwatch.OriginProgram && or.Port == l.port) {
				po.made = false
				l.plain[h] = po
				continue
			} else {
				continue
			}
		}
		switch or := e.Origin; {
		case or.Kind == netwatch.OriginSelf, or.Kind == netwatch.OriginProgram && or.Port == l.port:
			// Our own change, seen again.
		case or.Kind == netwatch.OriginProgram:
			if o.made && !e.Created {
				l.undo(id, o, or, now)
			}
			o.made = false
		default:
			// The kernel's own change, or a resync's finding: never an
			// undo, and what was made no longer stands.
			o.made = false
		}
	}
}

// diverging warns, once per route, of a replace planned again for a
// route the kernel holds as the Reconciler last wrote it, with no change
// by anyone else since: the kernel stores the desired route otherwise
// than the policy names it, and every pass would rewrite it. The warning
// names the route and the fields that differ.
func (l *loop) diverging(ops []netwatch.Op, lines []string) {
	for i, op := range ops {
		if op.Kind != netwatch.RouteReplace || !op.HasWas {
			continue
		}
		id := opObjectID(op)
		o := l.objs[id]
		switch {
		case o == nil:
			// A plain object keeps a hash of the route it wrote: only one
			// that diverges becomes a full object, to be warned of once.
			po, ok := l.plain[l.objectHash(id)]
			if !ok || !po.made || po.wrote == 0 || po.wrote != l.routeHash(op.Route.Clean()) {
				continue
			}
			o = l.lookup(id)
		case !o.made || o.diverged || !o.hasWrote || !o.wrote.Equal(op.Route.Clean()):
			continue // not the same route written again over what it made
		}
		o.diverged = true
		l.log.Warn("reconcile: the kernel keeps a route otherwise than desired, so every pass rewrites it; desire it as the kernel reports it",
			"route", lines[i], "differs", routeDiff(op.Route.Clean(), op.Was.Clean()))
	}
}

// routeDiff names the fields in which want and got differ, with both
// values: "Index: 0, kernel 1".
func routeDiff(want, got netwatch.Route) string {
	var ds []string
	wv, gv := reflect.ValueOf(want), reflect.ValueOf(got)
	for i := range wv.NumField() {
		if !reflect.DeepEqual(wv.Field(i).Interface(), gv.Field(i).Interface()) {
			ds = append(ds, fmt.Sprintf("%s: %v, kernel %v", wv.Type().Field(i).Name, wv.Field(i).Interface(), gv.Field(i).Interface()))
		}
	}
	return strings.Join(ds, "; ")
}

// admit takes a token for each operation in order and returns how many
// may run now: the rest wait for their objects' buckets to refill.
func (l *loop) admit(ops []netwatch.Op, texts []string, now time.Time) int {
	for i, op := range ops {
		id := opObjectID(op)
		o := l.objs[id]
		if o == nil && l.plainAdmit(id, now) {
			continue // changed once: a plain object, its bucket full before
		}
		if o == nil {
			o = l.lookup(id)
		}
		o.tokens = min(float64(l.burst), o.tokens+float64(now.Sub(o.at))/float64(l.interval))
		o.at = now
		if o.tokens < 1 {
			return i
		}
		o.tokens--
		o.name, o.text, o.touched = objectName(op), texts[i], now
	}
	return len(ops)
}

// made records that the kernel holds op's object as op made it.
func (l *loop) made(op netwatch.Op, now time.Time) {
	id := opObjectID(op)
	if o := l.objs[id]; o != nil {
		o.made, o.touched = true, now
		o.hasWrote = op.Kind == netwatch.RouteReplace
		if o.hasWrote {
			o.wrote = op.Route.Clean()
		}
	} else if op.Kind == netwatch.RouteReplace {
		l.plainMade(id, l.routeHash(op.Route.Clean()))
	} else {
		l.plainMade(id, 0)
	}
}

// undo counts an undo of o, the object id, by another program.
func (l *loop) undo(id objectID, o *object, by netwatch.Origin, now time.Time) {
	if o.undos > 0 && now.Sub(o.last) > fightGap {
		o.undos, o.maxGap = 0, 0
	}
	if o.undos == 0 {
		o.first = now
	} else {
		o.maxGap = max(o.maxGap, now.Sub(o.last))
	}
	o.undos++
	o.last, o.by = now, by
	if o.fighting || o.undos < fightUndos {
		return
	}
	if id.route.Table == netwatch.TableMain { // a repair: never fought over
		l.stepBack(id, o, by, now)
		return
	}
	o.fighting = true
	l.fights++
	key := by.String()
	ep := l.episodes[key]
	if ep == nil {
		ep = &episode{lead: o, by: by, first: o.first}
		l.episodes[key] = ep
		l.log.Warn(fmt.Sprintf("fight: %s undone %d times in %s by %s; repairing at most every %s",
			o.text, o.undos, roundDuration(now.Sub(o.first)), by, roundDuration(l.interval)),
			"object", o.name, "by", by.String(), "undos", o.undos)
		if l.r.OnFight != nil {
			l.r.OnFight(Fight{Object: o.name, Line: o.text, By: by, Undos: o.undos, Since: now.Sub(o.first), Objects: 1})
		}
	}
	ep.objects++
	ep.all++
	o.ep = ep
}

// endFight ends o's part in its episode, and the episode with its last
// object: one line and one OnFight for the whole episode.
func (l *loop) endFight(o *object) {
	ep := o.ep
	o.ep = nil
	ep.undos += o.undos
	o.undos = 0
	if ep.objects--; ep.objects > 0 {
		return
	}
	delete(l.episodes, ep.by.String())
	f := Fight{Object: ep.lead.name, Line: ep.lead.text, By: ep.by, Undos: ep.undos, Since: o.last.Sub(ep.first), Over: true, Objects: ep.all}
	what := f.Line
	if ep.all > 1 {
		what += fmt.Sprintf(" and %d other objects", ep.all-1)
	}
	l.log.Info(fmt.Sprintf("fight over: %s undone %d times in %s by %s", what, f.Undos, roundDuration(f.Since), f.By))
	if l.r.OnFight != nil {
		l.r.OnFight(f)
	}
}

// sweep ends the fights over objects left alone for twice the longest
// interval between their undos (at least a second), and, once a minute,
// forgets objects untouched for a long time. It returns when the next
// fight ends if nothing happens, zero for none.
func (l *loop) sweep(now time.Time) (next time.Time) {
	if l.fights == 0 && now.Before(l.gcAt) {
		return time.Time{}
	}
	gc := !now.Before(l.gcAt)
	if gc {
		l.gcAt = now.Add(time.Minute)
	}
	for id, o := range l.objs {
		if o.fighting {
			end := o.last.Add(max(time.Second, 2*o.maxGap))
			if now.Before(end) {
				if next.IsZero() || end.Before(next) {
					next = end
				}
				continue
			}
			o.fighting = false
			l.fights--
			l.endFight(o)
		}
		if gc && now.Sub(o.touched) > forgetAfter && now.Sub(o.last) > forgetAfter {
			delete(l.objs, id)
		}
	}
	if gc {
		l.forgetPlain(now.Add(-forgetAfter))
	}
	return next
}

// objectName names op's object in a few words, for a metric label.
func objectName(op netwatch.Op) string {
	if op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete {
		s := fmt.Sprintf("rule %d", op.Rule.Priority)
		if op.Rule.Family == netwatch.IPv6 {
			s += " inet6"
		}
		return s
	}
	return "table " + op.Route.Table.String() + " " + op.Route.Dst.String()
}

// objectText names op's object as a log line does.
func objectText(op netwatch.Op, links func(uint32) (netwatch.Link, bool)) string {
	switch {
	case op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete:
		return netwatch.Op{Kind: netwatch.RuleAdd, Rule: op.Rule}.Describe(links)
	case op.Repair:
		r := op.Route
		r.Protocol = netwatch.ProtoBoot // named in the head instead
		return op.Route.Protocol.String() + " route " + r.Describe(links)
	}
	return netwatch.Op{Kind: netwatch.RouteReplace, Route: op.Route}.Describe(links)
}

// roundDuration rounds d for a log line: to the millisecond below a
// second, else to a tenth of a second.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

// stepBack stops repairing the main-table route id, which by keeps undoing:
// one warning, one OnStepBack, and no repair of it again.
func (l *loop) stepBack(id objectID, o *object, by netwatch.Origin, now time.Time) {
	if l.steppedBack[id.route] {
		return
	}
	l.steppedBack[id.route] = true
	l.log.Warn(fmt.Sprintf("fight: %s undone %d times in %s by %s: it re-asserts its value; stepping back: this route is not repaired again",
		o.text, o.undos, roundDuration(now.Sub(o.first)), by),
		"object", o.name, "by", by.String(), "undos", o.undos)
	if l.r.OnStepBack != nil {
		l.r.OnStepBack(Fight{Object: o.name, Line: o.text, By: by, Undos: o.undos, Since: now.Sub(o.first), Objects: 1})
	}
}

// withoutSteppedBack drops from ops the repairs of the routes the loop
// stepped back from.
func (l *loop) withoutSteppedBack(ops []netwatch.Op) []netwatch.Op {
	if len(l.steppedBack) == 0 {
		return ops
	}
	return slices.DeleteFunc(ops, func(op netwatch.Op) bool {
		return op.Repair && l.steppedBack[op.Route.Key()]
	})
}
