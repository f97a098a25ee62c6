//go:build linux

package netwatch

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fieldCase sets one field of a route or rule to a value that differs from
// the base object's, as the kernel could report it.
type fieldCase[T any] struct {
	set func(*T)
	// noText says why the field is not in the text form, if it is not;
	// noWire why a request does not carry it.
	noText, noWire string
}

// TestModelFieldsCovered guards against a field added to Route, NextHop,
// Metrics or Rule and forgotten somewhere: each field, set alone, must make
// the object unequal to the base (Equal), survive encode and decode with
// its value (the round trip the fuzzers compare with Equal, which would
// not notice a field Equal forgets), and change the text form (Describe,
// String). A field without a case below fails the test by name.
func TestModelFieldsCovered(t *testing.T) {
	base := Route{Family: IPv6, Table: 900, Dst: netip.MustParsePrefix("fd01::/64"), Metric: 1024,
		Index: 2, Protocol: 77, Type: RouteUnicast}
	hop := func(f func(*NextHop)) func(*Route) {
		return func(r *Route) {
			r.Index = 0
			r.NextHops = []NextHop{{Index: 2, Weight: 1}, {Index: 3, Weight: 1}}
			f(&r.NextHops[0])
		}
	}
	metric := func(f func(*Metrics)) func(*Route) { return func(r *Route) { f(&r.Metrics) } }
	routeCases := map[string]fieldCase[Route]{
		"Family":   {set: func(r *Route) { r.Family, r.Dst = IPv4, netip.MustParsePrefix("10.1.0.0/16"); r.Metric = 0 }},
		"Table":    {set: func(r *Route) { r.Table = 901 }},
		"Dst":      {set: func(r *Route) { r.Dst = netip.MustParsePrefix("fd02::/64") }},
		"Src":      {set: func(r *Route) { r.Src = netip.MustParsePrefix("fd00::/48") }},
		"TOS":      {set: func(r *Route) { r.Family, r.Dst, r.Metric, r.TOS = IPv4, netip.MustParsePrefix("10.1.0.0/16"), 0, 0x10 }},
		"Metric":   {set: func(r *Route) { r.Metric = 7 }},
		"Gateway":  {set: func(r *Route) { r.Gateway = netip.MustParseAddr("fd00::1") }},
		"Index":    {set: func(r *Route) { r.Index = 3 }},
		"PrefSrc":  {set: func(r *Route) { r.PrefSrc = netip.MustParseAddr("fd00::5") }},
		"MTU":      {set: func(r *Route) { r.MTU = 1355 }},
		"Protocol": {set: func(r *Route) { r.Protocol = ProtoDHCP }},
		"Scope":    {set: func(r *Route) { r.Scope = ScopeLink }},
		"Type":     {set: func(r *Route) { r.Type = RouteBlackhole }},
		"Flags":    {set: func(r *Route) { r.Flags = RouteOnlink }},
		"NextHops": {set: hop(func(*NextHop) {})},
		"NHID":     {set: func(r *Route) { r.NHID = 7 }},
		"Metrics":  {set: metric(func(m *Metrics) { m.AdvMSS = 1300 })},
		"Flow":     {set: func(r *Route) { r.Flow = 5 }},
		"Pref":     {set: func(r *Route) { r.Pref = prefHigh }},
		"Expires":  {set: func(r *Route) { r.Expires = time.Now().Add(time.Hour) }},
		"Encap": {set: func(r *Route) {
			r.Encap = Encap{Type: unix.LWTUNNEL_ENCAP_MPLS, Data: string(appendAttr(nil, 1, []byte{0, 1, 0x41, 0}))}
		}},
		"Attrs": {set: func(r *Route) { r.Attrs = Attrs(appendAttr(nil, 99, []byte{1, 2, 3, 4})) }},
	}
	hopCases := map[string]fieldCase[Route]{
		"Gateway": {set: hop(func(h *NextHop) { h.Gateway = netip.MustParseAddr("fd00::1") })},
		"Index":   {set: hop(func(h *NextHop) { h.Index = 4 })},
		"Weight":  {set: hop(func(h *NextHop) { h.Weight = 3 })},
		"Flags":   {set: hop(func(h *NextHop) { h.Flags = RouteOnlink })},
		"Flow":    {set: hop(func(h *NextHop) { h.Flow = 5 })},
		"Encap": {set: hop(func(h *NextHop) {
			h.Encap = Encap{Type: unix.LWTUNNEL_ENCAP_MPLS, Data: string(appendAttr(nil, 1, []byte{0, 1, 0x41, 0}))}
		})},
		"Attrs": {set: hop(func(h *NextHop) { h.Attrs = Attrs(appendAttr(nil, 99, []byte{1, 2, 3, 4})) })},
	}
	metricCases := map[string]fieldCase[Route]{
		"Locks":      {set: metric(func(m *Metrics) { m.AdvMSS, m.Locks = 1300, 1<<unix.RTAX_ADVMSS })},
		"Window":     {set: metric(func(m *Metrics) { m.Window = 1000 })},
		"RTT":        {set: metric(func(m *Metrics) { m.RTT = 800 })},
		"RTTVar":     {set: metric(func(m *Metrics) { m.RTTVar = 80 })},
		"SSThresh":   {set: metric(func(m *Metrics) { m.SSThresh = 30 })},
		"CWnd":       {set: metric(func(m *Metrics) { m.CWnd = 10 })},
		"AdvMSS":     {set: metric(func(m *Metrics) { m.AdvMSS = 1300 })},
		"Reordering": {set: metric(func(m *Metrics) { m.Reordering = 5 })},
		"HopLimit":   {set: metric(func(m *Metrics) { m.HopLimit = 9 })},
		"InitCWnd":   {set: metric(func(m *Metrics) { m.InitCWnd = 10 })},
		"Features":   {set: metric(func(m *Metrics) { m.Features = 1 })},
		"RTOMin":     {set: metric(func(m *Metrics) { m.RTOMin = 5 })},
		"InitRWnd":   {set: metric(func(m *Metrics) { m.InitRWnd = 20 })},
		"QuickAck":   {set: metric(func(m *Metrics) { m.QuickAck = 1 })},
		"CongCtl":    {set: metric(func(m *Metrics) { m.CongCtl = "reno" })},
		"FastOpen":   {set: metric(func(m *Metrics) { m.FastOpen = 1 })},
		"Attrs":      {set: metric(func(m *Metrics) { m.Attrs = Attrs(appendAttr(nil, 99, []byte{1, 2, 3, 4})) })},
	}
	checkFields(t, "Route", reflect.TypeFor[Route](), routeCases)
	checkFields(t, "NextHop", reflect.TypeFor[NextHop](), hopCases)
	checkFields(t, "Metrics", reflect.TypeFor[Metrics](), metricCases)
	for _, group := range []map[string]fieldCase[Route]{routeCases, hopCases, metricCases} {
		for name, c := range group {
			r := base
			c.set(&r)
			if r.Equal(base) {
				t.Errorf("route %s: Equal does not see it", name)
			}
			b, err := encodeRoute(r)
			if err != nil {
				t.Errorf("route %s: encode: %v", name, err)
				continue
			}
			back, err := decodeRoute(b, tableFilter{})
			if err != nil || !back.Equal(r) || !sameFields(back, r) {
				t.Errorf("route %s: round trip\n got %+v, %v\nwant %+v", name, back, err, r)
			}
			if c.noText == "" && r.String() == base.String() {
				t.Errorf("route %s: the text form does not show it: %s", name, r)
			}
		}
	}

	rbase := Rule{Family: IPv4, Priority: 900, Table: 900, Action: ActionToTable, Protocol: 77}
	ruleCases := map[string]fieldCase[Rule]{
		"Family":            {set: func(r *Rule) { r.Family = IPv6 }, noText: "`ip rule` prints a family apart (ip -6 rule)"},
		"Priority":          {set: func(r *Rule) { r.Priority = 901 }},
		"Table":             {set: func(r *Rule) { r.Table = 901 }},
		"Action":            {set: func(r *Rule) { r.Action, r.Table = actionBlackhole, 0 }},
		"Invert":            {set: func(r *Rule) { r.Invert = true }},
		"Mark":              {set: func(r *Rule) { r.Mark = 0xe00 }},
		"Mask":              {set: func(r *Rule) { r.Mark, r.Mask = 0xe00, 0xf00 }},
		"Protocol":          {set: func(r *Rule) { r.Protocol = ProtoStatic }},
		"Src":               {set: func(r *Rule) { r.Src = netip.MustParsePrefix("10.0.0.0/8") }},
		"Dst":               {set: func(r *Rule) { r.Dst = netip.MustParsePrefix("10.0.0.0/8") }},
		"TOS":               {set: func(r *Rule) { r.TOS = 0x10 }},
		"IIF":               {set: func(r *Rule) { r.IIF = "eth0" }},
		"OIF":               {set: func(r *Rule) { r.OIF = "eth0" }},
		"Goto":              {set: func(r *Rule) { r.Action, r.Table, r.Goto = actionGoto, 0, 905 }},
		"Flow":              {set: func(r *Rule) { r.Flow = 5 }},
		"L3MDev":            {set: func(r *Rule) { r.L3MDev = 1 }},
		"IPProto":           {set: func(r *Rule) { r.IPProto = unix.IPPROTO_UDP }},
		"SPort":             {set: func(r *Rule) { r.SPort = PortRange{1000, 2000} }},
		"DPort":             {set: func(r *Rule) { r.DPort = PortRange{53, 53} }},
		"UID":               {set: func(r *Rule) { r.UID = UIDRange{Set: true, Start: 100, End: 200} }},
		"TunID":             {set: func(r *Rule) { r.TunID = 9 }},
		"SuppressPrefixLen": {set: func(r *Rule) { r.SuppressPrefixLen = Optional{Set: true, Value: 0} }},
		"SuppressIfGroup":   {set: func(r *Rule) { r.SuppressIfGroup = Optional{Set: true, Value: 5} }},
		"State": {set: func(r *Rule) { r.State = 0x4 }, noText: "the kernel's own flags, not part of the rule (Equal ignores them too)",
			noWire: "the kernel sets them; a request cannot"},
		"Attrs": {set: func(r *Rule) { r.Attrs = Attrs(appendAttr(nil, 25, []byte{0x2e})) }},
	}
	checkFields(t, "Rule", reflect.TypeFor[Rule](), ruleCases)
	for name, c := range ruleCases {
		r := rbase
		c.set(&r)
		if name != "State" && r.Equal(rbase) {
			t.Errorf("rule %s: Equal does not see it", name)
		}
		b, err := encodeRule(r)
		if err != nil {
			t.Errorf("rule %s: encode: %v", name, err)
			continue
		}
		if c.noWire != "" {
			r.State = 0
		}
		if back, err := decodeRule(b); err != nil || back != r {
			t.Errorf("rule %s: round trip\n got %+v, %v\nwant %+v", name, back, err, r)
		}
		if c.noText == "" && r.String() == rbase.String() {
			t.Errorf("rule %s: the text form does not show it: %s", name, r)
		}
	}
}

// checkFields fails for each field of typ that has no case.
func checkFields[T any](t *testing.T, name string, typ reflect.Type, cases map[string]fieldCase[T]) {
	t.Helper()
	for f := range typ.Fields() {
		if _, ok := cases[f.Name]; !ok {
			t.Errorf("%s.%s has no case in TestModelFieldsCovered: compare it in Equal, encode and decode it, print it, then add it here", name, f.Name)
		}
	}
}

// sameFields reports whether two routes hold the same values field by
// field, the expiry within the kernel's rounding.
func sameFields(a, b Route) bool {
	if !sameExpiry(a.Expires, b.Expires) {
		return false
	}
	a.Expires, b.Expires = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}
