//go:build linux

package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// run is the whole program, as main runs it, for the tests.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	var c Config
	p, build := command(&c)
	return p.Run(ctx, args, stderr, stderr, build)
}

// start runs the whole program, as main runs it, in ns (a fake kernel's or
// a real namespace's) until the test ends, and returns its log.
func start(t *testing.T, ns *netwatch.NetNS, args ...string) *netwatchtest.SyncBuffer {
	t.Helper()
	return netwatchtest.StartProgram(t, "vpnbypass", func(ctx context.Context, logs io.Writer) int {
		var c Config
		p, build := command(&c)
		p.NetNS = ns
		return p.Run(ctx, args, logs, logs, build)
	})
}

// TestRunExitCodes checks what run returns before it touches a kernel:
// 2 and one line naming the flag for a bad command line, 0 and the usage
// for -h, 1 when the namespace cannot be opened.
func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--link", "vpn0"}, 2, "vpnbypass: --prefix is required"},
		{[]string{"--prefix", "10.8.0.1/16"}, 2, `vpnbypass: invalid value "10.8.0.1/16" for flag --prefix: host bits set`},
		{[]string{"--prefix", "10.8.0.0/16", "--table", "main"}, 2, `vpnbypass: invalid value "main" for flag --table: not a table number`},
		{[]string{"--prefix", "10.8.0.0/16", "--resync", "-1s"}, 2, "vpnbypass: --resync -1s: must not be negative"},
		{[]string{"--prefix", "10.8.0.0/16", "extra"}, 2, `vpnbypass: unexpected argument "extra"`},
		{[]string{"--nope"}, 2, "vpnbypass: flag provided but not defined: --nope"},
		{[]string{"-h"}, 0, "usage: vpnbypass [run|once|plan|cleanup] --prefix CIDR [--prefix CIDR...] [flags]\n"},
		{[]string{"--prefix", "10.8.0.0/16", "--netns", "/nonexistent/ns"}, 1, "vpnbypass: netwatch: open network namespace /nonexistent/ns"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out strings.Builder
			code := run(context.Background(), tt.args, &out)
			if code != tt.code || !strings.HasPrefix(out.String(), tt.want) {
				t.Errorf("run: exit %d with %q; want exit %d with a line starting %q", code, out.String(), tt.code, tt.want)
			}
			if code == 2 && strings.Count(out.String(), "\n") != 1 {
				t.Errorf("run: %q is not one line", out.String())
			}
		})
	}
}
