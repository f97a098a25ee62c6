package program

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit codes of Run.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// SignalContext returns a context that the first SIGINT or SIGTERM ends,
// as Main's is: a second one ends the process at once, with status 1 and
// one line on stderr that begins with name. stop releases the signals. A
// program that parses its own command line (the agent) runs under it.
func SignalContext(name string) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go signals(name, sigs, done, cancel, os.Stderr, os.Exit)
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel()
	}
}

// signals cancels on the first signal from sigs, and on the second says
// so on stderr and calls exit(1); it returns when done is closed.
func signals(name string, sigs <-chan os.Signal, done <-chan struct{}, cancel context.CancelFunc, stderr io.Writer, exit func(int)) {
	select {
	case <-sigs:
		cancel()
	case <-done:
		return
	}
	select {
	case s := <-sigs:
		fmt.Fprintf(stderr, "%s: %v again: exiting at once\n", name, s)
		exit(exitFailure)
	case <-done:
	}
}
