package ciliumnode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
)

// Bounds on what the API may send, so that no answer, however large or endless, takes
// more than the DaemonSet's 128 MiB. Each one that is hit is said: in the error of the
// list that fails, or in the Problem of the node (see Peers.Problems), which the agent
// logs, exports and turns into an unready /readyz.
const (
	// MaxPeerBytes bounds the memory of the CiliumNodes a PeerSource keeps (Peer.cost: a
	// node's name, problem and addresses, and a fixed overhead): a node of a real cluster
	// takes about 200 bytes, so it is some 80,000 such nodes, over five times the largest
	// clusters run (15,000 nodes: 3 MiB). A list with more fails (the last peer set
	// stands); a node added by the watch beyond it is left out and the snapshot says so.
	MaxPeerBytes = 16 << 20
	// MaxListPages bounds the pages of one list (of 500 items: 500,000 nodes). A server
	// that answers every page with a new continue token would otherwise keep the list
	// going forever; one that answers them empty is also paced and cut short
	// (maxEmptyPages).
	MaxListPages = 1000
	// MaxNodeAddrs bounds the InternalIPs kept of one CiliumNode: a node has one or two
	// (IPv4 and IPv6), a handful at most. The ones beyond are not even decoded.
	MaxNodeAddrs = 16
	// MaxPeerAddrs bounds the addresses Peers.Encrypting returns: the host routes the
	// agent installs (an IPv4 and an IPv6 address a node at 30,000 nodes).
	MaxPeerAddrs = 60000
)

// wireObject is the part of a CiliumNode that matters here, as the API sends it in answers
// to a GET, in lists and in watch events. The fields of a Status (the object of an ERROR
// event) share it, so that an event is decoded in one pass from the stream.
type wireObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Spec struct {
		Addresses  wireAddrs `json:"addresses"`
		Encryption struct {
			Key int64 `json:"key"`
		} `json:"encryption"`
	} `json:"spec"`

	// Of a Status.
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// wireAddrs keeps the first MaxNodeAddrs InternalIPs of spec.addresses and counts the
// others, decoding the array one element at a time: a node with 90,000 addresses costs no
// more than one with 16.
type wireAddrs struct {
	ips   []string // InternalIPs, as sent
	more  int      // InternalIPs beyond MaxNodeAddrs, not kept
	wrong int      // elements that are not {"type": string, "ip": string}
}

// UnmarshalJSON decodes spec.addresses. It never fails: the outer decoder has checked the
// syntax, and what does not fit the schema is counted in wrong. It walks the array's bytes
// to find each element and decodes only the elements, one at a time.
func (a *wireAddrs) UnmarshalJSON(data []byte) error {
	*a = wireAddrs{}
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '[' {
		if string(data) != "null" {
			a.wrong++ // not an array (null is no addresses)
		}
		return nil
	}
	var (
		depth, start  int
		inStr, escape bool
		scalar        bool // inside an element that is not an object or array
	)
	for i, c := range data {
		switch {
		case inStr:
			switch {
			case escape:
				escape = false
			case c == '\\':
				escape = true
			case c == '"':
				inStr = false
			}
			continue
		case c == ' ', c == '\t', c == '\n', c == '\r':
			continue
		case depth == 1 && c == ',':
			scalar = false
			continue
		}
		switch c {
		case '{', '[':
			if depth++; depth == 2 {
				start = i
			}
		case '}', ']':
			if depth == 2 {
				a.element(data[start : i+1])
			}
			depth--
		default:
			if depth == 1 && !scalar {
				scalar = true
				a.wrong++
			}
			inStr = c == '"'
		}
	}
	return nil
}

// element decodes one element of spec.addresses.
func (a *wireAddrs) element(data []byte) {
	var e struct {
		Type string `json:"type"`
		IP   string `json:"ip"`
	}
	switch {
	case json.Unmarshal(data, &e) != nil:
		a.wrong++
	case e.Type != "InternalIP":
	case len(a.ips) < MaxNodeAddrs:
		a.ips = append(a.ips, e.IP)
	default:
		a.more++
	}
}

// invalidAddr is an InternalIP that is not a peer's address, and why.
type invalidAddr struct {
	ip     string // as sent
	reason string
}

// peer checks a CiliumNode and returns what is kept of it, with the InternalIPs that are
// not unicast addresses of another host (they are left out). A list's items may omit
// apiVersion and kind; if present they must be CiliumNode's. p.Problem says what was left
// out of a node that sent more than MaxNodeAddrs InternalIPs.
func (o *wireObject) peer() (p Peer, invalid []invalidAddr, err error) {
	if err := o.checkKind(true); err != nil {
		return Peer{}, nil, err
	}
	if o.Metadata.Name == "" {
		return Peer{}, nil, fmt.Errorf("%s without metadata.name", kind)
	}
	p = Peer{Name: o.Metadata.Name, Encrypting: o.Spec.Encryption.Key != 0}
	for _, s := range o.Spec.Addresses.ips {
		addr, why := parsePeerAddr(s)
		if why != "" {
			invalid = append(invalid, invalidAddr{s, why})
			continue
		}
		p.Addrs = append(p.Addrs, addr)
	}
	slices.SortFunc(p.Addrs, netip.Addr.Compare)
	p.Addrs = slices.Clip(slices.Compact(p.Addrs))
	if a := o.Spec.Addresses; a.wrong > 0 {
		invalid = append(invalid, invalidAddr{fmt.Sprintf("%d of spec.addresses", a.wrong), `not {"type": string, "ip": string}`})
	}
	if a := o.Spec.Addresses; a.more > 0 {
		p.Problem = fmt.Sprintf("%d InternalIPs, more than %d: the rest left out", MaxNodeAddrs+a.more, MaxNodeAddrs)
	}
	return p, invalid, nil
}

// checkKind checks apiVersion and kind; lax accepts an object that has neither (a list's
// items, a bookmark).
func (o *wireObject) checkKind(lax bool) error {
	if lax && o.APIVersion == "" && o.Kind == "" || o.APIVersion == apiVersion && o.Kind == kind {
		return nil
	}
	return fmt.Errorf("got %q %q, want %s %s", o.APIVersion, o.Kind, apiVersion, kind)
}

// broadcast is the IPv4 limited broadcast address.
var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// parsePeerAddr parses an InternalIP, or says why it is no peer's address: only a unicast
// address that routes to another host is (a subnet's broadcast address cannot be told
// without the subnet and is taken).
func parsePeerAddr(s string) (netip.Addr, string) {
	a, err := netip.ParseAddr(s)
	a = a.Unmap()
	switch {
	case err != nil:
		return a, "not an IP address"
	case a.Zone() != "":
		return a, "an address with a zone"
	case a.IsUnspecified():
		return a, "unspecified"
	case a.IsLoopback():
		return a, "loopback"
	case a.IsMulticast():
		return a, "multicast"
	case a == broadcast:
		return a, "broadcast"
	case a.IsLinkLocalUnicast():
		return a, "link-local"
	}
	return a, ""
}

// listMeta is the metadata of a list.
type listMeta struct {
	ResourceVersion string `json:"resourceVersion"`
	Continue        string `json:"continue"`
	// remainingItemCount is not decoded: a server can claim any number there, and nothing
	// is sized by what it claims.
}

// decodeList decodes a CiliumNodeList from r as it streams in, handing each item to visit
// without keeping it; only the list's metadata is returned. An item that decoded but has a
// field of the wrong type, or is larger than maxBody, is handed over with that error.
func decodeList(r *objectLimit, visit func(o *wireObject, err error) error) (listMeta, error) {
	var (
		meta              listMeta
		gotKind, gotAPIV  string
		seenMeta, inItems bool
	)
	dec := json.NewDecoder(r)
	if err := wantDelim(dec, '{'); err != nil {
		return meta, fmt.Errorf("decode %s: %w", listKind, err)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return meta, fmt.Errorf("decode %s: %w", listKind, err)
		}
		key, _ := t.(string)
		switch key {
		case "kind":
			err = dec.Decode(&gotKind)
		case "apiVersion":
			err = dec.Decode(&gotAPIV)
		case "metadata":
			err, seenMeta = decodeBounded(dec, r, &meta), true
		case "items":
			inItems = true
			err = decodeItems(dec, r, visit)
			inItems = false
		default:
			err = skipValue(dec)
		}
		r.reset()
		if err != nil {
			if inItems || errors.Is(err, errObjectTooLarge) {
				return meta, err
			}
			return meta, fmt.Errorf("decode %s: %s: %w", listKind, key, err)
		}
	}
	if err := wantDelim(dec, '}'); err != nil {
		return meta, fmt.Errorf("decode %s: %w", listKind, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return meta, fmt.Errorf("decode %s: data after the list", listKind)
	}
	switch {
	case gotAPIV != apiVersion || gotKind != listKind:
		return meta, fmt.Errorf("got %q %q, want %s %s", gotAPIV, gotKind, apiVersion, listKind)
	case !seenMeta || meta.ResourceVersion == "":
		return meta, fmt.Errorf("%s without metadata.resourceVersion", listKind)
	}
	return meta, nil
}

// skipValue reads past the next value token by token, keeping none of it.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// decodeItems decodes the items array (or null) of a list, one object at a time.
func decodeItems(dec *json.Decoder, r *objectLimit, visit func(*wireObject, error) error) error {
	t, err := dec.Token()
	if err != nil {
		return fmt.Errorf("decode %s items: %w", listKind, err)
	}
	if t == nil {
		return nil
	}
	if d, ok := t.(json.Delim); !ok || d != '[' {
		return fmt.Errorf("decode %s items: got %v, want an array", listKind, t)
	}
	for i := 0; dec.More(); i++ {
		var o wireObject
		err := decodeBounded(dec, r, &o)
		if err != nil && !skippable(err) {
			return fmt.Errorf("decode %s item %d: %w", kind, i, err)
		}
		if err := visit(&o, err); err != nil {
			return fmt.Errorf("%s item %d (%q): %w", kind, i, o.Metadata.Name, err)
		}
	}
	return wantDelim(dec, ']')
}

// skippable reports whether err, from decodeBounded, leaves the decoder after a complete
// value, so that the value can be skipped: a field of the wrong type, or a value larger
// than maxBody that was read whole.
func skippable(err error) bool {
	var typeErr *json.UnmarshalTypeError
	return errors.As(err, &typeErr) || errors.Is(err, errWholeTooLarge)
}

func wantDelim(dec *json.Decoder, want json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != want {
		return fmt.Errorf("got %v, want %v", t, want)
	}
	return nil
}

// errObjectTooLarge marks an object (or event) larger than maxBody. errWholeTooLarge,
// which wraps it, marks one that was read whole (it can be skipped); objectLimit fails
// reading with errObjectTooLarge itself.
var (
	errObjectTooLarge = fmt.Errorf("an object larger than %d bytes", maxBody)
	errWholeTooLarge  = fmt.Errorf("%w", errObjectTooLarge)
)

// decodeBounded decodes the next value of dec into v and fails with errObjectTooLarge if it
// took more than maxBody bytes of input. It resets r, dec's source, for the next value.
func decodeBounded(dec *json.Decoder, r *objectLimit, v any) error {
	start := dec.InputOffset()
	err := dec.Decode(v)
	r.reset()
	if dec.InputOffset()-start > maxBody && (err == nil || skippable(err)) {
		return errWholeTooLarge
	}
	return err
}

// maxReadAhead bounds what a decoder may read for one value: the value itself (at most
// maxBody, checked exactly by decodeBounded) and its read-ahead, at most its buffer, which
// grows to about twice the largest value. It keeps an endless value from filling memory.
const maxReadAhead = 4 * maxBody

// objectLimit fails a read once more than maxReadAhead bytes have been read since the last
// reset (once per value). It keeps the underlying reader's last error to tell a broken
// connection from garbage.
type objectLimit struct {
	r   io.Reader
	n   int
	err error
}

func (l *objectLimit) Read(p []byte) (int, error) {
	if l.n > maxReadAhead {
		l.err = errObjectTooLarge
		return 0, l.err
	}
	n, err := l.r.Read(p)
	l.n += n
	if err != nil {
		l.err = err
	}
	return n, err
}

func (l *objectLimit) reset() { l.n = 0 }

// maxEmptyPages bounds the empty pages in a row, each with a continue token, of one list:
// a real API server fills its pages. Each is followed by a wait of the back-off, which
// grows from page to page and on to the retry of the failed list.
const maxEmptyPages = 10

// peerOverhead is what a kept node costs besides its strings and addresses: the Peer, its
// pointer in a snapshot, and the slack of the slices.
const peerOverhead = 128

// cost estimates the memory p takes in a snapshot, for MaxPeerBytes.
func (p *Peer) cost() int {
	return peerOverhead + len(p.Name) + len(p.Problem) + 24*len(p.Addrs)
}
