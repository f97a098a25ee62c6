//go:build linux

package netwatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/marksplit/marksplit/netwatch/internal/rtnl"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Applier makes kernel changes on its own request socket.
//
// It is for one goroutine at a time: Apply and RouteGet share the socket,
// and a second caller's answers would be read by the first. Port is safe
// from any goroutine.
type Applier struct {
	c rtnl.Conn
}

// DialApplier opens a request socket in the network namespace ns; nil is
// the calling thread's.
func DialApplier(ns *NetNS) (*Applier, error) {
	c, err := dialerOf(ns).Dial(rtnl.DialConfig{MessageBuffer: applierBuffer})
	if err != nil {
		return nil, err
	}
	return &Applier{c: c}, nil
}

// applierBuffer is the largest answer the Applier reads: an
// acknowledgement, which echoes a request of well under 1 KiB with the
// kernel's message, or one route. The watcher's 1 MiB buffers cost a repair
// a 1 MiB allocation at every miss of their pool (a third of an agent's
// allocations over 300 repairs).
const applierBuffer = 64 << 10

// Close closes the socket.
func (a *Applier) Close() error { return a.c.Close() }

// Port is the netlink port of the Applier's socket: the Origin.Port of the
// events its own changes cause, which tells them from another program's.
func (a *Applier) Port() uint32 { return a.c.PID() }

// Result is the outcome of one operation.
type Result struct {
	Op  Op
	Err error // nil on success, including "already there" and "already gone"
	// Already is set on a success that changed nothing: the kernel already
	// had the route or rule being added, or had already removed the one
	// being deleted (as it does with the IPv4 routes of a link that went
	// down). A program logs only the changes it made.
	Already bool
}

// Apply executes ops in order with idempotent semantics: adding what
// exists and deleting what is gone succeed. Later operations depend on
// earlier ones (a rule on the routes of its table), so Apply stops at the
// first failure. It returns a Result for each operation it tried, in
// order — every one, or those up to and including the first failure — and
// that failure.
func (a *Applier) Apply(ops []Op) ([]Result, error) {
	res := make([]Result, 0, len(ops))
	for _, op := range ops {
		already, err := a.do(op)
		res = append(res, Result{Op: op, Err: err, Already: already})
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

func (a *Applier) do(op Op) (already bool, err error) {
	var (
		typ   uint16
		flags = netlink.Request | netlink.Acknowledge
		data  []byte
		ok    []unix.Errno // errnos that mean "already so"
	)
	switch op.Kind {
	case RouteReplace:
		typ, flags = unix.RTM_NEWROUTE, flags|netlink.Create|netlink.Replace
		data, err = encodeRoute(op.Route)
	case RouteDelete:
		// The route's identity, nothing else: the kernel compares the
		// metrics a delete names, and adds some of its own (rto_min's lock).
		r := op.Route
		r.Scope = scopeNowhere // the kernel's wildcard
		r.MTU, r.Metrics, r.Expires, r.Pref, r.Attrs = 0, Metrics{}, time.Time{}, prefMedium, ""
		typ, ok = unix.RTM_DELROUTE, []unix.Errno{unix.ESRCH}
		data, err = encodeRoute(r)
	case RuleAdd:
		typ, flags, ok = unix.RTM_NEWRULE, flags|netlink.Create|netlink.Excl, []unix.Errno{unix.EEXIST}
		data, err = encodeRule(op.Rule)
	case RuleDelete:
		typ, ok = unix.RTM_DELRULE, []unix.Errno{unix.ENOENT}
		data, err = encodeRule(op.Rule)
	default:
		return false, &ApplyError{Op: op, Err: errors.New("unknown operation")}
	}
	if err != nil {
		return false, &ApplyError{Op: op, Err: fmt.Errorf("encode: %w", err)}
	}
	_, err = a.c.Execute(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: flags}, Data: data})
	if err == nil {
		return false, nil
	}
	for _, e := range ok {
		if errors.Is(err, e) {
			return true, nil
		}
	}
	return false, &ApplyError{Op: op, Err: withMessage(err)}
}

// ApplyError is the error of an operation the kernel refused, or that
// could not be put into a request. Err matches the kernel's errno with
// errors.Is (unix.EEXIST, unix.ENETUNREACH, …) and carries the kernel's
// own explanation, when it gave one, in its text.
type ApplyError struct {
	Op  Op
	Err error
}

// Error names the operation as String does, with link indexes; the
// Reconciler logs failures with link names.
func (e *ApplyError) Error() string {
	obj := ruleHead(e.Op.Rule) + ": " + render(ruleWords(e.Op.Rule))
	if e.Op.Kind == RouteReplace || e.Op.Kind == RouteDelete {
		obj = e.Op.Route.Family.String() + " route " + e.Op.Route.String()
	}
	return "netwatch: " + e.Op.Kind.String() + " " + obj + ": " + e.Err.Error()
}

func (e *ApplyError) Unwrap() error { return e.Err }

// kernelError is the kernel's refusal: its errno, and the extended-ack
// text when it gave one ("operation not permitted (kernel: …)"). It
// unwraps to the *netlink.OpError, so errors.Is finds the errno.
type kernelError struct {
	op *netlink.OpError
}

func (e *kernelError) Error() string {
	if e.op.Message == "" {
		return e.op.Err.Error()
	}
	return e.op.Err.Error() + " (kernel: " + e.op.Message + ")"
}

func (e *kernelError) Unwrap() error { return e.op }

func withMessage(err error) error {
	var oe *netlink.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return &kernelError{oe}
	}
	return err
}

// RouteGet asks the kernel which route it would use for dst, for packets
// carrying mark (0 for none), like `ip route get DST mark MARK`. The
// returned route's Table and MTU are what the kernel chose; its MTU is 0
// when the route has none of its own (the output link's, then).
func (a *Applier) RouteGet(dst netip.Addr, mark Mark) (Route, error) {
	return routeGet(a.c, dst, mark)
}

func routeGet(c rtnl.Conn, dst netip.Addr, mark Mark) (Route, error) {
	f := FamilyOf(dst)
	dst = dst.Unmap()
	b := make([]byte, unix.SizeofRtMsg)
	b[0] = afOf(f)
	b[1] = uint8(dst.BitLen())
	// RTM_F_LOOKUP_TABLE: report the table the lookup chose, not main.
	// IPv4 needs it; IPv6 reports the table anyway and refuses the flag
	// on a strict socket ("Invalid flags for get route request").
	if f == IPv4 {
		binary.NativeEndian.PutUint32(b[8:12], unix.RTM_F_LOOKUP_TABLE)
	}
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(unix.RTA_DST, dst.AsSlice())
	if mark != 0 {
		ae.Uint32(unix.RTA_MARK, uint32(mark))
	}
	attrs, err := ae.Encode()
	if err != nil {
		return Route{}, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETROUTE, Flags: netlink.Request},
		Data:   append(b, attrs...),
	})
	if err != nil {
		return Route{}, fmt.Errorf("netwatch: route get %v mark %v: %w", dst, mark, withMessage(err))
	}
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWROUTE || len(m.Data) < unix.SizeofRtMsg {
			continue
		}
		d := append([]byte(nil), m.Data...)
		binary.NativeEndian.PutUint32(d[8:12], binary.NativeEndian.Uint32(d[8:12])&^unix.RTM_F_CLONED)
		r, err := decodeRoute(d, tableFilter{})
		// The answer echoes the question (the mark, the uid of the asking
		// socket): not attributes of the route.
		r.Attrs = r.Attrs.without(unix.RTA_MARK, unix.RTA_UID, unix.RTA_IP_PROTO, unix.RTA_SPORT, unix.RTA_DPORT)
		return r, err
	}
	return Route{}, fmt.Errorf("netwatch: route get %v: no route in the kernel's answer", dst)
}
