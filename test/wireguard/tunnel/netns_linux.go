package tunnel

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// In runs f on an OS thread switched into the network namespace named ns,
// and returns its error. Sockets f opens stay in that namespace after it
// returns and may be used from any goroutine.
//
// The thread is switched back before it runs anything else. It must not
// exit: a child process started with Pdeathsig from that thread at any
// time before (os/exec forks on whichever thread it runs on) would be
// killed with it. Only when switching back fails is the thread left locked,
// to end with f's goroutine rather than run others in the wrong namespace.
func In(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("tunnel: own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("tunnel: netns %s: %w", ns, err)
			return
		}
		err = unix.Setns(target, unix.CLONE_NEWNET)
		unix.Close(target)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("tunnel: setns %s: %w", ns, err)
			return
		}
		ferr := f()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("tunnel: setns back from %s: %w", ns, err)
			return // still locked: the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
