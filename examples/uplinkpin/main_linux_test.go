//go:build linux

package main

import (
	"context"
	"strings"
	"testing"
)

// TestRunExitCodes checks what run returns before it touches a kernel:
// 2 and one line naming the flag for a bad command line, 0 and the usage
// for -h, 1 when the namespace cannot be opened.
func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--mark", "0x100/0xff00"}, 2, "uplinkpin: --uplink is required"},
		{[]string{"--uplink", "eth1"}, 2, "uplinkpin: --mark is required"},
		{[]string{"--uplink", "eth1", "--mark", "0x100/0xff00", "--table", "main"}, 2, `uplinkpin: --table "main": not a table number`},
		{[]string{"--nope"}, 2, "uplinkpin: flag provided but not defined: -nope"},
		{[]string{"-h"}, 0, "usage: uplinkpin --uplink LINK --mark"},
		{[]string{"--uplink", "eth1", "--mark", "0x100/0xff00", "--netns", "/nonexistent/ns"}, 1, "uplinkpin: netwatch: open network namespace /nonexistent/ns"},
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
