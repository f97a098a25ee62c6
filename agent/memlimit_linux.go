//go:build linux

package main

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// memoryLimitShare is the part of the memory cgroup's limit the agent gives
// the Go runtime as its soft limit: the rest is what is not the Go heap but
// the cgroup counts (the route cache's chunks, which it maps outside the
// heap; the netlink sockets' receive buffers; the binary) and a margin.
// Measured by TestKernelMemoryCgroup at 128 MiB: a first install over
// 100,000 routes peaks at 120 MiB in the cgroup with 3/4, 115 MiB with 5/8.
// Go does not read the cgroup's limit itself: without a soft limit it lets
// the heap grow to twice what is live before it collects, and a pass over a
// full table (the policy's desired routes, 352 bytes each) can reach the
// limit with garbage that one collection would free, and be OOM-killed.
const memoryLimitShare = 0.625

// gcPercent is the agent's GOGC unless the environment gives one: a
// collection when the heap has grown by half of what was live after the
// last, not by all of it. A big pass's heap is mostly short-lived (each
// chunk of a thousand changes is planned, described, applied and dropped),
// so the default 100 lets that garbage double the peak: the first
// --underlay-link pass over 100,000 routes peaked at 64–73 MiB
// (the kernel's high-water mark of resident memory) at 100 and 50–58 MiB
// at 50 with other work on both cores, for about 6%
// more CPU (`make bench-compare`, "Big passes", which runs them beside CPU
// hogs).
const gcPercent = 50

// setMemoryLimit sets the Go runtime's GC percent to gcPercent, unless GOGC
// is set, and its soft memory limit to
// memoryLimitShare of the memory cgroup's limit, unless GOMEMLIMIT is set
// (the operator's word stands) or no limit is found. It returns the limit
// set, 0 for none.
func setMemoryLimit() int64 {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0
	}
	limit := cgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup")
	if limit <= 0 {
		return 0
	}
	soft := int64(float64(limit) * memoryLimitShare)
	debug.SetMemoryLimit(soft)
	return soft
}

// cgroupMemoryLimit returns the memory limit of the cgroup the process is
// in, in bytes, read from cgroup v2's memory.max or cgroup v1's
// memory.limit_in_bytes under root; 0 when there is none ("max", or v1's
// huge "unlimited" value) or it cannot be read. procCgroup is
// /proc/self/cgroup, which names the process's cgroup in each hierarchy.
func cgroupMemoryLimit(procCgroup, root string) int64 {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var dir, name string
		switch {
		case parts[0] == "0" && parts[1] == "":
			dir, name = root, "memory.max" // v2
		case hasController(parts[1], "memory"):
			dir, name = filepath.Join(root, "memory"), "memory.limit_in_bytes" // v1
		default:
			continue
		}
		if n := readLimit(filepath.Join(dir, parts[2], name)); n > 0 {
			return n
		}
		// A container whose cgroup namespace is not its own sees the
		// host's path, while only its own cgroup is mounted, at the root.
		if n := readLimit(filepath.Join(dir, name)); n > 0 {
			return n
		}
	}
	return 0
}

func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// readLimit reads a limit file: a number of bytes, or "max". v1's
// unlimited is a page-rounded 2⁶³−1: anything above 2⁶² is none.
func readLimit(file string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > 1<<62 {
		return 0
	}
	return n
}
