package netwatch

import (
	"runtime"
	"slices"
	"unsafe"
)

// A store is the map under one routing table: compact keys to compact
// values, built for the way a cache fills. A dump lists a table's routes
// in the kernel's order, which the keys' compare reproduces, so a dump
// only appends to a sorted array: no hashing and no random writes into a
// large table, which is what made a map-based cache take 1.5–4× as long as
// the dump itself. Lookups are binary searches. Changes after a dump
// update the array in place, mark deleted entries dead, and keep new keys
// that do not sort last in a small map that is merged into the array when
// it grows.
type store[K compactKey[K], V any] struct {
	_      noCopy
	chunks [][]entry[K, V] // sorted by key; every chunk but the last is full
	mem    *chunkMem       // the memory of chunks mapped outside the heap
	n      int             // entries in chunks, dead ones included
	dead   []uint64        // bit i set: entry i was deleted
	ndead  int
	added  map[K]V // keys not in chunks
}

// Every chunk but a store's first is mapped outside the Go heap
// (cache_store_mem_linux.go). Entries hold no pointers, so the garbage
// collector never scanned them, but it paced itself by them: a million
// routes grow the heap from 4 to 44 MB during a dump, a collection at each
// doubling, and those collections cost an initial sync 0.1× the kernel's
// own dump time. A store's mapped chunks are returned to the kernel when
// compaction replaces them and, for the others, once the table holding the
// store is unreachable (runtime.AddCleanup): nothing but the store refers
// to them, and it is reached only through its table.
type chunkMem struct {
	regions [][]byte // regions[i] backs chunks[i]; nil for a heap chunk
	spare   []byte   // the region of the chunk dropped last, for the next
}

// noCopy has go vet report a copy of a store (or of a table): the copy
// would share mapped chunks that the original's cleanup unmaps.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// mapped returns the bytes the store holds outside the Go heap.
func (s *store[K, V]) mapped() int64 {
	if s.mem == nil {
		return 0
	}
	n := len(s.mem.spare)
	for _, r := range s.mem.regions {
		n += len(r)
	}
	return int64(n)
}

func (m *chunkMem) free() { unmapRegions(append(m.regions, m.spare)) }

// unmapRegions returns mapped regions to the kernel, skipping nil ones
// (heap chunks).
func unmapRegions(rs [][]byte) {
	for _, r := range rs {
		if r != nil {
			unmapChunk(r)
		}
	}
}

// compactKey is a pointer-free route key ordered as the kernel dumps.
type compactKey[K any] interface {
	comparable
	compare(K) int
}

type entry[K, V any] struct {
	k K
	v V
}

// Entries are kept in chunks of chunkLen so that appending never copies a
// large array (a million routes are ~40 MB) and a lookup finds entry i
// without another indirection than its chunk.
const (
	chunkBits = 12
	chunkLen  = 1 << chunkBits
	// compactMin is the fewest changes (new keys out of order plus dead
	// entries) worth merging; a merge also waits for a quarter of the
	// array's size in changes, so its cost per change stays constant.
	compactMin = 1024
)

func (s *store[K, V]) at(i int) *entry[K, V] { return &s.chunks[i>>chunkBits][i&(chunkLen-1)] }

func (s *store[K, V]) len() int { return s.n - s.ndead + len(s.added) }

// search returns the position of k in the array, or where it would be.
func (s *store[K, V]) search(k K) (int, bool) {
	i, j := 0, s.n
	for i < j {
		h := int(uint(i+j) >> 1)
		if s.at(h).k.compare(k) < 0 {
			i = h + 1
		} else {
			j = h
		}
	}
	return i, i < s.n && s.at(i).k == k
}

// last reports whether k sorts after every key in the array.
func (s *store[K, V]) last(k K) bool { return s.n == 0 || s.at(s.n-1).k.compare(k) < 0 }

func (s *store[K, V]) isDead(i int) bool { return bitSet(s.dead, i) }

// bitSet reports whether bit i of bits is set; bits past the end are not.
func bitSet(bits []uint64, i int) bool {
	return i>>6 < len(bits) && bits[i>>6]&(1<<(i&63)) != 0
}

func (s *store[K, V]) get(k K) (V, bool) {
	if len(s.added) > 0 {
		if v, ok := s.added[k]; ok {
			return v, true
		}
	}
	if i, ok := s.search(k); ok && !s.isDead(i) {
		return s.at(i).v, true
	}
	var zero V
	return zero, false
}

// set stores v under k.
func (s *store[K, V]) set(k K, v V) {
	if _, ok := s.added[k]; ok {
		s.added[k] = v
		return
	}
	i, found := s.n, false
	if !s.last(k) {
		i, found = s.search(k)
	}
	switch {
	case found:
		s.at(i).v = v
		if s.isDead(i) {
			s.dead[i>>6] &^= 1 << (i & 63)
			s.ndead--
		}
	case i == s.n:
		s.push(k, v)
	default:
		if s.added == nil {
			s.added = make(map[K]V)
		}
		s.added[k] = v
		s.maybeCompact()
	}
}

// add stores v under k if k is not taken, and reports whether it did. It
// is the path of a dump, where keys come in order: an append.
func (s *store[K, V]) add(k K, v V) bool {
	if len(s.added) == 0 && s.last(k) {
		s.push(k, v)
		return true
	}
	if _, ok := s.get(k); ok {
		return false
	}
	s.set(k, v)
	return true
}

func (s *store[K, V]) del(k K) {
	if _, ok := s.added[k]; ok {
		delete(s.added, k)
		return
	}
	i, ok := s.search(k)
	if !ok || s.isDead(i) {
		return
	}
	if i == s.n-1 {
		// The last entry: drop it rather than mark it.
		s.n--
		if s.n&(chunkLen-1) == 0 {
			s.dropLastChunk()
		} else {
			c := &s.chunks[len(s.chunks)-1]
			*c = (*c)[:len(*c)-1]
		}
		return
	}
	if need := i>>6 + 1; need > len(s.dead) {
		s.dead = slices.Grow(s.dead, need-len(s.dead))[:need]
	}
	s.dead[i>>6] |= 1 << (i & 63)
	s.ndead++
	s.maybeCompact()
}

// push appends an entry whose key sorts after every other.
func (s *store[K, V]) push(k K, v V) {
	if s.n&(chunkLen-1) == 0 {
		s.chunks = append(s.chunks, s.newChunk())
	}
	c := &s.chunks[len(s.chunks)-1]
	*c = append(*c, entry[K, V]{k, v})
	s.n++
}

// newChunk returns an empty chunk to follow the last: on the heap and
// growing from small while it is the first (most tables hold a few
// routes), of full size and mapped outside the heap after a full one.
func (s *store[K, V]) newChunk() []entry[K, V] {
	if s.n == 0 {
		if s.mem != nil {
			s.mem.regions = append(s.mem.regions, nil)
		}
		return nil
	}
	if s.mem == nil {
		s.mem = &chunkMem{regions: make([][]byte, len(s.chunks))}
		runtime.AddCleanup(s, (*chunkMem).free, s.mem)
	}
	b := s.mem.spare
	s.mem.spare = nil
	if b == nil {
		b = mapChunk(chunkLen * int(unsafe.Sizeof(entry[K, V]{})))
	}
	s.mem.regions = append(s.mem.regions, b)
	if b == nil {
		return make([]entry[K, V], 0, chunkLen)
	}
	return unsafe.Slice((*entry[K, V])(unsafe.Pointer(unsafe.SliceData(b))), chunkLen)[:0]
}

// dropLastChunk removes the last chunk, which is empty, keeping its
// memory for the next.
func (s *store[K, V]) dropLastChunk() {
	i := len(s.chunks) - 1
	s.chunks[i] = nil
	s.chunks = s.chunks[:i]
	if s.mem == nil {
		return
	}
	if r := s.mem.regions[i]; r != nil {
		if s.mem.spare != nil {
			unmapChunk(s.mem.spare)
		}
		s.mem.spare = r
	}
	s.mem.regions[i] = nil
	s.mem.regions = s.mem.regions[:i]
}

// from yields the entries of the array from the first key not below k, in
// order, until yield returns false; then every key of the side map that
// keep accepts, in no order. Both parts stop when yield does.
func (s *store[K, V]) from(k K, keep func(K) bool, yield func(K, V) bool) bool {
	s.sorted(k, yield)
	for k, v := range s.added {
		if keep(k) && !yield(k, v) {
			return false
		}
	}
	return true
}

// sorted yields the entries of the array from the first key not below k,
// in order, until yield returns false: from without the side map.
func (s *store[K, V]) sorted(k K, yield func(K, V) bool) {
	i, _ := s.search(k)
	for ; i < s.n; i++ {
		if s.ndead > 0 && s.isDead(i) {
			continue
		}
		if e := s.at(i); !yield(e.k, e.v) {
			return
		}
	}
}

// all yields every entry, those of the array in order, then the others.
func (s *store[K, V]) all(yield func(K, V) bool) bool {
	for ci, c := range s.chunks {
		for j := range c {
			if i := ci<<chunkBits | j; s.ndead > 0 && s.isDead(i) {
				continue
			}
			if !yield(c[j].k, c[j].v) {
				return false
			}
		}
	}
	for k, v := range s.added {
		if !yield(k, v) {
			return false
		}
	}
	return true
}

func (s *store[K, V]) maybeCompact() {
	if d := len(s.added) + s.ndead; d >= compactMin && 4*d >= s.n {
		s.compact()
	}
}

// compact merges the added keys into the array and drops dead entries.
func (s *store[K, V]) compact() {
	added := make([]entry[K, V], 0, len(s.added))
	for k, v := range s.added {
		added = append(added, entry[K, V]{k, v})
	}
	slices.SortFunc(added, func(a, b entry[K, V]) int { return a.k.compare(b.k) })
	chunks, dead := s.chunks, s.dead
	var regions [][]byte // the old chunks' memory, unmapped at the end
	if s.mem != nil {
		regions, s.mem.regions = s.mem.regions, nil
	}
	s.chunks, s.n, s.dead, s.ndead, s.added = nil, 0, nil, 0, nil
	for ci, c := range chunks {
		for j, e := range c {
			if bitSet(dead, ci<<chunkBits|j) {
				continue
			}
			for len(added) > 0 && added[0].k.compare(e.k) < 0 {
				s.push(added[0].k, added[0].v)
				added = added[1:]
			}
			s.push(e.k, e.v)
		}
	}
	for _, e := range added {
		s.push(e.k, e.v)
	}
	unmapRegions(regions)
}
