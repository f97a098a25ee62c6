// Package peakrss measures a program's peak resident memory as its own
// address space counts it (VmHWM), for the benchmarks of big passes.
//
// wait4's ru_maxrss is not that figure for a child of a large process: Go
// starts a child with vfork, which shares the parent's address space until
// the exec, and the exec keeps that address space's high-water mark in the
// child's ru_maxrss. A `marksplit once` started by the agent's test binary,
// which serves 15,000 CiliumNodes, reported 69 MiB in ru_maxrss while its
// own address space peaked at 45 MiB.
package peakrss

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// Every is how often Run reads the program's high-water mark. It only
// grows while the program runs, so the last read misses at most what the
// program's last Every added, as it exits.
const Every = 2 * time.Millisecond

// Run starts cmd, which is prog or execs it (through nsenter, say), waits
// for it, and returns prog's peak resident memory in KiB: VmHWM of the
// process once it runs prog, read every Every until it exits. err is
// cmd.Wait's; a program that never ran as prog long enough to be read
// gives 0 and an error.
func Run(cmd *exec.Cmd, prog string) (kib int64, err error) {
	if prog, err = exec.LookPath(prog); err != nil {
		return 0, err
	}
	want, err := filepath.EvalSymlinks(prog)
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pid := cmd.Process.Pid
	tick := time.NewTicker(Every)
	defer tick.Stop()
	for {
		if hwm, ok := read(pid, want); ok {
			kib = max(kib, hwm)
		}
		select {
		case err := <-done:
			if kib == 0 && err == nil {
				err = fmt.Errorf("peakrss: %s exited before its memory could be read", prog)
			}
			return kib, err
		case <-tick.C:
		}
	}
}

// read returns pid's VmHWM in KiB if pid runs exe now.
func read(pid int, exe string) (int64, bool) {
	if got, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || got != exe {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmHWM:")); ok {
			n, err := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
