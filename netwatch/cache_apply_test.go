package netwatch

import (
	"net/netip"
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
