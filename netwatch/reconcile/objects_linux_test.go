//go:build linux

package reconcile

import (
	"hash/maphash"
	"net/netip"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch"
)

// TestPlainObjects: an object changed once costs a plain entry, not a full
// object; changed again within a refill it becomes a full object whose
// bucket counts the first change; the rate limit holds for it as for any.
func TestPlainObjects(t *testing.T) {
	l := &loop{burst: 3, interval: 100 * time.Millisecond, objs: map[objectID]*object{},
		plain: map[uint64]plainObject{}, seed: maphash.MakeSeed()}
	op := func(dst string) netwatch.Op {
		return netwatch.Op{Kind: netwatch.RouteReplace, Route: netwatch.Route{Family: netwatch.IPv4, Table: 900,
			Dst: netip.MustParsePrefix(dst), Type: netwatch.RouteUnicast, Index: 2}}
	}
	a, b := op("10.0.0.0/24"), op("10.0.1.0/24")
	t0 := time.Unix(1000, 0)
	texts := []string{"a", "b"}

	if n := l.admit([]netwatch.Op{a, b}, texts, t0); n != 2 {
		t.Fatalf("first changes: %d admitted, want 2", n)
	}
	if len(l.objs) != 0 || len(l.plain) != 2 {
		t.Fatalf("after one change each: %d full and %d plain objects, want 0 and 2", len(l.objs), len(l.plain))
	}
	l.made(a, t0)
	if po := l.plain[l.objectHash(opObjectID(a))]; !po.made {
		t.Error("made did not mark the plain object")
	}

	// A refill later, b is a plain object again with a full bucket.
	if n := l.admit([]netwatch.Op{b}, texts[1:], t0.Add(time.Second)); n != 1 || len(l.objs) != 0 {
		t.Fatalf("b a second later: %d admitted, %d full objects; want 1 and 0", n, len(l.objs))
	}

	// a again at once: a full object, its bucket holding burst-1 from the
	// first change; two more go through (3 in all), the next waits.
	t1 := t0.Add(time.Millisecond)
	for i := range 2 {
		if n := l.admit([]netwatch.Op{a}, texts[:1], t1); n != 1 {
			t.Fatalf("a's change %d: not admitted", i+2)
		}
	}
	o := l.objs[opObjectID(a)]
	if o == nil || !o.made || o.text != "a" {
		t.Fatalf("a's full object = %+v, want one that was made, with its text", o)
	}
	if _, ok := l.plain[l.objectHash(opObjectID(a))]; ok {
		t.Error("a is both a plain and a full object")
	}
	if n := l.admit([]netwatch.Op{a}, texts[:1], t1); n != 0 {
		t.Errorf("a's fourth change in a burst of 3: admitted")
	}
	if n := l.admit([]netwatch.Op{a}, texts[:1], t1.Add(l.interval)); n != 1 {
		t.Errorf("a's change after an interval: not admitted")
	}

	// Forgetting drops plain objects changed before the cutoff.
	l.forgetPlain(t0.Add(500 * time.Millisecond))
	if len(l.plain) != 1 {
		t.Errorf("after forgetting those before b's last change: %d plain objects, want 1 (b)", len(l.plain))
	}
}
