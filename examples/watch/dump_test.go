package main

import (
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
	"pgregory.net/rapid"
)

// TestAppendRoute: the hand-written line of a plain route is byte for byte
// what encoding/json writes for it, whatever its fields and link names
// (names may hold quotes, backslashes, HTML and non-ASCII bytes).
func TestAppendRoute(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := rapid.SampledFrom([]netwatch.Family{netwatch.IPv4, netwatch.IPv6}).Draw(t, "family")
		addr := func(name string) netip.Addr {
			if f == netwatch.IPv4 {
				return netip.AddrFrom4([4]byte(rapid.SliceOfN(rapid.Byte(), 4, 4).Draw(t, name)))
			}
			return netip.AddrFrom16([16]byte(rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, name)))
		}
		prefix := func(name string) netip.Prefix {
			a := addr(name)
			return netip.PrefixFrom(a, rapid.IntRange(0, a.BitLen()).Draw(t, name+" bits")).Masked()
		}
		maybe := func(name string) bool { return rapid.Bool().Draw(t, name) }
		r := netwatch.Route{Family: f, Table: netwatch.Table(rapid.Uint32().Draw(t, "table")), Dst: prefix("dst"),
			TOS: rapid.Uint8().Draw(t, "tos"), Metric: rapid.Uint32().Draw(t, "metric"),
			Index: rapid.Uint32Range(0, 4).Draw(t, "index"), MTU: rapid.Uint32().Draw(t, "mtu"),
			Protocol: netwatch.Protocol(rapid.Uint8().Draw(t, "proto")), Scope: netwatch.Scope(rapid.Uint8().Draw(t, "scope")),
			Type: netwatch.RouteType(rapid.Uint8().Draw(t, "type")), Flags: netwatch.RouteFlags(rapid.Uint32().Draw(t, "flags")),
			NHID: rapid.Uint32().Draw(t, "nhid"), Flow: rapid.Uint32().Draw(t, "flow")}
		if maybe("has src") {
			r.Src = prefix("src")
		}
		if maybe("has gateway") {
			r.Gateway = addr("gateway")
		}
		if maybe("has prefsrc") {
			r.PrefSrc = addr("prefsrc")
		}
		names := map[uint32]string{
			1: "eth0",
			2: rapid.StringOf(rapid.RuneFrom([]rune{'a', '"', '\\', '<', '&', 'é', '\x01', '\u2028'})).Draw(t, "name"),
			3: "",
		}
		if !plain(r) {
			t.Fatalf("a route with no metrics, paths or undecoded attributes is not plain: %+v", r)
		}
		want, err := json.Marshal(routeOf(r, "", names))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, '\n')
		quot := newDumper(nil, true, names).quot
		if got := appendRoute(nil, r, quot); string(got) != string(want) {
			t.Fatalf("appendRoute:\n got %s\nwant %s", got, want)
		}
	})
}

// BenchmarkAppendRoute: a route line by hand against encoding/json.
func BenchmarkAppendRoute(b *testing.B) {
	r := netwatch.Route{Family: netwatch.IPv4, Table: netwatch.TableMain, Dst: netip.MustParsePrefix("11.1.2.0/24"),
		Gateway: netip.MustParseAddr("10.0.0.1"), Index: 3, Protocol: netwatch.Protocol(186), Type: netwatch.RouteUnicast}
	names := map[uint32]string{3: "enp7s0"}
	quot := newDumper(nil, true, names).quot
	b.Run("append", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			buf = appendRoute(buf[:0], r, quot)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(routeOf(r, "", names)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
