//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/pathmtu"
)

// pathStore is a store of one peer, 10.0.0.9, at tunnel MTU 1355.
func pathStore(t *testing.T) *pathmtu.Store {
	t.Helper()
	st := pathmtu.NewStore(nil)
	st.SetTunnelMTU(1355)
	st.SetPeers([]netip.Addr{netip.MustParseAddr("10.0.0.9")})
	return st
}

// The health socket answers "path-mtu ADDR" with the peer's pathReport,
// one JSON line: value, inner MTU, state, source and age; a peer with no
// value is "unknown", "none"; a bad address is "not ok".
func TestHealthPathMTU(t *testing.T) {
	st := pathStore(t)
	now := time.Now()
	st.Now = func() time.Time { return now.Add(-90 * time.Second) }
	if _, ok := st.Observe(netip.MustParseAddr("10.0.0.9"), 1368, pathmtu.SourceProbed); !ok {
		t.Fatal("Observe: no change")
	}
	l := &loop{pmtu: st}
	ask := func(q string) string {
		t.Helper()
		c, srv := net.Pipe()
		done := make(chan struct{})
		go func() { defer close(done); answerHealth(srv, nil, nil, l.pathAnswer) }()
		if _, err := io.WriteString(c, q+"\n"); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("%q: %v", q, err)
		}
		c.Close()
		<-done
		return strings.TrimSuffix(line, "\n")
	}
	var got pathReport
	must(t, json.Unmarshal([]byte(ask("path-mtu 10.0.0.9")), &got))
	if got.Age < 90 || got.Age > 24*3600 {
		t.Errorf("age %v s, want 90 s or a little more", got.Age)
	}
	got.Age = 0
	if diff := cmp.Diff(pathReport{Peer: "10.0.0.9", Path: 1368, Inner: 1296, State: "reduced", Source: "probed"}, got); diff != "" {
		t.Errorf("10.0.0.9 (-want +got):\n%s", diff)
	}
	if a := ask("path-mtu 10.0.0.7"); a != `{"peer":"10.0.0.7","state":"unknown","source":"none","age_s":0}` {
		t.Errorf("no peer's: %s", a)
	}
	if a := ask("path-mtu ten"); !strings.HasPrefix(a, "not ok: ") {
		t.Errorf("a bad address: %q, want not ok", a)
	}
	r := pathReport{Peer: "10.0.0.9", Path: 1368, Inner: 1296, State: "reduced", Source: "probed", Age: 90, From: "agent"}
	if got, want := r.text(), "1368 bytes (inner MTU 1296, reduced), probed, age 1m30s (the running agent's)"; got != want {
		t.Errorf("text %q, want %q", got, want)
	}
}
