package main

import (
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestParseArgs(t *testing.T) {
	tests := []struct {
		args    string
		want    options
		wantErr string
	}{{
		args: "--prefix 10.8.0.0/16",
		want: options{resync: 5 * time.Minute, cfg: Config{
			Link: "tailscale0", Prefixes: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16")},
			Mark: 0x80000, Mask: 0xff0000, Table: 910, Priority: 910, Protocol: 241}},
	}, {
		args: "--prefix 10.8.0.0/16 --prefix fd00::/8 --prefix 10.8.0.0/16 --link wg0 --mark 51820/0xffffffff " +
			"--table 0x100 --priority 5000 --protocol 99 --netns /run/netns/x --resync 0",
		want: options{netns: "/run/netns/x", cfg: Config{
			Link: "wg0", Prefixes: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16"), netip.MustParsePrefix("fd00::/8")},
			Mark: 51820, Mask: 0xffffffff, Table: 256, Priority: 5000, Protocol: 99}},
	},
		{args: "", wantErr: "--prefix is required"},
		{args: "--prefix 10.8.0.1/16", wantErr: `--prefix "10.8.0.1/16": host bits set (did you mean 10.8.0.0/16?)`},
		{args: "--prefix 10.8.0.0", wantErr: `--prefix "10.8.0.0": not a CIDR prefix`},
		{args: "--prefix fe80::%eth0/64", wantErr: `--prefix "fe80::%eth0/64": not a CIDR prefix`},
		{args: "--prefix 10.8.0.0/16 --link ''", wantErr: `--link "": empty link name`},
		{args: "--prefix 10.8.0.0/16 --link averyveryverylongname", wantErr: "longer than 15 bytes"},
		{args: "--prefix 10.8.0.0/16 --link a/b", wantErr: "is not a name the kernel accepts for a link"},
		{args: "--prefix 10.8.0.0/16 --mark 0", wantErr: `--mark "0": 0 has no mask`},
		{args: "--prefix 10.8.0.0/16 --mark 0x80000/0xf000", wantErr: "mask 0xf000 does not cover mark 0x80000"},
		{args: "--prefix 10.8.0.0/16 --mark 0x80000/", wantErr: "not MARK/MASK"},
		{args: "--prefix 10.8.0.0/16 --mark tailscale", wantErr: "not MARK/MASK"},
		{args: "--prefix 10.8.0.0/16 --table 254", wantErr: `--table "254": table 254 is reserved`},
		{args: "--prefix 10.8.0.0/16 --table 0", wantErr: `--table "0": table 0 is reserved`},
		{args: "--prefix 10.8.0.0/16 --table 4294967296", wantErr: "not a table number"},
		{args: "--prefix 10.8.0.0/16 --priority 32767", wantErr: `--priority "32767": priority 32767 is at or after the main table's rule`},
		{args: "--prefix 10.8.0.0/16 --priority -1", wantErr: "not a rule priority"},
		{args: "--prefix 10.8.0.0/16 --protocol 0", wantErr: `--protocol "0": protocol 0 means something to the kernel`},
		{args: "--prefix 10.8.0.0/16 --protocol 256", wantErr: "not a protocol"},
		{args: "--prefix 10.8.0.0/16 --resync -1s", wantErr: "--resync -1s: must not be negative"},
		{args: "--prefix 10.8.0.0/16 extra", wantErr: `unexpected argument "extra"`},
		{args: "--bogus", wantErr: "flag provided but not defined: -bogus"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			got, err := parseArgs(splitArgs(tt.args), io.Discard)
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
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(options{}), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("parseArgs (-want +got):\n%s", diff)
			}
		})
	}
}

// splitArgs splits on spaces; ” is an empty argument.
func splitArgs(s string) []string {
	var args []string
	for _, a := range strings.Fields(s) {
		if a == "''" {
			a = ""
		}
		args = append(args, a)
	}
	return args
}
