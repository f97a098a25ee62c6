//go:build linux

package main

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/internal/pathprobe"
	"github.com/prometheus/client_golang/prometheus"
)

// prober searches the peers' path MTUs (--path-mtu-probe): a Scheduler
// fed with the peers that have neither a declared value, and a Responder
// that answers the cluster's own nodes.
type prober struct {
	l     *loop
	p     *pathprobe.Prober
	sched *pathprobe.Scheduler
	resp  *pathprobe.Responder

	mu     sync.Mutex
	synced []netip.Addr // the peers of the last sync
	tunnel int          // and the tunnel MTU

	searches *prometheus.CounterVec // by result
	probes   prometheus.Counter
}

func newProber(o options, l *loop, log *slog.Logger) (*prober, error) {
	p, err := pathprobe.NewProber(pathprobe.Config{Mark: uint32(o.policy.Mark), Port: o.probePort, Logger: log})
	if err != nil {
		return nil, err
	}
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
	pr.sched, err = pathprobe.NewScheduler(pathprobe.SchedulerConfig{Searcher: p, Deliver: pr.deliver, Logger: log})
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

// sync gives the scheduler the peers without a declared value, each with
// the largest size worth trying: the tunnel MTU plus WireGuard's overhead
// (beyond it the route keeps the tunnel MTU anyway). It runs in a pass;
// it does nothing while neither the peers nor the tunnel MTU changed.
func (pr *prober) sync(peers []netip.Addr, tunnel int) {
	if pr == nil || tunnel == 0 {
		return
	}
	pr.mu.Lock()
	same := tunnel == pr.tunnel && len(peers) == len(pr.synced) && (len(peers) == 0 || &peers[0] == &pr.synced[0])
	pr.synced, pr.tunnel = peers, tunnel
	pr.mu.Unlock()
	if same {
		return
	}
	m := make(map[netip.Addr]int, len(peers))
	for _, a := range peers {
		if !pr.l.pmtu.Declared(a) {
			m[a] = pathmtu.PathFor(a, tunnel)
		}
	}
	pr.sched.Sync(m)
}

// run serves the responder and runs the scheduler until ctx ends.
func (pr *prober) run(ctx context.Context, g *group) {
	g.Go(func() {
		if err := pr.resp.Serve(ctx); err != nil && ctx.Err() == nil {
			pr.l.log.Warn("path MTU: the probe responder stopped: " + err.Error())
		}
	})
	g.Go(func() {
		_ = pr.sched.Run(ctx)
		pr.p.Close()
	})
}

// register adds the probe metrics.
func (pr *prober) register(m *metrics) {
	if m != nil && pr != nil {
		m.reg.MustRegister(pr.searches, pr.probes)
	}
}
