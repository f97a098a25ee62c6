package main

import (
	"github.com/marksplit/marksplit/netwatch"
)

// The lines of the state dump, one struct per kind so that fields come in
// the order DESIGN.md shows. Unset fields are omitted; a route's metric,
// protocol, scope and type and a rule's priority, table and protocol are
// always printed.

// origin is who made the change an event line reports.
type origin struct {
	Origin string `json:"origin,omitempty"`
	Port   uint32 `json:"port,omitempty"`
	PID    int    `json:"pid,omitempty"`
	Comm   string `json:"comm,omitempty"`
}

func originOf(o netwatch.Origin) origin {
	return origin{Origin: o.Kind.String(), Port: o.Port, PID: o.PID, Comm: o.Comm}
}

type linkLine struct {
	Kind  string `json:"kind"`
	Event string `json:"event,omitempty"`
	origin
	Index     uint32 `json:"index"`
	Name      string `json:"name"`
	MTU       uint32 `json:"mtu"`
	Up        bool   `json:"up"`
	LinkKind  string `json:"link_kind,omitempty"`
	OperState string `json:"operstate,omitempty"`
}

type addrLine struct {
	Kind  string `json:"kind"`
	Event string `json:"event,omitempty"`
	origin
	Index  uint32 `json:"index"`
	Prefix string `json:"prefix"`
	Peer   string `json:"peer,omitempty"`
}

type routeLine struct {
	Kind  string `json:"kind"`
	Event string `json:"event,omitempty"`
	origin
	Family   int       `json:"family"`
	Table    uint32    `json:"table"`
	Dst      string    `json:"dst"`
	From     string    `json:"from,omitempty"`
	Gateway  string    `json:"gateway,omitempty"`
	Index    uint32    `json:"index,omitempty"`
	Dev      string    `json:"dev,omitempty"`
	Src      string    `json:"src,omitempty"`
	MTU      uint32    `json:"mtu,omitempty"`
	Metric   uint32    `json:"metric"`
	Protocol uint8     `json:"protocol"`
	Scope    uint8     `json:"scope"`
	Type     uint8     `json:"type"`
	Flags    uint32    `json:"flags,omitempty"`
	NextHops []hopLine `json:"nexthops,omitempty"`
	NHID     uint32    `json:"nhid,omitempty"`
}

type hopLine struct {
	Gateway string `json:"gateway,omitempty"`
	Index   uint32 `json:"index,omitempty"`
	Dev     string `json:"dev,omitempty"`
	Weight  uint16 `json:"weight"`
}

type ruleLine struct {
	Kind  string `json:"kind"`
	Event string `json:"event,omitempty"`
	origin
	Family   int    `json:"family"`
	Priority uint32 `json:"priority"`
	Table    uint32 `json:"table"`
	Mark     uint32 `json:"mark,omitempty"`
	Mask     uint32 `json:"mask,omitempty"`
	Invert   bool   `json:"invert,omitempty"`
	Protocol uint8  `json:"protocol"`
	Action   string `json:"action,omitempty"`
	From     string `json:"from,omitempty"`
	To       string `json:"to,omitempty"`
	IIF      string `json:"iif,omitempty"`
	OIF      string `json:"oif,omitempty"`
	Unknown  bool   `json:"unknown_attributes,omitempty"`
}

// eventLine returns the line of one change: the object's line with the
// event and its origin.
func eventLine(ev netwatch.Event, names map[uint32]string) any {
	o := originOf(ev.Origin)
	switch l := line(ev, ev.Op.String(), names).(type) {
	case linkLine:
		l.origin = o
		return l
	case addrLine:
		l.origin = o
		return l
	case routeLine:
		l.origin = o
		return l
	case ruleLine:
		l.origin = o
		return l
	}
	panic("unreachable")
}

// line returns the dump line of one object; event is "", "new" or "del".
func line(ev netwatch.Event, event string, names map[uint32]string) any {
	switch ev.Kind {
	case netwatch.KindLink:
		l := ev.Link
		return linkLine{Kind: "link", Event: event, Index: l.Index, Name: l.Name, MTU: l.MTU, Up: l.Up(),
			LinkKind: l.Kind, OperState: l.OperState.String()}
	case netwatch.KindAddr:
		a := ev.Addr
		o := addrLine{Kind: "addr", Event: event, Index: a.Index, Prefix: a.Prefix.String()}
		if a.Peer.IsValid() {
			o.Peer = a.Peer.String()
		}
		return o
	case netwatch.KindRoute:
		r := ev.Route
		o := routeLine{Kind: "route", Event: event, Family: int(r.Family), Table: uint32(r.Table), Dst: r.Dst.String(),
			Index: r.Index, Dev: names[r.Index], MTU: r.MTU, Metric: r.Metric, Protocol: uint8(r.Protocol),
			Scope: uint8(r.Scope), Type: uint8(r.Type), Flags: uint32(r.Flags), NHID: r.NHID}
		if r.Src.IsValid() {
			o.From = r.Src.String()
		}
		if r.Gateway.IsValid() {
			o.Gateway = r.Gateway.String()
		}
		if r.PrefSrc.IsValid() {
			o.Src = r.PrefSrc.String()
		}
		for _, nh := range r.NextHops {
			h := hopLine{Index: nh.Index, Dev: names[nh.Index], Weight: nh.Weight}
			if nh.Gateway.IsValid() {
				h.Gateway = nh.Gateway.String()
			}
			o.NextHops = append(o.NextHops, h)
		}
		return o
	default:
		r := ev.Rule
		o := ruleLine{Kind: "rule", Event: event, Family: int(r.Family), Priority: r.Priority, Table: uint32(r.Table),
			Mark: uint32(r.Mark), Mask: uint32(r.Mask), Invert: r.Invert, Protocol: uint8(r.Protocol),
			IIF: r.IIF, OIF: r.OIF, Unknown: r.Unknown}
		if r.Action != netwatch.ActionToTable {
			o.Action = r.Action.String()
		}
		if r.Src.IsValid() {
			o.From = r.Src.String()
		}
		if r.Dst.IsValid() {
			o.To = r.Dst.String()
		}
		return o
	}
}
