package netwatch

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

// TestMergeOut: a re-dump of one link's routes changes those routes in
// their place among the routes of their key, adds what the dump has
// beyond them last, and gives up where it cannot match them.
func TestMergeOut(t *testing.T) {
	dst := netip.MustParsePrefix("fd0b::/64")
	r := func(index uint32, gw string, mtu uint32) Route {
		rt := Route{Family: IPv6, Table: TableMain, Dst: dst, Metric: 1024, Index: index, Type: RouteUnicast, MTU: mtu}
		if gw != "" {
			rt.Gateway = netip.MustParseAddr(gw)
		}
		return rt
	}
	multi := Route{Family: IPv6, Table: TableMain, Dst: dst, Metric: 1024, Type: RouteUnicast,
		NextHops: []NextHop{{Index: 2, Gateway: netip.MustParseAddr("fd00::2")}, {Index: 2, Gateway: netip.MustParseAddr("fd00::3")}}}
	for _, c := range []struct {
		name        string
		cur, dumped []Route
		want        []Route
		news, dels  int
		ambiguous   bool
	}{
		{name: "silent MTU change in the middle keeps its place",
			cur: []Route{r(2, "", 0), r(5, "", 0), r(3, "", 0)}, dumped: []Route{r(5, "", 1400)},
			want: []Route{r(2, "", 0), r(5, "", 1400), r(3, "", 0)}, news: 1},
		{name: "flushed",
			cur: []Route{r(5, "", 0), r(2, "", 0)}, dumped: nil,
			want: []Route{r(2, "", 0)}, dels: 1},
		{name: "unchanged",
			cur: []Route{r(5, "", 0), r(2, "", 0)}, dumped: []Route{r(5, "", 0)},
			want: []Route{r(5, "", 0), r(2, "", 0)}},
		{name: "new from the dump goes last",
			cur: []Route{r(2, "", 0)}, dumped: []Route{r(5, "fe80::1", 0)},
			want: []Route{r(2, "", 0), r(5, "fe80::1", 0)}, news: 1},
		{name: "a multipath route out of another link stays",
			cur: []Route{multi, r(5, "", 0)}, dumped: []Route{r(5, "", 1300)},
			want: []Route{multi, r(5, "", 1300)}, news: 1},
		{name: "a multipath route out of the link",
			cur: []Route{{Family: IPv6, Table: TableMain, Dst: dst, Metric: 1024, Type: RouteUnicast,
				NextHops: []NextHop{{Index: 2, Gateway: netip.MustParseAddr("fd00::2")}, {Index: 5, Gateway: netip.MustParseAddr("fd00::3")}}}},
			dumped: nil, ambiguous: true},
		{name: "two cached routes match one dumped",
			cur: []Route{r(5, "", 0), r(5, "", 1300)}, dumped: []Route{r(5, "", 1400)}, ambiguous: true},
		{name: "one cached route matches two dumped",
			cur: []Route{r(5, "", 0)}, dumped: []Route{r(5, "", 1300), r(5, "", 1400)}, ambiguous: true},
		{name: "a dumped route out of another link",
			cur: nil, dumped: []Route{r(2, "", 0)}, ambiguous: true},
	} {
		rs, evs, ok := mergeOut(c.cur, c.dumped, 5)
		if ok == c.ambiguous {
			t.Errorf("%s: ok = %v", c.name, ok)
			continue
		}
		if !ok {
			continue
		}
		if !slices.EqualFunc(rs, c.want, Route.Equal) {
			t.Errorf("%s: routes\n got %v\nwant %v", c.name, rs, c.want)
		}
		var news, dels int
		for _, ev := range evs {
			if !ev.Deleted {
				news++
			} else {
				dels++
			}
		}
		if news != c.news || dels != c.dels {
			t.Errorf("%s: %d new and %d deleted events, want %d and %d", c.name, news, dels, c.news, c.dels)
		}
	}
}

// TestLinkEventRechecks: a link event asks for the routes out of the link
// now and once more later (the kernel changes their flags and MTUs in the
// notifier chain that sends the event, which a re-read can overtake), per
// family as the event can change them, and a batch of events keeps every
// later re-read (it lost them, and a stale linkdown stayed in the cache).
func TestLinkEventRechecks(t *testing.T) {
	const idx = 7
	link := Link{Index: idx, Name: "br0", MTU: 1500, Flags: LinkUp | LinkLowerUp}
	newCache := func() *state {
		s := newState()
		s.apply(&change{Event: Event{Kind: KindLink, Link: link}})
		for _, dst := range []string{"10.7.0.0/24", "fd07::/64"} {
			p := netip.MustParsePrefix(dst)
			f := FamilyOf(p.Addr())
			s.apply(&change{Event: Event{Kind: KindRoute, Route: Route{Family: f, Table: TableMain, Dst: p,
				Index: idx, Type: RouteUnicast, Scope: ScopeLink}}})
		}
		return s
	}
	both := [2][]uint32{{idx}, {idx}}
	for _, c := range []struct {
		name      string
		change    func(l *Link)
		now, want [2][]uint32
	}{
		{"carrier lost", func(l *Link) { l.Flags &^= LinkLowerUp }, both, both},
		{"MTU", func(l *Link) { l.MTU = 1400 }, [2][]uint32{nil, {idx}}, [2][]uint32{nil, {idx}}},
		{"unchanged, with carrier", func(*Link) {}, [2][]uint32{nil, {idx}}, both},
	} {
		s := newCache()
		l := link
		c.change(&l)
		_, rd := s.apply(&change{Event: Event{Kind: KindLink, Link: l}})
		if !reflect.DeepEqual(rd.out, c.now) || !reflect.DeepEqual(rd.later, c.want) {
			t.Errorf("%s: re-read now %v and later %v, want %v and %v", c.name, rd.out, rd.later, c.now, c.want)
		}
		var batch redumps
		batch.add(redumps{})
		batch.add(rd)
		batch.add(rd)
		if !reflect.DeepEqual(batch.later, c.want) {
			t.Errorf("%s: a batch keeps %v to re-read later, want %v", c.name, batch.later, c.want)
		}
	}
}
