package netwatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// This file reads and writes netlink attributes as bytes; it has no build
// constraint, so that Attrs can be read on any OS.

// errMalformed wraps every decoding failure.
var errMalformed = errors.New("netwatch: malformed rtnetlink message")

func malformed(what string, args ...any) error {
	return fmt.Errorf("%w: "+what, append([]any{errMalformed}, args...)...)
}

// attrs iterates over netlink attributes without allocating.
type attrs struct {
	b   []byte
	typ uint16 // without NLA_F_NESTED and NLA_F_NET_BYTEORDER
	raw uint16 // the type as sent, with those flags
	val []byte
	err error
}

func (a *attrs) next() bool {
	if len(a.b) == 0 || a.err != nil {
		return false
	}
	if len(a.b) < 4 {
		a.err = malformed("truncated attribute header")
		return false
	}
	l := int(binary.NativeEndian.Uint16(a.b[0:2]))
	if l < 4 || l > len(a.b) {
		a.err = malformed("attribute length %d out of range", l)
		return false
	}
	a.raw = binary.NativeEndian.Uint16(a.b[2:4])
	a.typ = a.raw & 0x3fff // strip NLA_F_NESTED, NLA_F_NET_BYTEORDER
	a.val = a.b[4:l]
	al := (l + 3) &^ 3
	if al > len(a.b) {
		al = len(a.b)
	}
	a.b = a.b[al:]
	return true
}

func (a *attrs) u32() (uint32, error) {
	if len(a.val) != 4 {
		return 0, malformed("attribute %d: want 4 bytes, have %d", a.typ, len(a.val))
	}
	return binary.NativeEndian.Uint32(a.val), nil
}

func (a *attrs) u16() (uint16, error) {
	if len(a.val) != 2 {
		return 0, malformed("attribute %d: want 2 bytes, have %d", a.typ, len(a.val))
	}
	return binary.NativeEndian.Uint16(a.val), nil
}

func (a *attrs) u8() (uint8, error) {
	if len(a.val) != 1 {
		return 0, malformed("attribute %d: want 1 byte, have %d", a.typ, len(a.val))
	}
	return a.val[0], nil
}

// optional reads a u32 whose unset value is -1.
func (a *attrs) optional() (Optional, error) {
	v, err := a.u32()
	if err != nil || int32(v) == -1 {
		return Optional{}, err
	}
	return Optional{Set: true, Value: int32(v)}, nil
}

func (a *attrs) str() string {
	v := a.val
	for i, c := range v {
		if c == 0 {
			v = v[:i]
			break
		}
	}
	return string(v)
}

// keep appends the current attribute to kept, as sent, its padding zeroed.
func (a *attrs) keep(kept Attrs) Attrs {
	return kept + Attrs(appendAttr(nil, a.raw, a.val))
}

// appendAttr appends an attribute of type typ (flags included) and value
// val to b, padded to four bytes.
func appendAttr(b []byte, typ uint16, val []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(val)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// without returns a without the attributes of the given types.
func (a Attrs) without(types ...uint16) Attrs {
	var out []byte
	for at := (attrs{b: []byte(a)}); at.next(); {
		if !slices.Contains(types, at.typ) {
			out = appendAttr(out, at.raw, at.val)
		}
	}
	return Attrs(out)
}
