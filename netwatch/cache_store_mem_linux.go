package netwatch

import (
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// mappedBytes is the memory that stores hold outside the Go heap, which
// the benchmarks count beside the heap.
var mappedBytes atomic.Int64

// mapChunk returns size bytes of zeroed memory mapped outside the Go heap,
// or nil if the kernel refuses (the store then takes heap memory).
func mapChunk(size int) []byte {
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	mappedBytes.Add(int64(size))
	return b
}

// unmapChunk returns memory from mapChunk to the kernel.
func unmapChunk(b []byte) {
	if err := unix.Munmap(b); err != nil {
		// Only a bad address fails, and the addresses are ours.
		panic("netwatch: munmap of a store chunk: " + err.Error())
	}
	mappedBytes.Add(-int64(len(b)))
}
