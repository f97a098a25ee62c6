package main

import (
	"strconv"
	"strings"

	"github.com/marksplit/marksplit/netwatch"
)

// describe renders an applied operation as one log line, in ip(8)'s words
// with link names from the view the plan was made from:
//
//	table 920: 0.0.0.0/0 via 192.0.2.254 dev eth1 (was 0.0.0.0/0 via 192.0.2.1 dev eth1)
//	rule 920: fwmark 0x100/0xff00 lookup 920
//	table 920: removed 0.0.0.0/0 via 192.0.2.254 dev eth1
func describe(op netwatch.Op, names map[uint32]string) string {
	switch op.Kind {
	case netwatch.RouteReplace:
		s := "table " + op.Route.Table.String() + ": " + routeText(op.Route, names)
		if op.HasWas {
			s += " (was " + routeText(op.Was, names) + ")"
		}
		return s
	case netwatch.RouteDelete:
		return "table " + op.Route.Table.String() + ": removed " + routeText(op.Route, names)
	case netwatch.RuleAdd:
		head, body := ruleText(op.Rule)
		return head + ":" + body
	case netwatch.RuleDelete:
		head, body := ruleText(op.Rule)
		return head + ": removed" + body
	}
	return op.Kind.String()
}

// ruleText splits a rule into "rule 920" ("rule 920 (inet6)" for IPv6)
// and " fwmark 0x100/0xff00 lookup 920".
func ruleText(r netwatch.Rule) (head, body string) {
	p := strconv.FormatUint(uint64(r.Priority), 10)
	head = "rule " + p
	if r.Family == netwatch.IPv6 {
		head += " (inet6)"
	}
	return head, strings.TrimPrefix(r.String(), p+":")
}

func routeText(r netwatch.Route, names map[uint32]string) string {
	s := r.Dst.String()
	if r.Gateway.IsValid() {
		s += " via " + r.Gateway.String()
	}
	if r.Index != 0 {
		if n, ok := names[r.Index]; ok {
			s += " dev " + n
		} else {
			s += " dev #" + strconv.FormatUint(uint64(r.Index), 10)
		}
	}
	if r.PrefSrc.IsValid() {
		s += " src " + r.PrefSrc.String()
	}
	return s
}
