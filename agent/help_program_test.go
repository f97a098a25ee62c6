//go:build linux

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/program"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// TestHelpFromProgram: the agent's help is program.Program's, as every
// example's is: the same usage line, subcommands and standard flags, so
// the two cannot drift apart again (issue 37.3).
func TestHelpFromProgram(t *testing.T) {
	var agent bytes.Buffer
	if code := run([]string{"help"}, &agent, &agent); code != exitOK {
		t.Fatalf("marksplit help: exit %d", code)
	}
	var want bytes.Buffer
	p := &program.Program{Name: "marksplit", Table: 900, Priority: 900, Protocol: 109}
	if code := p.Run(context.Background(), []string{"--help"}, &want, &want, func() (func(netwatch.View) (reconcile.Desired, bool), error) { return nil, nil }); code != 0 {
		t.Fatalf("Program --help: exit %d", code)
	}
	if !strings.HasPrefix(agent.String(), "usage: marksplit [run|once|plan|cleanup|verify|health] ") {
		t.Errorf("marksplit help begins otherwise than Program's:\n%s", agent.String())
	}
	lines := strings.SplitAfter(want.String(), "\n")
	for i, l := range lines {
		switch {
		case strings.HasPrefix(l, "  run ") || strings.HasPrefix(l, "  once ") || strings.HasPrefix(l, "  plan ") || strings.HasPrefix(l, "  cleanup "):
			if !strings.Contains(agent.String(), l) {
				t.Errorf("marksplit help lacks Program's subcommand line %q", l)
			}
		case strings.HasPrefix(l, "  --") && i+1 < len(lines):
			if block := l + lines[i+1]; !strings.Contains(agent.String(), block) {
				t.Errorf("marksplit help lacks Program's\n%s", block)
			}
		}
	}
}
