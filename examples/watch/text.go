package main

import (
	"fmt"
	"strconv"

	"github.com/marksplit/marksplit/netwatch"
)

// textLine is one object in ip(8)'s words; an event says new or del and
// who made it.
func textLine(ev netwatch.Event, event bool, names map[uint32]string) string {
	links := func(i uint32) (netwatch.Link, bool) {
		n, ok := names[i]
		return netwatch.Link{Index: i, Name: n}, ok
	}
	var s string
	switch ev.Kind {
	case netwatch.KindLink:
		l := ev.Link
		state := "down"
		if l.Flags&netwatch.LinkUp != 0 {
			state = "up"
		}
		s = fmt.Sprintf("link %d %s mtu %d %s", l.Index, l.Name, l.MTU, state)
	case netwatch.KindAddr:
		s = fmt.Sprintf("addr %s dev %s", ev.Addr.Prefix, names[ev.Addr.Index])
		if ev.Addr.Peer.IsValid() {
			s += " peer " + ev.Addr.Peer.String()
		}
	case netwatch.KindRoute:
		s = "route table " + ev.Route.Table.String() + ": " + ev.Route.Describe(links)
	default:
		s = "rule " + ev.Rule.String()
		if ev.Rule.Family == netwatch.IPv6 {
			s = "rule (inet6) " + ev.Rule.String()
		}
	}
	if event {
		s = verb(ev) + " " + s + " (" + ev.Origin.String() + ")"
	}
	return terminalSafe(s)
}

// terminalSafe returns s with every character a terminal would act on
// written as a Go escape, as strconv quotes a string for a terminal: C0
// and C1 controls (ESC as \x1b, BEL as \a), DEL, other non-graphic runes
// (\u200b) and bytes that are not UTF-8 (\xff); a backslash or a quote
// is escaped too, so that the escapes are unambiguous. A link or program
// name the kernel accepts can thus not move the cursor, ring the bell or
// retitle the window; ordinary text is unchanged. (JSON lines escape
// control characters already.)
func terminalSafe(s string) string {
	q := strconv.QuoteToGraphic(s)
	return q[1 : len(q)-1]
}
