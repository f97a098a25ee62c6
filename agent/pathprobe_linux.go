//go:build linux

package main

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/internal/pathprobe"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/prometheus/client_golang/prometheus"
)

// prober searches the peers' path MTUs (--path-mtu-probe): a Scheduler
// fed with the peers that have neither a declared nor a learned value and
// whose main path leaves the link (a peer on the link needs no probe: its
// path is the link's), and a Responder that answers the cluster's own
// nodes.
type prober struct {
	l     *loop
	p     io.Closer // the *pathprobe.Prober the Scheduler searches with
	sched *pathprobe.Scheduler
	resp  *pathprobe.Responder

	mu     sync.Mutex
	synced []netip.Addr            // the peers of the last sync
	tunnel int                     // and the tunnel MTU
	mark   uint64                  // and the view's Mark
	paths  map[netip.Addr]mainPath // the main path of each peer probed
	stale  atomic.Bool             // a learned value came or went since the last sync

	searches *prometheus.CounterVec // by result
	probes   prometheus.Counter
}

func newProber(o options, l *loop, log *slog.Logger) (*prober, error) {
	p, err := pathprobe.NewProber(pathprobe.Config{Mark: uint32(o.policy.Mark), Port: o.probePort, Logger: log})
	if err != nil {
		return nil, err
	}
	pr, err := newProberWith(l, p, pathprobe.SchedulerConfig{Searcher: p, Logger: log})
	if err != nil {
		p.Close()
		return nil, err
	}
	pr.resp = &pathprobe.Responder{Port: o.probePort, Logger: log, Allow: func(a netip.Addr) bool {
		ps := l.peers.Load()
		return ps != nil && ps.has(a.Unmap())
	}}
	return pr, nil
}

// newProberWith is a prober whose Scheduler searches with cfg.Searcher
// (its Deliver is the prober's), closing p when it stops; it has no
// Responder.
func newProberWith(l *loop, p io.Closer, cfg pathprobe.SchedulerConfig) (*prober, error) {
	pr := &prober{l: l, p: p,
		searches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_path_mtu_searches_total",
			Help: "Path-MTU searches by result: found (a path MTU), unreachable (no base-size probe answered: nothing changes), failed (an error).",
		}, []string{"result"}),
		probes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marksplit_path_mtu_probes_total",
			Help: "Probe packets sent by the path-MTU searches (node-wide rate-limited).",
		}),
	}
	for _, r := range []string{"found", "unreachable", "failed"} {
		pr.searches.WithLabelValues(r)
	}
	cfg.Deliver = pr.deliver
	var err error
	if pr.sched, err = pathprobe.NewScheduler(cfg); err != nil {
		return nil, err
	}
	return pr, nil
}

// deliver puts a search's result in the store: an unreachable peer keeps
// its value.
func (pr *prober) deliver(r pathprobe.Result, err error) {
	pr.probes.Add(float64(r.Probes))
	switch {
	case err != nil:
		pr.searches.WithLabelValues("failed").Inc()
		return
	case r.Unreachable:
		pr.searches.WithLabelValues("unreachable").Inc()
		return
	}
	pr.searches.WithLabelValues("found").Inc()
	if c, ok := pr.l.pmtu.Observe(r.Peer, r.PathMTU, pathmtu.SourceProbed); ok {
		pr.l.pathChanged([]pathmtu.Change{c})
	}
}

// sync gives the scheduler the peers to probe, each with the largest
// size worth trying: the tunnel MTU plus WireGuard's overhead (beyond it
// the route keeps the tunnel MTU anyway). A peer is probed when neither a
// declared nor a learned value covers it (ICMP already measured its path:
// the kernel accepted the message) and the main route to it leaves the
// link (it has a gateway: a peer on the link itself has the link's MTU);
// a peer whose main path changed is searched again at once. It runs in a
// pass with the pass's view; it does nothing while neither the peers, the
// tunnel MTU, the main table nor a learned value changed.
func (pr *prober) sync(v netwatch.View, peers []netip.Addr, tunnel int) {
	if pr == nil || tunnel == 0 {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	main := pr.mainChanged(v)
	stale := pr.stale.Swap(false)
	same := tunnel == pr.tunnel && len(peers) == len(pr.synced) && (len(peers) == 0 || &peers[0] == &pr.synced[0])
	pr.synced, pr.tunnel = peers, tunnel
	if same && !main && !stale {
		return
	}
	m := make(map[netip.Addr]int, len(peers))
	paths := make(map[netip.Addr]mainPath, len(peers))
	var moved []netip.Addr
	for _, a := range peers {
		a = a.Unmap()
		if pr.l.pmtu.Declared(a) || pr.l.pmtu.Get(a).Source == pathmtu.SourceLearned {
			continue
		}
		mp, ok := mainPathTo(v, a)
		if !ok || !mp.leavesLink() {
			continue
		}
		m[a] = pathmtu.PathFor(a, tunnel)
		paths[a] = mp
		if old, ok := pr.paths[a]; ok && old != mp {
			moved = append(moved, a)
		}
	}
	pr.paths = paths
	pr.sched.Sync(m)
	for _, a := range moved {
		pr.sched.Trigger(a)
	}
}

// mainChanged reports whether the main table may have changed since the
// last sync (always on the first, and when v cannot tell).
func (pr *prober) mainChanged(v netwatch.View) bool {
	changes, next, complete := v.Changes(pr.mark)
	pr.mark = next
	if pr.paths == nil || v.Changed() == nil || !v.Synced() || !complete {
		return true
	}
	for ev := range changes {
		if ev.Kind == netwatch.KindRoute && ev.Route.Table == netwatch.TableMain {
			return true
		}
	}
	return false
}

// learnedChanged tells the next sync that a learned value came or went:
// a peer with one is not probed.
func (pr *prober) learnedChanged() {
	if pr != nil {
		pr.stale.Store(true)
	}
}

// mainPath is the first hop of the main route to a peer: what a probe
// measures, and what a change of triggers a search.
type mainPath struct {
	gateway  netip.Addr
	index    uint32
	nhid     uint32 // a nexthop object: its hops are not known here
	gateways bool   // a multipath route with a gateway on some leg
}

// mainPathTo returns the path the main table sends a on: its first
// unicast covering route; false when none covers a.
func mainPathTo(v netwatch.View, a netip.Addr) (mainPath, bool) {
	rs := v.Covering(netwatch.TableMain, a)
	if len(rs) == 0 || rs[0].Type != netwatch.RouteUnicast {
		return mainPath{}, false
	}
	r := rs[0]
	mp := mainPath{gateway: r.Gateway, index: r.Index, nhid: r.NHID}
	for _, nh := range r.NextHops {
		mp.gateways = mp.gateways || nh.Gateway.IsValid()
	}
	return mp, true
}

// leavesLink reports whether the path goes through a router, where a path
// may carry less than the link: a gateway, a multipath leg with one, or a
// nexthop object (which may have one).
func (mp mainPath) leavesLink() bool {
	return mp.gateway.IsValid() || mp.gateways || mp.nhid != 0
}

// run serves the responder and runs the scheduler until ctx ends.
func (pr *prober) run(ctx context.Context, g goer) {
	g.Go(func() {
		if err := pr.resp.Serve(ctx); err != nil && ctx.Err() == nil {
			pr.l.log.Warn("path MTU: the probe responder stopped: " + err.Error())
		}
	})
	g.Go(func() {
		_ = pr.sched.Run(ctx)
		if pr.p != nil {
			pr.p.Close()
		}
	})
}

// register adds the probe metrics.
func (pr *prober) register(m *metrics) {
	if m != nil && pr != nil {
		m.reg.MustRegister(pr.searches, pr.probes)
	}
}
