package main

import (
	"bytes"
	"flag"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch/program"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// TestHelpFromProgram: the agent's help shows --table, --priority and
// --protocol as every program built on program.Program does (OwnerFlags'
// text, PrintFlags' style), so the two cannot drift apart again (issue 37.3).
func TestHelpFromProgram(t *testing.T) {
	var agent bytes.Buffer
	if code := run([]string{"help"}, &agent, &agent); code != exitOK {
		t.Fatalf("marksplit help: exit %d", code)
	}
	fs := flag.NewFlagSet("p", flag.ContinueOnError)
	table, prio, proto := reconcile.OwnTable(900), reconcile.OwnPriority(900), reconcile.OwnProtocol(109)
	program.OwnerFlags(fs, "the agent", &table, &prio, &proto)
	var want bytes.Buffer
	program.PrintFlags(&want, fs)
	lines := strings.SplitAfter(want.String(), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		if block := lines[i] + lines[i+1]; !strings.Contains(agent.String(), block) {
			t.Errorf("marksplit help lacks Program's\n%s", block)
		}
	}
	if len(lines) < 6 {
		t.Fatalf("OwnerFlags printed %q", want.String())
	}
}
