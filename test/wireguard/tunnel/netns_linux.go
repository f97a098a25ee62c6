package tunnel

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// In runs f on an OS thread in the network namespace named ns and returns
// its error. Sockets f opens stay in that namespace after it returns and
// may be used from any goroutine. The thread is never switched back: it
// exits with f's goroutine, so nothing else ever runs in the namespace.
func In(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("tunnel: netns %s: %w", ns, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("tunnel: setns %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}
