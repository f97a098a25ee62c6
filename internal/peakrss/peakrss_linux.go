// Package peakrss measures a program's peak resident memory as its own
// address space counts it (VmHWM), for the benchmarks of big passes.
//
// wait4's ru_maxrss is not that figure for a child of a large process: Go
// starts a child with vfork, which shares the parent's address space until
// the exec, and the exec keeps that address space's high-water mark in the
// child's ru_maxrss. A `marksplit once` started by the agent's test binary,
// which serves 15,000 CiliumNodes, reported 69 MiB in ru_maxrss while its
// own address space peaked at 45 MiB.
//
// Nor is a sample of VmHWM taken every few milliseconds: a program that
// peaks as it ends (`marksplit once` does, in its last chunk) exits before
// a sampler that a busy machine schedules late reads it again, and the
// figure comes out low (dd with a 40 MiB buffer measured 31 MiB beside two
// CPU hogs). Run reads VmHWM once, exactly, as the program exits.
package peakrss

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Run starts cmd, which is prog or execs it (through nsenter, say), waits
// for it, and returns prog's peak resident memory in KiB: the VmHWM of its
// process as it exits, after its last allocation. cmd runs traced
// (ptrace), so that it stops as it exits: only its first thread is, and
// only to be let go again, with every signal it receives; it must not be
// traced otherwise. err is cmd.Wait's; a program that never exited as
// prog gives 0 and an error.
func Run(cmd *exec.Cmd, prog string) (kib int64, err error) {
	if prog, err = exec.LookPath(prog); err != nil {
		return 0, err
	}
	want, err := filepath.EvalSymlinks(prog)
	if err != nil {
		return 0, err
	}
	// A tracee is traced by the thread that started it: every ptrace
	// request must come from that thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	kib, terr := follow(cmd.Process.Pid, want)
	if terr != nil {
		cmd.Process.Kill()
	}
	err = cmd.Wait()
	switch {
	case terr != nil:
		return 0, terr
	case kib == 0 && err == nil:
		err = fmt.Errorf("peakrss: %s never exited as %s", cmd.Path, prog)
	}
	return kib, err
}

// Codes of a SIGCHLD's si_code (asm-generic/siginfo.h), which x/sys/unix
// lacks.
const (
	cldExited  = 1
	cldKilled  = 2
	cldDumped  = 3
	cldTrapped = 4
	cldStopped = 5
)

// follow lets the traced pid run until it has exited, without reaping it:
// at the stop of its first exec it asks for a stop at exit (and that pid
// die with this process), at that stop it reads VmHWM if pid runs exe, and
// at any other stop it lets pid go on with the signal that stopped it.
func follow(pid int, exe string) (kib int64, err error) {
	first := true
	for {
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WSTOPPED|unix.WNOWAIT, nil); err != nil {
			if err == unix.EINTR {
				continue
			}
			return 0, fmt.Errorf("peakrss: waitid: %w", err)
		}
		status := childStatus(&info)
		switch info.Code {
		case cldExited, cldKilled, cldDumped:
			return kib, nil // cmd.Wait reaps it
		case cldTrapped, cldStopped:
		default:
			continue
		}
		sig := status & 0xff
		deliver := 0
		switch {
		case first:
			first = false
			if err := unix.PtraceSetOptions(pid, unix.PTRACE_O_TRACEEXIT|unix.PTRACE_O_TRACEEXEC|unix.PTRACE_O_EXITKILL); err != nil {
				return 0, fmt.Errorf("peakrss: ptrace: %w", err)
			}
		case sig == int(unix.SIGTRAP) && status>>8 == unix.PTRACE_EVENT_EXIT:
			if hwm, ok := read(pid, exe); ok {
				kib = max(kib, hwm)
			}
		case sig == int(unix.SIGTRAP) && status>>8 == unix.PTRACE_EVENT_EXEC:
		default:
			deliver = sig
		}
		if err := unix.PtraceCont(pid, deliver); err != nil && err != unix.ESRCH {
			return 0, fmt.Errorf("peakrss: ptrace: %w", err)
		}
	}
}

// childStatus is a SIGCHLD siginfo's si_status: after si_signo, si_errno
// and si_code, the union (aligned to a pointer) begins with si_pid and
// si_uid.
func childStatus(info *unix.Siginfo) int {
	const ptr = int(unsafe.Sizeof(uintptr(0)))
	off := (12+ptr-1)&^(ptr-1) + 8
	b := unsafe.Slice((*byte)(unsafe.Pointer(info)), unsafe.Sizeof(*info))
	return int(int32(binary.NativeEndian.Uint32(b[off:])))
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
