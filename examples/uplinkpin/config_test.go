package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		args    string
		want    options
		wantErr string
	}{{
		args: "--uplink eth1 --mark 0x100/0xff00",
		want: options{resync: 5 * time.Minute, cfg: Config{
			Uplink: "eth1", Mark: 0x100, Mask: 0xff00, Table: 920, Priority: 920, Protocol: 242}},
	}, {
		args: "--uplink wwan0 --mark 7/0xffffffff --table 0x1000 --priority 100 --protocol 0xf0 --netns /run/netns/x --resync 1m",
		want: options{netns: "/run/netns/x", resync: time.Minute, cfg: Config{
			Uplink: "wwan0", Mark: 7, Mask: 0xffffffff, Table: 4096, Priority: 100, Protocol: 240}},
	}, {
		args: "--uplink eth1 --mark 0x100/0xffffffff --protocol static",
		want: options{resync: 5 * time.Minute, cfg: Config{
			Uplink: "eth1", Mark: 0x100, Mask: 0xffffffff, Table: 920, Priority: 920, Protocol: 4}},
	},
		{args: "--mark 0x100/0xffffffff", wantErr: "--uplink is required"},
		{args: "--uplink eth1", wantErr: "--mark is required"},
		{args: "--uplink averyveryverylongname --mark 1/0xffffffff", wantErr: "longer than 15 bytes"},
		{args: "--uplink a:b --mark 1/0xffffffff", wantErr: `--uplink "a:b": "a:b" is not a name the kernel accepts for a link`},
		{args: "--uplink eth1 --mark 0/0xff00", wantErr: `--mark "0/0xff00": mark 0/0xff00: the mark must be non-zero`},
		{args: "--uplink eth1 --mark 0x100/0xf0", wantErr: "mask 0xf0 does not cover mark 0x100"},
		{args: "--uplink eth1 --mark 0x100/0", wantErr: "mask 0 matches every packet"},
		{args: "--uplink eth1 --mark 0x1000000000/0xffffffff", wantErr: "not MARK/MASK"},
		{args: "--uplink eth1 --mark 1/0xffffffff --table 255", wantErr: `--table "255": table 255 is reserved`},
		{args: "--uplink eth1 --mark 1/0xffffffff --table 253", wantErr: "table 253 is reserved"},
		{args: "--uplink eth1 --mark 1/0xffffffff --priority 0", wantErr: `--priority "0": priority 0 is the kernel's local rule`},
		{args: "--uplink eth1 --mark 1/0xffffffff --protocol nosuch", wantErr: `--protocol "nosuch": not a protocol`},
		{args: "--uplink eth1 --mark 1/0xffffffff extra", wantErr: `unexpected argument "extra"`},
		{args: "--uplink eth1 --mark 1/0xffffffff --resync x", wantErr: `invalid value "x" for flag -resync`},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			got, err := parseArgs(strings.Fields(tt.args), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseArgs: got error %v, want one containing %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error %q is more than one line", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseArgs: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(options{})); diff != "" {
				t.Errorf("parseArgs (-want +got):\n%s", diff)
			}
		})
	}
}
