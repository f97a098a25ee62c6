package ciliumnode

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// summary renders a snapshot as one line a node: "name on 10.0.0.1,fd00::1".
func summary(ps Peers) []string {
	var out []string
	for p := range ps.All() {
		out = append(out, peerLine(p))
	}
	return out
}

func peerLine(p Peer) string {
	mode := "off"
	if p.Encrypting {
		mode = "on"
	}
	var addrs []string
	for _, a := range p.Addrs {
		addrs = append(addrs, a.String())
	}
	return strings.TrimSpace(p.Name + " " + mode + " " + strings.Join(addrs, ","))
}

func mkPeer(name string, enc bool, addrs ...string) Peer {
	p := Peer{Name: name, Encrypting: enc}
	for _, a := range addrs {
		p.Addrs = append(p.Addrs, netip.MustParseAddr(a))
	}
	return p
}

func TestPeersOps(t *testing.T) {
	var ps Peers
	if addrs, left := ps.Encrypting(""); ps.Len() != 0 || addrs != nil || left != 0 || ps.String() != "0 nodes, 0 encrypting" {
		t.Errorf("zero Peers: %d nodes, %v %d, %q", ps.Len(), addrs, left, ps)
	}
	ps = peersOf([]Peer{
		mkPeer("c", true, "10.0.0.3"),
		mkPeer("a", true, "10.0.0.1", "fd00::1"),
		mkPeer("b", false, "10.0.0.2"),
		mkPeer("a", true, "10.0.0.9"), // a server bug: the later one stands
	})
	want := []string{"a on 10.0.0.9", "b off 10.0.0.2", "c on 10.0.0.3"}
	if diff := cmp.Diff(want, summary(ps)); diff != "" {
		t.Fatalf("peersOf (-want +got):\n%s", diff)
	}

	steps := []struct {
		name string
		op   func(Peers) Peers
		want []string
	}{
		{"add first", func(p Peers) Peers { return p.with(mkPeer("0", true)) }, []string{"0 on", "a on 10.0.0.9", "b off 10.0.0.2", "c on 10.0.0.3"}},
		{"add last", func(p Peers) Peers { return p.with(mkPeer("d", false)) }, []string{"0 on", "a on 10.0.0.9", "b off 10.0.0.2", "c on 10.0.0.3", "d off"}},
		{"replace", func(p Peers) Peers { return p.with(mkPeer("b", true, "10.0.0.22")) }, []string{"0 on", "a on 10.0.0.9", "b on 10.0.0.22", "c on 10.0.0.3", "d off"}},
		{"remove middle", func(p Peers) Peers { return p.without("b") }, []string{"0 on", "a on 10.0.0.9", "c on 10.0.0.3", "d off"}},
		{"remove missing", func(p Peers) Peers { return p.without("zz") }, []string{"0 on", "a on 10.0.0.9", "c on 10.0.0.3", "d off"}},
		{"remove first and last", func(p Peers) Peers { return p.without("0").without("d") }, []string{"a on 10.0.0.9", "c on 10.0.0.3"}},
	}
	for _, st := range steps {
		before := summary(ps)
		next := st.op(ps)
		if diff := cmp.Diff(st.want, summary(next)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", st.name, diff)
		}
		if diff := cmp.Diff(before, summary(ps)); diff != "" {
			t.Errorf("%s modified the old snapshot (-before +after):\n%s", st.name, diff)
		}
		ps = next
	}

	if p, ok := ps.Get("c"); !ok || peerLine(p) != "c on 10.0.0.3" {
		t.Errorf("Get(c) = %v, %v", p, ok)
	}
	if _, ok := ps.Get("b"); ok {
		t.Errorf("Get(b) found a removed node")
	}
	for range ps.All() {
		break // All stops when asked
	}
}

func TestPeersEncrypting(t *testing.T) {
	ps := peersOf([]Peer{
		mkPeer("self", true, "10.0.0.5", "fd00::5"),
		mkPeer("peer-1", true, "10.0.0.7", "fd00::7"),
		mkPeer("peer-2", true, "10.0.0.6"),
		mkPeer("cp", false, "10.0.0.2"),
		mkPeer("dup", true, "10.0.0.6"), // claims peer-2's address too
		mkPeer("old", false, "10.0.0.7"),
	})
	got, left := ps.Encrypting("self")
	if left != 0 {
		t.Errorf("Encrypting(self) left %d out", left)
	}
	want := []netip.Addr{
		netip.MustParseAddr("10.0.0.6"), netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("fd00::7"),
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("Encrypting(self) (-want +got):\n%s", diff)
	}
	if all, _ := ps.Encrypting("nobody"); len(all) != 5 {
		n := len(all)
		t.Errorf("Encrypting(nobody): %d addresses, want 5 (self's too)", n)
	}
	if ps.EncryptingCount() != 4 || ps.String() != "6 nodes, 4 encrypting" {
		t.Errorf("EncryptingCount %d, String %q", ps.EncryptingCount(), ps)
	}
	if !ps.Equal(peersOf(slices.Collect(ps.All()))) || ps.Equal(ps.without("cp")) || ps.Equal(ps.with(mkPeer("cp", true, "10.0.0.2"))) {
		t.Errorf("Equal is wrong")
	}
}

// TestPeersWithRandom checks with and without against a map.
func TestPeersWithRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ref := map[string]bool{}
	var ps Peers
	for i := range 2000 {
		name := fmt.Sprintf("n%03d", r.IntN(300))
		if r.IntN(3) == 0 {
			delete(ref, name)
			ps = ps.without(name)
		} else {
			enc := r.IntN(2) == 0
			ref[name] = enc
			ps = ps.with(Peer{Name: name, Encrypting: enc})
		}
		if i%100 != 0 {
			continue
		}
		var want []string
		for n, e := range ref {
			want = append(want, peerLine(Peer{Name: n, Encrypting: e}))
		}
		slices.Sort(want)
		if diff := cmp.Diff(want, summary(ps), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("step %d (-want +got):\n%s", i, diff)
		}
	}
}

func TestWireObjectPeer(t *testing.T) {
	tests := []struct {
		name    string
		obj     string // edits of the default node
		want    string // peerLine
		invalid []invalidAddr
		wantErr string
	}{
		{name: "encrypting", obj: node("1"), want: "worker-1 on 10.0.0.5"},
		{name: "opted out", obj: node("1", optedOut), want: "worker-1 off 10.0.0.5"},
		{name: "key 0", obj: node("1", key(0)), want: "worker-1 off 10.0.0.5"},
		{name: "key null", obj: node("1", key(nil)), want: "worker-1 off 10.0.0.5"},
		{name: "no spec", obj: node("1", noSpec), want: "worker-1 off"},
		{name: "no kind (a list item)", obj: node("1", typed("", "")), want: "worker-1 on 10.0.0.5"},
		{
			name: "addresses: InternalIPs only, sorted, deduplicated, 4in6 unmapped",
			obj: node("1", addrs(
				"InternalIP", "fd00::5", "ExternalIP", "203.0.113.5", "InternalIP", "10.0.0.5",
				"CiliumInternalIP", "10.244.1.94", "InternalIP", "::ffff:10.0.0.6", "InternalIP", "10.0.0.5",
			)),
			want: "worker-1 on 10.0.0.5,10.0.0.6,fd00::5",
		},
		{
			name: "invalid addresses are left out, each with its reason",
			obj: node("1", addrs("InternalIP", "10.0.0.5", "InternalIP", "not-an-ip", "InternalIP", "", "InternalIP", "fe80::1%eth0",
				"InternalIP", "0.0.0.0", "InternalIP", "127.0.0.1", "InternalIP", "ff02::1", "InternalIP", "10.0.0.0/8",
				"InternalIP", "255.255.255.255", "InternalIP", "169.254.3.4", "InternalIP", "fe80::1", "InternalIP", " 10.0.0.22", "InternalIP", "::")),
			want: "worker-1 on 10.0.0.5",
			invalid: []invalidAddr{
				{"not-an-ip", "not an IP address"}, {"", "not an IP address"}, {"fe80::1%eth0", "an address with a zone"},
				{"0.0.0.0", "unspecified"}, {"127.0.0.1", "loopback"}, {"ff02::1", "multicast"}, {"10.0.0.0/8", "not an IP address"},
				{"255.255.255.255", "broadcast"}, {"169.254.3.4", "link-local"}, {"fe80::1", "link-local"},
				{" 10.0.0.22", "not an IP address"}, {"::", "unspecified"},
			},
		},
		{name: "wrong kind", obj: node("1", typed("v1", "Node")), wantErr: `got "v1" "Node", want cilium.io/v2 CiliumNode`},
		{name: "no name", obj: node("1", named("")), wantErr: "CiliumNode without metadata.name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var o wireObject
			if err := json.Unmarshal([]byte(tc.obj), &o); err != nil {
				t.Fatal(err)
			}
			p, invalid, err := o.peer()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("peer: %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := peerLine(p); got != tc.want {
				t.Errorf("peer = %q, want %q", got, tc.want)
			}
			if diff := cmp.Diff(tc.invalid, invalid, cmp.AllowUnexported(invalidAddr{})); diff != "" {
				t.Errorf("invalid addresses (-want +got):\n%s", diff)
			}
			if cap(p.Addrs) != len(p.Addrs) {
				t.Errorf("Addrs has spare capacity %d: appending to it would share", cap(p.Addrs)-len(p.Addrs))
			}
		})
	}
}

// addrs sets spec.addresses from type, ip pairs.
func addrs(typeIP ...string) func(map[string]any) {
	return func(n map[string]any) {
		var as []any
		for i := 0; i+1 < len(typeIP); i += 2 {
			as = append(as, map[string]any{"type": typeIP[i], "ip": typeIP[i+1]})
		}
		spec(n)["addresses"] = as
	}
}
