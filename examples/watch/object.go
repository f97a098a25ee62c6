package main

import (
	"encoding/hex"
	"strconv"
	"time"

	"github.com/mdlayher/netlink"

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
	Family   int         `json:"family"`
	Table    uint32      `json:"table"`
	Dst      string      `json:"dst"`
	From     string      `json:"from,omitempty"`
	TOS      uint8       `json:"tos,omitempty"`
	Gateway  string      `json:"gateway,omitempty"`
	Index    uint32      `json:"index,omitempty"`
	Dev      string      `json:"dev,omitempty"`
	Src      string      `json:"src,omitempty"`
	MTU      uint32      `json:"mtu,omitempty"`
	Metric   uint32      `json:"metric"`
	Protocol uint8       `json:"protocol"`
	Scope    uint8       `json:"scope"`
	Type     uint8       `json:"type"`
	Flags    uint32      `json:"flags,omitempty"`
	NextHops []hopLine   `json:"nexthops,omitempty"`
	NHID     uint32      `json:"nhid,omitempty"`
	Metrics  *metricsObj `json:"metrics,omitempty"`
	Locks    []string    `json:"locks,omitempty"`
	Flow     uint32      `json:"flow,omitempty"`
	Pref     string      `json:"pref,omitempty"`
	Expires  int64       `json:"expires,omitempty"`
	Encap    *encapObj   `json:"encap,omitempty"`
	Attrs    []attrObj   `json:"attrs,omitempty"`
}

type hopLine struct {
	Gateway string    `json:"gateway,omitempty"`
	Index   uint32    `json:"index,omitempty"`
	Dev     string    `json:"dev,omitempty"`
	Weight  uint16    `json:"weight"`
	Flags   uint32    `json:"flags,omitempty"`
	Flow    uint32    `json:"flow,omitempty"`
	Encap   *encapObj `json:"encap,omitempty"`
	Attrs   []attrObj `json:"attrs,omitempty"`
}

// metricsObj are a route's metrics other than the MTU, in the kernel's
// units (rtt in 1/8 ms, rttvar in 1/4 ms, rto_min in ms).
type metricsObj struct {
	Window     uint32    `json:"window,omitempty"`
	RTT        uint32    `json:"rtt,omitempty"`
	RTTVar     uint32    `json:"rttvar,omitempty"`
	SSThresh   uint32    `json:"ssthresh,omitempty"`
	CWnd       uint32    `json:"cwnd,omitempty"`
	AdvMSS     uint32    `json:"advmss,omitempty"`
	Reordering uint32    `json:"reordering,omitempty"`
	HopLimit   uint32    `json:"hoplimit,omitempty"`
	InitCWnd   uint32    `json:"initcwnd,omitempty"`
	Features   uint32    `json:"features,omitempty"`
	RTOMin     uint32    `json:"rto_min,omitempty"`
	InitRWnd   uint32    `json:"initrwnd,omitempty"`
	QuickAck   uint32    `json:"quickack,omitempty"`
	CongCtl    string    `json:"congctl,omitempty"`
	FastOpen   uint32    `json:"fastopen_no_cookie,omitempty"`
	Attrs      []attrObj `json:"attrs,omitempty"`
}

type encapObj struct {
	Type uint16 `json:"type"`
	Data string `json:"data"` // hex
}

// attrObj is an attribute netwatch keeps undecoded: its type, and its value
// in hex.
type attrObj struct {
	Type uint16 `json:"type"`
	Data string `json:"data"`
}

type ruleLine struct {
	Kind  string `json:"kind"`
	Event string `json:"event,omitempty"`
	origin
	Family            int       `json:"family"`
	Priority          uint32    `json:"priority"`
	Table             uint32    `json:"table"`
	Mark              uint32    `json:"mark,omitempty"`
	Mask              uint32    `json:"mask,omitempty"`
	Invert            bool      `json:"invert,omitempty"`
	Protocol          uint8     `json:"protocol"`
	Action            string    `json:"action,omitempty"`
	From              string    `json:"from,omitempty"`
	To                string    `json:"to,omitempty"`
	TOS               uint8     `json:"tos,omitempty"`
	IIF               string    `json:"iif,omitempty"`
	OIF               string    `json:"oif,omitempty"`
	Goto              uint32    `json:"goto,omitempty"`
	Flow              uint32    `json:"flow,omitempty"`
	L3MDev            uint8     `json:"l3mdev,omitempty"`
	IPProto           uint8     `json:"ipproto,omitempty"`
	SPort             []uint16  `json:"sport,omitempty"`
	DPort             []uint16  `json:"dport,omitempty"`
	UID               []uint32  `json:"uidrange,omitempty"`
	TunID             uint64    `json:"tun_id,omitempty"`
	SuppressPrefixLen *int32    `json:"suppress_prefixlength,omitempty"`
	SuppressIfGroup   *int32    `json:"suppress_ifgroup,omitempty"`
	State             uint32    `json:"state,omitempty"`
	Attrs             []attrObj `json:"attrs,omitempty"`
}

// verb is an event's first word, as ip monitor's "Deleted" is: "new" for
// an object that appeared or changed, "del" for one that went away.
func verb(ev netwatch.Event) string {
	if ev.Deleted {
		return "del"
	}
	return "new"
}

// eventLine returns the line of one change: the object's line with the
// event and its origin.
func eventLine(ev netwatch.Event, names map[uint32]string) any {
	o := originOf(ev.Origin)
	switch l := line(ev, verb(ev), names).(type) {
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
		return linkLine{Kind: "link", Event: event, Index: l.Index, Name: l.Name, MTU: l.MTU, Up: l.Flags&netwatch.LinkUp != 0,
			LinkKind: l.Kind, OperState: l.OperState.String()}
	case netwatch.KindAddr:
		a := ev.Addr
		o := addrLine{Kind: "addr", Event: event, Index: a.Index, Prefix: a.Prefix.String()}
		if a.Peer.IsValid() {
			o.Peer = a.Peer.String()
		}
		return o
	case netwatch.KindRoute:
		return routeOf(ev.Route, event, names)
	default:
		return ruleOf(ev.Rule, event)
	}
}

func routeOf(r netwatch.Route, event string, names map[uint32]string) routeLine {
	o := routeLine{Kind: "route", Event: event, Family: int(r.Family), Table: uint32(r.Table), Dst: r.Dst.String(),
		TOS: r.TOS, Index: r.Index, Dev: names[r.Index], MTU: r.MTU, Metric: r.Metric, Protocol: uint8(r.Protocol),
		Scope: uint8(r.Scope), Type: uint8(r.Type), Flags: uint32(r.Flags), NHID: r.NHID, Flow: r.Flow,
		Encap: encapOf(r.Encap), Attrs: attrsOf(r.Attrs), Locks: locksOf(r.Metrics.Locks)}
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
		h := hopLine{Index: nh.Index, Dev: names[nh.Index], Weight: nh.Weight, Flags: uint32(nh.Flags), Flow: nh.Flow,
			Encap: encapOf(nh.Encap), Attrs: attrsOf(nh.Attrs)}
		if nh.Gateway.IsValid() {
			h.Gateway = nh.Gateway.String()
		}
		o.NextHops = append(o.NextHops, h)
	}
	if m := r.Metrics; m != (netwatch.Metrics{Locks: m.Locks}) {
		o.Metrics = &metricsObj{Window: m.Window, RTT: m.RTT, RTTVar: m.RTTVar, SSThresh: m.SSThresh, CWnd: m.CWnd,
			AdvMSS: m.AdvMSS, Reordering: m.Reordering, HopLimit: m.HopLimit, InitCWnd: m.InitCWnd, Features: m.Features,
			RTOMin: m.RTOMin, InitRWnd: m.InitRWnd, QuickAck: m.QuickAck, CongCtl: m.CongCtl, FastOpen: m.FastOpen,
			Attrs: attrsOf(m.Attrs)}
	}
	if r.Pref != 0 {
		o.Pref = r.Pref.String()
	}
	if !r.Expires.IsZero() {
		o.Expires = max(1, int64(time.Until(r.Expires).Round(time.Second)/time.Second))
	}
	return o
}

func ruleOf(r netwatch.Rule, event string) ruleLine {
	o := ruleLine{Kind: "rule", Event: event, Family: int(r.Family), Priority: r.Priority, Table: uint32(r.Table),
		Mark: uint32(r.Mark), Mask: uint32(r.Mask), Invert: r.Invert, Protocol: uint8(r.Protocol),
		TOS: r.TOS, IIF: r.IIF, OIF: r.OIF, Goto: r.Goto, Flow: r.Flow, L3MDev: r.L3MDev, IPProto: r.IPProto,
		TunID: r.TunID, State: r.State, Attrs: attrsOf(r.Attrs)}
	if r.Action != netwatch.ActionToTable {
		o.Action = r.Action.String()
	}
	if r.Src.IsValid() {
		o.From = r.Src.String()
	}
	if r.Dst.IsValid() {
		o.To = r.Dst.String()
	}
	if r.SPort != (netwatch.PortRange{}) {
		o.SPort = []uint16{r.SPort.Start, r.SPort.End}
	}
	if r.DPort != (netwatch.PortRange{}) {
		o.DPort = []uint16{r.DPort.Start, r.DPort.End}
	}
	if r.UID.Set {
		o.UID = []uint32{r.UID.Start, r.UID.End}
	}
	if r.SuppressPrefixLen.Set {
		o.SuppressPrefixLen = &r.SuppressPrefixLen.Value
	}
	if r.SuppressIfGroup.Set {
		o.SuppressIfGroup = &r.SuppressIfGroup.Value
	}
	return o
}

func encapOf(e netwatch.Encap) *encapObj {
	if e == (netwatch.Encap{}) {
		return nil
	}
	return &encapObj{Type: e.Type, Data: hex.EncodeToString([]byte(e.Data))}
}

func attrsOf(a netwatch.Attrs) []attrObj {
	var out []attrObj
	ad, err := netlink.NewAttributeDecoder([]byte(a))
	if err != nil {
		return nil // netwatch keeps only whole attributes: never
	}
	for ad.Next() {
		out = append(out, attrObj{Type: ad.Type(), Data: hex.EncodeToString(ad.Bytes())})
	}
	return out
}

// lockNames are the metrics by RTAX number, as ip(8) names them.
var lockNames = [...]string{2: "mtu", 3: "window", 4: "rtt", 5: "rttvar", 6: "ssthresh", 7: "cwnd", 8: "advmss",
	9: "reordering", 10: "hoplimit", 11: "initcwnd", 12: "features", 13: "rto_min", 14: "initrwnd", 15: "quickack",
	16: "congctl", 17: "fastopen_no_cookie"}

// locksOf names the locked metrics; a bit without a name as its number.
func locksOf(locks uint32) []string {
	var out []string
	for i := range 32 {
		if locks&(1<<i) == 0 {
			continue
		}
		if i < len(lockNames) && lockNames[i] != "" {
			out = append(out, lockNames[i])
		} else {
			out = append(out, strconv.Itoa(i))
		}
	}
	return out
}
