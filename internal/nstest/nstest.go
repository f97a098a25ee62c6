//go:build linux

// Package nstest makes fresh network namespaces for tests: the core of
// netwatchtest.NetNS, here so that the fake kernel's own tests (which
// compare it with the real one) can use it without importing the kit that
// wraps the fake kernel, and the bench command, which has no testing.TB,
// without a copy of its own.
package nstest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// Unavailable says why real-kernel tests cannot run here (not root,
// network namespaces not permitted, ip(8) or nsenter(1) missing), or "".
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "not running as root"
	}
	for _, bin := range []string{"ip", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " not found in PATH"
		}
	}
	// Try an unshare on a thread that is thrown away afterwards.
	errc := make(chan error, 1)
	goLocked(func() { errc <- unix.Unshare(unix.CLONE_NEWNET) })
	if err := <-errc; err != nil {
		return "unshare(CLONE_NEWNET) not permitted: " + err.Error()
	}
	return ""
}

// NS is a fresh anonymous network namespace, held by a goroutine locked to
// an OS thread that lives in it, until Close.
type NS struct {
	fd   int
	path string
	work chan func()
	done chan struct{}
}

// New creates a network namespace.
func New() (*NS, error) {
	ns := &NS{work: make(chan func()), done: make(chan struct{})}
	errc := make(chan error, 1)
	goLocked(func() {
		defer close(ns.done)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		tid := unix.Gettid()
		fd, err := unix.Open("/proc/self/task/"+strconv.Itoa(tid)+"/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open network namespace handle: %w", err)
			return
		}
		ns.fd = fd
		ns.path = "/proc/" + strconv.Itoa(os.Getpid()) + "/task/" + strconv.Itoa(tid) + "/ns/net"
		errc <- nil
		for fn := range ns.work {
			fn()
		}
	})
	if err := <-errc; err != nil {
		<-ns.done
		return nil, err
	}
	return ns, nil
}

// goLocked runs fn on a new goroutine locked to an OS thread that is not the
// process's main thread. The thread is never unlocked, so it ends with fn:
// whatever fn did to it (unshare) goes with it. The main thread is avoided
// because the runtime never ends it; it would stay in the namespace.
func goLocked(fn func()) { go runLocked(fn, nil) }

func runLocked(fn func(), locked chan<- struct{}) {
	runtime.LockOSThread()
	if locked != nil {
		close(locked)
	}
	if unix.Gettid() == unix.Getpid() {
		// Hold the main thread until another goroutine has a thread of
		// its own, then give the main thread back.
		next := make(chan struct{})
		go runLocked(fn, next)
		<-next
		runtime.UnlockOSThread()
		return
	}
	fn()
}

// Close ends the thread that holds the namespace and closes its handle.
func (ns *NS) Close() {
	close(ns.work)
	<-ns.done
	unix.Close(ns.fd)
}

// FD is the namespace's file descriptor.
func (ns *NS) FD() int { return ns.fd }

// Path names the namespace in /proc, for nsenter --net=PATH.
func (ns *NS) Path() string { return ns.path }

// Do runs fn on the thread that lives in the namespace and returns its
// error.
func (ns *NS) Do(fn func() error) error {
	var err error
	ran := make(chan struct{})
	ns.work <- func() {
		defer close(ran)
		err = fn()
	}
	<-ran
	return err
}

// IP runs ip(8) with args inside the namespace and returns its standard
// output.
func (ns *NS) IP(args ...string) (string, error) {
	cmd := exec.Command("nsenter", append([]string{"--net=" + ns.path, "ip"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("ip %q: %w: %s", args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), nil
}
