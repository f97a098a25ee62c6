package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"sync"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// errParsed ends parseArgs's Program after the checks.
var errParsed = errors.New("parsed")

// parseArgs parses args as the agent's Program does and returns the
// options its build checked, without running anything: a bad command
// line is a *usageError with the Program's one line, -h is flag.ErrHelp
// after the help went to help.
func parseArgs(args []string, getenv func(string) string, help io.Writer) (options, error) {
	var o options
	a := newAgent(&o, getenv, io.Discard)
	if help == nil {
		help = io.Discard
	}
	var stderr bytes.Buffer
	code := a.p.Run(context.Background(), args, help, &stderr, func() (func(netwatch.View) (reconcile.Desired, bool), error) {
		if err := a.check(); err != nil {
			return nil, err
		}
		return nil, errParsed
	})
	line := strings.TrimSuffix(strings.TrimPrefix(stderr.String(), "marksplit: "), "\n")
	switch {
	case code == exitOK:
		return o, flag.ErrHelp
	case line == errParsed.Error():
		return o, nil
	}
	return o, usageErrorf("%s", line)
}

// group runs goroutines and waits for them, as a program.Session does.
type group struct{ wg sync.WaitGroup }

func (g *group) Go(fn func()) { g.wg.Go(fn) }
