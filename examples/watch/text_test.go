//go:build linux

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
)

// controlBytes reports whether s holds a byte a terminal acts on, other
// than the line ends.
func controlBytes(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0) })
}

func TestTextLineEscapes(t *testing.T) {
	names := map[uint32]string{2: "\x1b[31m\x07e0"}
	for _, tc := range []struct {
		ev   netwatch.Event
		want string
	}{
		{netwatch.Event{Kind: netwatch.KindLink, Link: netwatch.Link{Index: 2, Name: names[2], MTU: 1500}}, `link 2 \x1b[31m\ae0 mtu 1500 down`},
		{netwatch.Event{Kind: netwatch.KindLink, Link: netwatch.Link{Index: 3, Name: "enp7s0", MTU: 1450}}, `link 3 enp7s0 mtu 1450 down`},
	} {
		if got := textLine(tc.ev, false, names); got != tc.want {
			t.Errorf("textLine = %q, want %q", got, tc.want)
		}
	}
}

// A link named with ESC and BEL (the kernel accepts both) is printed
// escaped in the text output, never raw.
func TestKernelWatchTextEscapes(t *testing.T) {
	ns := newNetNS(t)
	const evil = "\x1b[31m\x07e0"
	ns.IP(t, "link", "add", evil, "type", "veth", "peer", "name", "p0")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-once", "-netns", ns.Path()}, &stdout, &stderr); code != 0 {
		t.Fatalf("watch -once: exit %d: %s", code, stderr.Bytes())
	}
	if out := stdout.String(); controlBytes(out) || !strings.Contains(out, ` \x1b[31m\ae0 mtu `) {
		t.Errorf("watch -once printed %q; want the link's name escaped, no control characters", out)
	}
}
