package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/marksplit/marksplit/netwatch"
)

// dumper writes the state dump straight from a View: links, addresses,
// routes table by table in the kernel's dump order, rules; nothing is
// copied but the line being written. It runs inside the view's callback,
// so it must not wait on anything but its writer.
type dumper struct {
	w     *bufio.Writer
	json  bool
	names map[uint32]string
	quot  map[uint32][]byte // the names as JSON strings
	buf   []byte
}

func newDumper(w *bufio.Writer, jsonOut bool, names map[uint32]string) *dumper {
	d := &dumper{w: w, json: jsonOut, names: names, quot: make(map[uint32][]byte, len(names))}
	for i, n := range names {
		d.quot[i], _ = json.Marshal(n)
	}
	return d
}

func (d *dumper) dump(v netwatch.View) error {
	for l := range v.Links() {
		if err := d.object(netwatch.Event{Kind: netwatch.KindLink, Link: l}); err != nil {
			return err
		}
	}
	for a := range v.Addrs(0) {
		if err := d.object(netwatch.Event{Kind: netwatch.KindAddr, Addr: a}); err != nil {
			return err
		}
	}
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		for _, t := range v.Tables(f) {
			for r := range v.Routes(f, t) {
				if err := d.route(r); err != nil {
					return err
				}
			}
		}
	}
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		for r := range v.Rules(f) {
			if err := d.object(netwatch.Event{Kind: netwatch.KindRule, Rule: r}); err != nil {
				return err
			}
		}
	}
	return nil
}

// object writes one line of the dump.
func (d *dumper) object(ev netwatch.Event) error {
	if !d.json {
		_, err := fmt.Fprintln(d.w, textLine(ev, false, d.names))
		return err
	}
	b, err := json.Marshal(line(ev, "", d.names))
	if err != nil {
		return err
	}
	d.w.Write(b)
	return d.w.WriteByte('\n')
}

// route writes a route's line: most routes of a large table are plain
// (one path, no metric but the MTU, nothing undecoded), and their line is
// appended by hand, byte for byte what encoding/json writes for routeOf
// (TestAppendRoute); the others go through encoding/json.
func (d *dumper) route(r netwatch.Route) error {
	if !d.json || !plain(r) {
		return d.object(netwatch.Event{Kind: netwatch.KindRoute, Route: r})
	}
	d.buf = appendRoute(d.buf[:0], r, d.quot)
	_, err := d.w.Write(d.buf)
	return err
}

// plain reports whether r has nothing but what appendRoute writes.
func plain(r netwatch.Route) bool {
	return r.NextHops == nil && r.Metrics == (netwatch.Metrics{}) && r.Encap == (netwatch.Encap{}) &&
		r.Attrs == "" && r.Pref == 0 && r.Expires.IsZero()
}

// appendRoute appends the dump line of a plain route and a newline; quot
// holds the link names as JSON strings.
func appendRoute(b []byte, r netwatch.Route, quot map[uint32][]byte) []byte {
	b = append(b, `{"kind":"route","family":`...)
	b = strconv.AppendUint(b, uint64(r.Family), 10)
	b = append(b, `,"table":`...)
	b = strconv.AppendUint(b, uint64(r.Table), 10)
	b = appendPrefix(append(b, `,"dst":"`...), r.Dst)
	b = append(b, '"')
	if r.Src.IsValid() {
		b = appendPrefix(append(b, `,"from":"`...), r.Src)
		b = append(b, '"')
	}
	b = appendUint(b, `,"tos":`, uint64(r.TOS))
	if r.Gateway.IsValid() {
		b = r.Gateway.AppendTo(append(b, `,"gateway":"`...))
		b = append(b, '"')
	}
	b = appendUint(b, `,"index":`, uint64(r.Index))
	if q, ok := quot[r.Index]; ok && len(q) > 2 {
		b = append(append(b, `,"dev":`...), q...)
	}
	if r.PrefSrc.IsValid() {
		b = r.PrefSrc.AppendTo(append(b, `,"src":"`...))
		b = append(b, '"')
	}
	b = appendUint(b, `,"mtu":`, uint64(r.MTU))
	b = strconv.AppendUint(append(b, `,"metric":`...), uint64(r.Metric), 10)
	b = strconv.AppendUint(append(b, `,"protocol":`...), uint64(r.Protocol), 10)
	b = strconv.AppendUint(append(b, `,"scope":`...), uint64(r.Scope), 10)
	b = strconv.AppendUint(append(b, `,"type":`...), uint64(r.Type), 10)
	b = appendUint(b, `,"flags":`, uint64(r.Flags))
	b = appendUint(b, `,"nhid":`, uint64(r.NHID))
	b = appendUint(b, `,"flow":`, uint64(r.Flow))
	return append(b, "}\n"...)
}

// appendUint appends key and v unless v is 0 (omitempty).
func appendUint(b []byte, key string, v uint64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendUint(append(b, key...), v, 10)
}

func appendPrefix(b []byte, p netip.Prefix) []byte {
	b, _ = p.AppendText(b)
	return b
}
