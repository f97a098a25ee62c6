//go:build linux

package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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
	return netwatchtest.StartProgram(t, "uplinkpin", func(ctx context.Context, logs io.Writer) int {
		var c Config
		p, build := command(&c)
		p.NetNS = ns
		return p.Run(ctx, args, logs, logs, build)
	})
}

// TestFlags checks what the command line sets, and that each bad one is
// refused in one line that names the flag.
func TestFlags(t *testing.T) {
	type parsed struct {
		cfg    Config
		netns  string
		resync time.Duration
	}
	tests := []struct {
		args    string
		want    parsed
		wantErr string
	}{{
		args: "--uplink eth1 --mark 0x100/0xff00",
		want: parsed{resync: 5 * time.Minute, cfg: Config{
			Uplink: "eth1", Mark: 0x100, Mask: 0xff00, Table: 920, Priority: 920, Protocol: 242}},
	}, {
		args: "--uplink wwan0 --mark 7/0xffffffff --table 0x1000 --priority 100 --protocol 0xf0 --netns /run/netns/x --resync 1m",
		want: parsed{netns: "/run/netns/x", resync: time.Minute, cfg: Config{
			Uplink: "wwan0", Mark: 7, Mask: 0xffffffff, Table: 4096, Priority: 100, Protocol: 240}},
	}, {
		args: "--uplink eth1 --mark 0x100/0xffffffff --protocol static",
		want: parsed{resync: 5 * time.Minute, cfg: Config{
			Uplink: "eth1", Mark: 0x100, Mask: 0xffffffff, Table: 920, Priority: 920, Protocol: 4}},
	},
		{args: "--mark 0x100/0xffffffff", wantErr: "--uplink and --mark are required"},
		{args: "--uplink eth1", wantErr: "--uplink and --mark are required"},
		{args: "--uplink averyveryverylongname --mark 1/0xffffffff", wantErr: "longer than 15 bytes"},
		{args: "--uplink a:b --mark 1/0xffffffff", wantErr: `invalid value "a:b" for flag -uplink: "a:b" is not a name the kernel accepts for a link`},
		{args: "--uplink eth1 --mark 0/0xff00", wantErr: `invalid value "0/0xff00" for flag -mark: mark 0/0xff00: the mark must be non-zero`},
		{args: "--uplink eth1 --mark 0x100/0xf0", wantErr: "mask 0xf0 does not cover mark 0x100"},
		{args: "--uplink eth1 --mark 0x100/0", wantErr: "mask 0 matches every packet"},
		{args: "--uplink eth1 --mark 0x1000000000/0xffffffff", wantErr: "not MARK/MASK"},
		{args: "--uplink eth1 --mark 1/0xffffffff --table 255", wantErr: `invalid value "255" for flag -table: table 255 is reserved`},
		{args: "--uplink eth1 --mark 1/0xffffffff --table 253", wantErr: "table 253 is reserved"},
		{args: "--uplink eth1 --mark 1/0xffffffff --priority 0", wantErr: `invalid value "0" for flag -priority: priority 0 is the kernel's local rule`},
		{args: "--uplink eth1 --mark 1/0xffffffff --protocol nosuch", wantErr: `invalid value "nosuch" for flag -protocol: not a protocol`},
		{args: "--uplink eth1 --mark 1/0xffffffff --resync x", wantErr: `invalid value "x" for flag -resync`},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			var c Config
			p, build := command(&c)
			err := p.Flags().Parse(strings.Fields(tt.args))
			if err == nil {
				_, err = build()
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error %q is more than one line", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := parsed{c, p.Flags().Lookup("netns").Value.String(), p.Resync}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(parsed{})); diff != "" {
				t.Errorf("parsed (-want +got):\n%s", diff)
			}
		})
	}
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
		{[]string{"--mark", "0x100/0xff00"}, 2, "uplinkpin: --uplink and --mark are required"},
		{[]string{"--uplink", "eth1", "--mark", "0x100/0xff00", "extra"}, 2, `uplinkpin: unexpected argument "extra"`},
		{[]string{"--uplink", "eth1", "--mark", "0x100/0xff00", "--resync", "-1s"}, 2, "uplinkpin: --resync -1s: must not be negative"},
		{[]string{"--uplink", "eth1", "--mark", "0x100/0xff00", "--table", "main"}, 2, `uplinkpin: invalid value "main" for flag --table: not a table number`},
		{[]string{"--nope"}, 2, "uplinkpin: flag provided but not defined: --nope"},
		{[]string{"once", "--uplink", "eth1"}, 2, "uplinkpin: --uplink and --mark are required"},
		{[]string{"pin", "--uplink", "eth1"}, 2, `uplinkpin: unknown command "pin" (want run, once, plan or cleanup)`},
		{[]string{"-h"}, 0, "usage: uplinkpin [run|once|plan|cleanup] --uplink LINK --mark MARK/MASK [flags]\n"},
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
