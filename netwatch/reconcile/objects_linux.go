//go:build linux

package reconcile

import (
	"hash/maphash"
	"net/netip"
	"time"

	"github.com/marksplit/marksplit/netwatch"
)

// The objects a pass changes are remembered (for the rate limit, and so
// that another program's undo of one is told from any other change), but
// a first install of a full table changes 100,000 of them at once, and an
// object with its name, its line and its fight state costs hundreds of
// bytes. So an object changed once and never undone is a plain object: a
// 64-bit hash of its identity, when it was changed, and whether the kernel
// holds it as made and a hash of the route written, 32 bytes. It becomes a full object (loop.objs) when it
// is changed again within a refill of its rate limit's bucket, or undone.
//
// Two objects whose hashes collide (a chance of about n²/2⁶⁵ among n
// plain objects: 3·10⁻¹⁰ at 100,000) share one plain entry: one's change
// may then count as the other's, which at worst lets a change through the
// rate limit or counts one undo more; nothing is changed that the plan did
// not ask for.

// plainObject is an object changed once: at when (Unix nanoseconds), made
// while the kernel holds it as the Reconciler made it, and wrote the
// routeHash of the route it wrote (0 for none), for diverging.
type plainObject struct {
	at    int64
	wrote uint64
	made  bool
}

// objectHash is id's key among the plain objects.
func (l *loop) objectHash(id objectID) uint64 { return maphash.Comparable(l.seed, id) }

// lookup returns id's full object, promoting its plain one to it; nil when
// id has neither. A promoted object's bucket holds what one change left in
// it, refilled since.
func (l *loop) lookup(id objectID) *object {
	if o := l.objs[id]; o != nil {
		return o
	}
	h := l.objectHash(id)
	po, ok := l.plain[h]
	if !ok {
		return nil
	}
	delete(l.plain, h)
	at := time.Unix(0, po.at)
	o := &object{tokens: float64(l.burst - 1), at: at, made: po.made, touched: at}
	l.objs[id] = o
	return o
}

// plainAdmit admits a change of id when it has no full object: it becomes
// (or stays) a plain object unless its last change is recent enough that
// its bucket is not full again, when it reports false and the caller
// promotes it (lookup).
func (l *loop) plainAdmit(id objectID, now time.Time) bool {
	h := l.objectHash(id)
	if po, ok := l.plain[h]; ok && now.Sub(time.Unix(0, po.at)) < l.interval {
		return false
	}
	l.plain[h] = plainObject{at: now.UnixNano()}
	return true
}

// plainMade records that the kernel holds id as made, having written the
// route whose routeHash is wrote (0 for none), when id is a plain object;
// it reports whether it is one.
func (l *loop) plainMade(id objectID, wrote uint64) bool {
	h := l.objectHash(id)
	po, ok := l.plain[h]
	if ok {
		po.made, po.wrote = true, wrote
		l.plain[h] = po
	}
	return ok
}

// routeHash is a hash of every attribute of r that Route.Equal compares
// (of an expiry, only whether there is one), never 0: what a plain object
// keeps of the route it wrote.
func (l *loop) routeHash(r netwatch.Route) uint64 {
	var h maphash.Hash
	h.SetSeed(l.seed)
	maphash.WriteComparable(&h, r.Key())
	maphash.WriteComparable(&h, routeAttrs{r.Gateway, r.PrefSrc, r.Index, r.MTU, r.Protocol, r.Scope, r.Type,
		r.Flags, r.NHID, r.Metrics, r.Flow, r.Pref, r.Expires.IsZero(), r.Encap, r.Attrs})
	for _, nh := range r.NextHops {
		maphash.WriteComparable(&h, nh)
	}
	return h.Sum64() | 1
}

// routeAttrs are the comparable attributes of a route besides its key.
type routeAttrs struct {
	gateway, prefSrc netip.Addr
	index, mtu       uint32
	protocol         netwatch.Protocol
	scope            netwatch.Scope
	typ              netwatch.RouteType
	flags            netwatch.RouteFlags
	nhid             uint32
	metrics          netwatch.Metrics
	flow             uint32
	pref             netwatch.RoutePref
	noExpiry         bool
	encap            netwatch.Encap
	attrs            netwatch.Attrs
}

// forgetPlain forgets the plain objects changed before cutoff.
func (l *loop) forgetPlain(cutoff time.Time) {
	c := cutoff.UnixNano()
	for h, po := range l.plain {
		if po.at < c {
			delete(l.plain, h)
		}
	}
}
