package netwatch

import "strconv"

// Kind is the kind of object an event is about.
type Kind uint8

// Kinds of objects.
const (
	KindLink Kind = iota + 1
	KindAddr
	KindRoute
	KindRule
)

var kindNames = [...]string{"", "link", "addr", "route", "rule"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return "unknown(" + strconv.Itoa(int(k)) + ")"
}

// Event is one change to the cache: one of Link, Addr, Route or Rule is
// set, as Kind says.
type Event struct {
	// Deleted is set when the object went away; otherwise it appeared or
	// changed.
	Deleted bool
	Kind    Kind
	// Origin says who made the change.
	Origin Origin
	Link   Link
	Addr   Addr
	Route  Route
	Rule   Rule
	// Created is set on a route the kernel announced as new to its key
	// (NLM_F_EXCL, as `ip route add` asks): a program that creates a
	// route replaces nothing, so it undoes nothing.
	Created bool
}

// change is an Event as the watcher decoded it, with how the kernel sent
// it, which the cache needs to apply a route event.
type change struct {
	Event
	how uint8
}

// How a change came, in change.how.
const (
	howReplace = 1 << iota // a route event with NLM_F_REPLACE
	howAppend              // with NLM_F_APPEND
	howExcl                // with NLM_F_EXCL: the kernel had no route with the key
	howPrepend             // with NLM_F_CREATE alone: ip route prepend
	howDumped              // from a dump, which lists routes sharing a key in kernel order
)
