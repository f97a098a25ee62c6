package netwatch

import (
	"maps"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"pgregory.net/rapid"
)

// testKey is a store key whose order is its value, with few values so
// that operations collide.
type testKey uint16

func (a testKey) compare(b testKey) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkStore compares s with the model m and checks the store's own
// invariants: a sorted array, full chunks, a consistent dead count, and no
// key both in the array and among the added ones.
func checkStore(t interface{ Fatalf(string, ...any) }, s *store[testKey, int], m map[testKey]int) {
	if s.len() != len(m) {
		t.Fatalf("len %d, model has %d", s.len(), len(m))
	}
	got := map[testKey]int{}
	s.all(func(k testKey, v int) bool {
		if _, dup := got[k]; dup {
			t.Fatalf("all yields %d twice", k)
		}
		got[k] = v
		return true
	})
	if !maps.Equal(got, m) {
		t.Fatalf("all yields %v, model is %v", got, m)
	}
	for k, v := range m {
		if g, ok := s.get(k); !ok || g != v {
			t.Fatalf("get(%d) = %d, %v; want %d", k, g, ok, v)
		}
	}
	dead := 0
	for i := range s.n {
		if i > 0 && s.at(i-1).k.compare(s.at(i).k) >= 0 {
			t.Fatalf("array unsorted at %d", i)
		}
		if s.isDead(i) {
			dead++
		} else if _, ok := s.added[s.at(i).k]; ok {
			t.Fatalf("key %d both in the array and added", s.at(i).k)
		}
	}
	if dead != s.ndead {
		t.Fatalf("%d dead entries, counted %d", dead, s.ndead)
	}
	for ci, c := range s.chunks {
		if ci < len(s.chunks)-1 && len(c) != chunkLen {
			t.Fatalf("chunk %d of %d has %d entries", ci, len(s.chunks), len(c))
		}
	}
	if s.mem == nil {
		return
	}
	// The mapped regions are those under the chunks, one for one.
	if len(s.mem.regions) != len(s.chunks) {
		t.Fatalf("%d mapped regions for %d chunks", len(s.mem.regions), len(s.chunks))
	}
	for ci, r := range s.mem.regions {
		if ci == 0 && r != nil {
			t.Fatalf("the first chunk is mapped")
		}
		if c := s.chunks[ci]; r != nil && unsafe.Pointer(unsafe.SliceData(c)) != unsafe.Pointer(unsafe.SliceData(r)) {
			t.Fatalf("chunk %d is not in its mapped region", ci)
		}
	}
}

// TestStoreModel runs random adds, sets and deletes — in order, as a dump
// makes them, and out of order, as events do, past the sizes where chunks
// fill and the store compacts — against a plain map.
func TestStoreModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var s store[testKey, int]
		m := map[testKey]int{}
		// A dump: ascending keys with gaps, sometimes a repeat.
		n := rapid.IntRange(0, 3*chunkLen).Draw(t, "dumped")
		k := testKey(0)
		for i := range n {
			k += testKey(rapid.IntRange(0, 3).Draw(t, "step"))
			_, had := m[k]
			if added := s.add(k, i); added == had {
				t.Fatalf("add(%d) = %v with the key taken: %v", k, added, had)
			}
			if !had {
				m[k] = i
			}
		}
		checkStore(t, &s, m)
		max := int(k) + 100
		ops := rapid.IntRange(0, 4*compactMin).Draw(t, "ops")
		for i := range ops {
			k := testKey(rapid.IntRange(0, max).Draw(t, "key"))
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				s.set(k, -i)
				m[k] = -i
			case 1:
				_, had := m[k]
				if added := s.add(k, i); added == had {
					t.Fatalf("add(%d) = %v with the key taken: %v", k, added, had)
				}
				if !had {
					m[k] = i
				}
			default:
				s.del(k)
				delete(m, k)
			}
		}
		checkStore(t, &s, m)
	})
}

// TestStoreCompacts checks that out-of-order keys and deletions end up
// merged into the array rather than growing the side map without bound.
func TestStoreCompacts(t *testing.T) {
	var s store[testKey, int]
	for k := range testKey(20000) {
		if k%2 == 1 {
			s.add(k, int(k))
		}
	}
	for k := range testKey(20000) {
		if k%2 == 0 {
			s.set(k, int(k)) // out of order: into the side map, then merged
		}
	}
	if s.len() != 20000 || len(s.added) >= compactMin+s.n/4 {
		t.Fatalf("len %d, %d in the array, %d added; want 20000 with the added merged", s.len(), s.n, len(s.added))
	}
	for k := range testKey(19000) {
		s.del(k)
	}
	if s.len() != 1000 || s.n > 2000 {
		t.Fatalf("len %d, array of %d after deleting 19000; want 1000 in an array of at most 2000", s.len(), s.n)
	}
}

// TestStoreCompactTrailing: keys kept aside can sort after the array's
// last key once the entries at its end are deleted; a merge puts them
// after it.
func TestStoreCompactTrailing(t *testing.T) {
	var s store[testKey, int]
	m := map[testKey]int{}
	for k := testKey(0); k < 100; k += 2 {
		s.add(k, int(k))
		m[k] = int(k)
	}
	for k := testKey(81); k < 98; k += 2 {
		s.set(k, int(k)) // between array keys: aside
		m[k] = int(k)
	}
	for k := testKey(98); k >= 80; k -= 2 {
		s.del(k) // the array's last entry each time: popped
		delete(m, k)
	}
	if len(s.added) != 9 || s.at(s.n-1).k != 78 {
		t.Fatalf("setup: %d aside, last array key %d; want 9 aside after 78", len(s.added), s.at(s.n-1).k)
	}
	s.compact()
	if len(s.added) != 0 || s.n != len(m) {
		t.Fatalf("after the merge: %d aside, array of %d; want all %d in the array", len(s.added), s.n, len(m))
	}
	checkStore(t, &s, m)
}

// TestKeyOrder pins the orders the keys' compare follows: the kernel's dump
// order, checked against the real kernel in TestKernelDumpOrder.
func TestKeyOrder(t *testing.T) {
	v4 := []string{
		"0.0.0.0/0",
		"10.1.0.0/24 tos 8", "10.1.0.0/24 tos 8 metric 1", "10.1.0.0/24 tos 4 metric 3",
		"10.1.0.0/24", "10.1.0.0/24 metric 5", "10.1.0.0/16",
		"10.1.0.128/25", "10.2.0.0/15", "255.255.255.255/32",
	}
	v6 := []string{
		"::/0 from fd09::/64", "2001:db8::/32", "fd00::/64", "fd00:1::/32",
		"fd01::/32 from fd09::/64", "fd01::/64 from fd08::/63", "fd01::/64 from fd09::/64", "fd01::/64", "fd01::/64 metric 5",
		"fd01:0:0:1::/64", "fd01::/63", "fd01::/56", "fd01::/48", "fd01:0:1::/48 from fd09::/64", "fd01:0:1:200::/56",
		"fd01:0:1:300::/64 from fd09::/64 metric 5", "fd01:0:1:300::/64", "fd01:0:1::/48",
		"fd01::/33", "fd01::/32", "fe80::/64", "::/0",
	}
	for _, tc := range []struct {
		name string
		keys []string
	}{{"IPv4", v4}, {"IPv6", v6}} {
		t.Run(tc.name, func(t *testing.T) {
			keys := make([]RouteKey, len(tc.keys))
			for i, s := range tc.keys {
				keys[i] = parseTestKey(t, s)
			}
			for i := range keys {
				for j := range keys {
					var got int
					if keys[i].Family == IPv4 {
						got = mk4(keys[i]).compare(mk4(keys[j]))
					} else {
						got = mk6(keys[i]).compare(mk6(keys[j]))
					}
					if want := sign(i - j); got != want {
						t.Errorf("compare(%q, %q) = %d, want %d", tc.keys[i], tc.keys[j], got, want)
					}
				}
			}
		})
	}
}

func sign(n int) int {
	switch {
	case n < 0:
		return -1
	case n > 0:
		return 1
	}
	return 0
}

// parseTestKey reads "PREFIX [from PREFIX] [tos N] [metric N]".
func parseTestKey(t *testing.T, s string) RouteKey {
	t.Helper()
	f := strings.Fields(s)
	k := RouteKey{Dst: netip.MustParsePrefix(f[0]).Masked()}
	k.Family = FamilyOf(k.Dst.Addr())
	for i := 1; i+1 < len(f); i += 2 {
		if f[i] == "from" {
			k.Src = netip.MustParsePrefix(f[i+1]).Masked()
			continue
		}
		n, err := strconv.ParseUint(f[i+1], 10, 32)
		if err != nil {
			t.Fatal(err)
		}
		switch f[i] {
		case "tos":
			k.TOS = uint8(n)
		case "metric":
			k.Metric = uint32(n)
		default:
			t.Fatalf("unknown word %q in %q", f[i], s)
		}
	}
	return k
}

// BenchmarkStoreChange is the cost of an event on a full table: a lookup
// and a change of a random route among 1,000,000 (present or new), as
// applying a route event does, against a Go map holding the same.
func BenchmarkStoreChange(b *testing.B) {
	const n = 1_000_000
	key := func(i int) key4 {
		return key4{dst: [4]byte{byte(11 + i>>16), byte(i >> 8), byte(i), 0}, bits: 24}
	}
	b.Run("store", func(b *testing.B) {
		var s store[key4, val4]
		for i := range n {
			s.add(key(i), val4{oif: 2})
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := key((i * 7919) % (n + n/10)) // a tenth are new keys
			if v, ok := s.get(k); ok && v.mtu == 0 {
				s.del(k)
			} else {
				s.set(k, val4{oif: 2})
			}
			i++
		}
	})
	b.Run("map", func(b *testing.B) {
		m := make(map[key4]val4)
		for i := range n {
			m[key(i)] = val4{oif: 2}
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := key((i * 7919) % (n + n/10))
			if v, ok := m[k]; ok && v.mtu == 0 {
				delete(m, k)
			} else {
				m[k] = val4{oif: 2}
			}
			i++
		}
	})
}
