package netwatch

import (
	"reflect"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

// awaitMapped collects garbage until the bytes mapped by stores are want,
// and fails the test if they are not within two minutes (only a leak: a
// dropped store's cleanup runs on a goroutine of the runtime's after a
// collection, and has no event to wait on).
func awaitMapped(t testing.TB, want int64, what string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for mappedBytes.Load() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes still mapped %s", mappedBytes.Load()-want, what)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

// TestStoreChunksMapped checks that a store's full chunks are mapped
// outside the Go heap, that compaction returns the chunks it replaces,
// and that dropping the store returns the rest.
func TestStoreChunksMapped(t *testing.T) {
	// Every store earlier tests made is unreachable once they end: wait
	// for their cleanups, so that the count is this test's store alone.
	const base = 0
	awaitMapped(t, base, "before the test, by stores earlier tests dropped")
	chunk := int64(chunkLen * unsafe.Sizeof(entry[key4, val4]{}))
	s := &store[key4, val4]{}
	const n = 3*chunkLen + 5
	for i := range n {
		s.push(key4{dst: [4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}, bits: 32}, val4{oif: uint32(i)})
	}
	if got := s.mapped(); got != 3*chunk {
		t.Fatalf("store maps %d bytes for %d entries, want %d (3 chunks after the first)", got, n, 3*chunk)
	}
	if got := mappedBytes.Load() - base; got != 3*chunk {
		t.Fatalf("%d bytes mapped, want %d", got, 3*chunk)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)

	// Delete all but every 16th entry: the store compacts into one chunk
	// and unmaps the three it had.
	for i := range n {
		if i%16 != 0 {
			s.del(key4{dst: [4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}, bits: 32})
		}
	}
	if s.len() != (n+15)/16 || len(s.chunks) != 1 {
		t.Fatalf("after deletes: %d entries in %d chunks; want %d in 1", s.len(), len(s.chunks), (n+15)/16)
	}
	for i := 0; i < n; i += 16 {
		if v, ok := s.get(key4{dst: [4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}, bits: 32}); !ok || v.oif != uint32(i) {
			t.Fatalf("entry %d lost in compaction: %v %v", i, v, ok)
		}
	}
	if got := mappedBytes.Load() - base; got != s.mapped() || got > chunk {
		t.Fatalf("after compaction %d bytes mapped, store holds %d, want at most one chunk (%d)", got, s.mapped(), chunk)
	}

	// Refill, then drop the store: its cleanup unmaps what it holds.
	for i := n; i < 3*n; i++ {
		s.push(key4{dst: [4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}, bits: 32}, val4{})
	}
	if mappedBytes.Load() == base {
		t.Fatal("a refilled store maps nothing")
	}
	s = nil
	awaitMapped(t, base, "after the store was dropped")
}

// TestStoreEntriesHoldNoPointers guards the premise of mapping chunks
// outside the Go heap: the collector does not see into them, so an entry
// must not hold a pointer (nor a slice, string or map) to anything.
func TestStoreEntriesHoldNoPointers(t *testing.T) {
	var holds func(reflect.Type) bool
	holds = func(ty reflect.Type) bool {
		switch ty.Kind() {
		case reflect.Struct:
			for i := range ty.NumField() {
				if holds(ty.Field(i).Type) {
					return true
				}
			}
			return false
		case reflect.Array:
			return holds(ty.Elem())
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
			reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
			return false
		}
		return true
	}
	for _, ty := range []reflect.Type{reflect.TypeFor[entry[key4, val4]](), reflect.TypeFor[entry[key6, val6]]()} {
		if holds(ty) {
			t.Errorf("%v holds a pointer", ty)
		}
	}
}
