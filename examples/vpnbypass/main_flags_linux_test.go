package main

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// parsed is what the command line sets.
type parsed struct {
	cfg    Config
	netns  string
	resync time.Duration
}

func TestFlags(t *testing.T) {
	tests := []struct {
		args    string
		want    parsed
		wantErr string
	}{{
		args: "--prefix 10.8.0.0/16",
		want: parsed{resync: 5 * time.Minute, cfg: Config{
			Link: "tailscale0", Prefixes: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16")},
			Mark: 0x80000, Mask: 0xff0000, Table: 910, Priority: 910, Protocol: 241}},
	}, {
		args: "--prefix 10.8.0.0/16 --prefix fd00::/8 --prefix 10.8.0.0/16 --link wg0 --mark 51820/0xffffffff " +
			"--table 0x100 --priority 5000 --protocol 99 --netns /run/netns/x --resync 0",
		want: parsed{netns: "/run/netns/x", cfg: Config{
			Link: "wg0", Prefixes: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/16"), netip.MustParsePrefix("fd00::/8")},
			Mark: 51820, Mask: 0xffffffff, Table: 256, Priority: 5000, Protocol: 99}},
	},
		{args: "", wantErr: "--prefix is required"},
		{args: "--prefix 10.8.0.1/16", wantErr: `invalid value "10.8.0.1/16" for flag -prefix: host bits set (did you mean 10.8.0.0/16?)`},
		{args: "--prefix 10.8.0.0", wantErr: `invalid value "10.8.0.0" for flag -prefix: not a CIDR prefix`},
		{args: "--prefix fe80::%eth0/64", wantErr: `invalid value "fe80::%eth0/64" for flag -prefix: not a CIDR prefix`},
		{args: "--prefix 10.8.0.0/16 --link ''", wantErr: `invalid value "" for flag -link: empty link name`},
		{args: "--prefix 10.8.0.0/16 --link averyveryverylongname", wantErr: "longer than 15 bytes"},
		{args: "--prefix 10.8.0.0/16 --link a/b", wantErr: "is not a name the kernel accepts for a link"},
		{args: "--prefix 10.8.0.0/16 --mark 0", wantErr: `invalid value "0" for flag -mark: 0 has no mask`},
		{args: "--prefix 10.8.0.0/16 --mark 0x80000/0xf000", wantErr: "mask 0xf000 does not cover mark 0x80000"},
		{args: "--prefix 10.8.0.0/16 --mark 0x80000/", wantErr: "not MARK/MASK"},
		{args: "--prefix 10.8.0.0/16 --mark tailscale", wantErr: "not MARK/MASK"},
		{args: "--prefix 10.8.0.0/16 --table 254", wantErr: `invalid value "254" for flag -table: table 254 is reserved`},
		{args: "--prefix 10.8.0.0/16 --table 0", wantErr: `invalid value "0" for flag -table: table 0 is reserved`},
		{args: "--prefix 10.8.0.0/16 --table 4294967296", wantErr: "not a table number"},
		{args: "--prefix 10.8.0.0/16 --priority 32767", wantErr: `invalid value "32767" for flag -priority: priority 32767 is at or after the main table's rule`},
		{args: "--prefix 10.8.0.0/16 --priority -1", wantErr: "not a rule priority"},
		{args: "--prefix 10.8.0.0/16 --protocol 0", wantErr: `invalid value "0" for flag -protocol: protocol 0 means something to the kernel`},
		{args: "--prefix 10.8.0.0/16 --protocol 256", wantErr: "not a protocol"},
		{args: "--bogus", wantErr: "flag provided but not defined: -bogus"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			var c Config
			p, build := command(&c)
			err := p.Flags().Parse(splitArgs(tt.args))
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
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(parsed{}), cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("parsed (-want +got):\n%s", diff)
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
