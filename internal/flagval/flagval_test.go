package flagval

import (
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
)

func TestMark(t *testing.T) {
	for _, tt := range []struct {
		in         string
		mark, mask netwatch.Mark
		wantErr    string
	}{
		{in: "1", mark: 1, mask: 0xffffffff},
		{in: "0x100/0xff00", mark: 0x100, mask: 0xff00},
		{in: "256/65280", mark: 0x100, mask: 0xff00},
		{in: "0xffffffff", mark: 0xffffffff, mask: 0xffffffff},
		{in: "0x80000/0xff0000", mark: 0x80000, mask: 0xff0000},
		{in: "0", wantErr: "the mark must not be zero"},
		{in: "0/0xff00", wantErr: "the mark must not be zero"},
		{in: "0x100/0xf0", wantErr: "mark 0x100 has bits outside mask 0xf0"},
		{in: "0x100/0", wantErr: "mark 0x100 has bits outside mask 0x0"},
		{in: "0x100000000", wantErr: "not MARK or MARK/MASK"},
		{in: "1/0x100000000", wantErr: "not MARK or MARK/MASK"},
		{in: "0x100/", wantErr: "not MARK or MARK/MASK"},
		{in: "/0xff", wantErr: "not MARK or MARK/MASK"},
		{in: "", wantErr: "not MARK or MARK/MASK"},
		{in: "-1", wantErr: "not MARK or MARK/MASK"},
		{in: "tailscale", wantErr: "not MARK or MARK/MASK"},
		{in: "1/2/3", wantErr: "not MARK or MARK/MASK"},
	} {
		mark, mask, err := Mark(tt.in)
		if !errMatches(err, tt.wantErr) || mark != tt.mark || mask != tt.mask {
			t.Errorf("Mark(%q) = %v, %v, %v; want %v, %v, error %q", tt.in, mark, mask, err, tt.mark, tt.mask, tt.wantErr)
		}
	}
}

func TestTable(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    netwatch.Table
		wantErr string
	}{
		{in: "1", want: 1},
		{in: "252", want: 252},
		{in: "256", want: 256},
		{in: "0x100", want: 256},
		{in: "4294967295", want: 4294967295},
		{in: "0", wantErr: "reserved table (unspec)"},
		{in: "253", wantErr: "reserved table (default)"},
		{in: "254", wantErr: "reserved table (main)"},
		{in: "0xff", wantErr: "reserved table (local)"},
		{in: "4294967296", wantErr: "not a table number"},
		{in: "main", wantErr: "not a table number"},
		{in: "-1", wantErr: "not a table number"},
		{in: "", wantErr: "not a table number"},
	} {
		got, err := Table(tt.in)
		if !errMatches(err, tt.wantErr) || got != tt.want {
			t.Errorf("Table(%q) = %v, %v; want %v, error %q", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestPriority(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    uint32
		wantErr string
	}{
		{in: "1", want: 1},
		{in: "910", want: 910},
		{in: "32765", want: 32765},
		{in: "32768", want: 32768},
		{in: "0x10", want: 16},
		{in: "4294967295", want: 4294967295},
		{in: "0", wantErr: "reserved for the kernel's"},
		{in: "32766", wantErr: "reserved for the kernel's"},
		{in: "32767", wantErr: "reserved for the kernel's"},
		{in: "4294967296", wantErr: "not a rule priority"},
		{in: "-1", wantErr: "not a rule priority"},
		{in: "", wantErr: "not a rule priority"},
	} {
		got, err := Priority(tt.in)
		if !errMatches(err, tt.wantErr) || got != tt.want {
			t.Errorf("Priority(%q) = %v, %v; want %v, error %q", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestProtocol(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    netwatch.Protocol
		wantErr string
	}{
		{in: "1", want: 1},
		{in: "241", want: 241},
		{in: "0xf0", want: 240},
		{in: "255", want: 255},
		{in: "static", want: netwatch.ProtoStatic},
		{in: "kernel", want: netwatch.ProtoKernel},
		{in: "bird", want: netwatch.ProtoBIRD},
		{in: "0", wantErr: "not a protocol number (1 to 255)"},
		{in: "unspec", wantErr: "not a protocol number (1 to 255) or iproute2 name"},
		{in: "256", wantErr: "not a protocol number (1 to 255) or iproute2 name"},
		{in: "-1", wantErr: "not a protocol number"},
		{in: "", wantErr: "not a protocol number"},
		{in: "Static", wantErr: "not a protocol number"},
		{in: "nosuch", wantErr: "not a protocol number"},
	} {
		got, err := Protocol(tt.in)
		if !errMatches(err, tt.wantErr) || got != tt.want {
			t.Errorf("Protocol(%q) = %v, %v; want %v, error %q", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// errMatches reports whether err is nil when want is empty, or contains want.
func errMatches(err error, want string) bool {
	if want == "" {
		return err == nil
	}
	return err != nil && strings.Contains(err.Error(), want)
}

func TestLinkName(t *testing.T) {
	for _, tt := range []struct {
		in, err string
	}{
		{"enp7s0", ""},
		{"cilium_wg0", ""},
		{"123456789012345", ""},
		{"", "empty link name"},
		{"1234567890123456", "longer than 15 bytes"},
		{".", "not a valid link name"},
		{"..", "not a valid link name"},
		{"a/b", "not a valid link name"},
		{"a:b", "not a valid link name"},
		{"a b", "not a valid link name"},
	} {
		err := LinkName(tt.in)
		if !errMatches(err, tt.err) {
			t.Errorf("LinkName(%q) = %v, want error %q", tt.in, err, tt.err)
		}
	}
}
