//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/marksplit/marksplit/internal/kubeevents"
	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/prometheus/client_golang/prometheus"
)

// reasonPathBelowMinimum is the Event (the Node condition's reason too) for
// a peer whose path carries inner packets below the family's minimum MTU:
// no value is installed for it (docs/operations.md, "Path MTU").
const reasonPathBelowMinimum = condPathBelowMin

// pathChanged logs, counts and records the changes of the peers' path
// MTUs, and asks for a pass when one changes what a route carries or the
// Node condition says, or a learned value came or went (the prober then
// stops or starts probing that peer).
func (l *loop) pathChanged(cs []pathmtu.Change) {
	if len(cs) == 0 {
		return
	}
	now := time.Now()
	pass := false
	for _, c := range cs {
		l.met.pathChange(c)
		pass = pass || routeKey(l.pmtu.Judge(c.Peer, c.From)) != routeKey(l.pmtu.Judge(c.Peer, c.To))
		if c.From.Source == pathmtu.SourceLearned || c.To.Source == pathmtu.SourceLearned {
			l.probe.learnedChanged() // in the next pass
			pass = true
		}
		if c.To.Source == pathmtu.SourceNone {
			l.log.Info("path MTU of peer " + c.Peer.String() + " forgotten: the peer left")
			continue
		}
		pp := l.pmtu.Peer(c.Peer)
		p := pp.Value
		l.log.Info(pathLine(c.Peer, pp, now), "was", pathWas(c.From))
		if pp.State == pathmtu.StateBelowMinimum {
			msg := fmt.Sprintf("the path to peer %v carries %d bytes (%s): inner packets of %d, below the family's minimum; no path MTU is installed for it: clamp TCP MSS, or lower Cilium's MTU",
				c.Peer, p.Path, p.Source, pp.Inner)
			l.log.Warn(msg)
			if l.ev != nil {
				l.ev.record(kubeevents.Warning, reasonPathBelowMinimum, "PathMTU", msg)
			}
		}
	}
	if pass {
		l.r.Trigger()
	}
}

// routeKey is what a peer's path MTU does to the agent: the inner MTU its
// route carries when that is reduced, -1 below the family's minimum (the
// Node condition says so), else 0 (the route keeps the tunnel MTU). A
// change that keeps it needs no pass: a peer found full, the first search
// of most peers, costs a pass over every peer otherwise (5,000 peers at 20
// probes/s: 5% of a core, BenchmarkKernelPathProbe5000).
func routeKey(p pathmtu.Peer) int {
	switch p.State {
	case pathmtu.StateReduced:
		return p.Inner
	case pathmtu.StateBelowMinimum:
		return -1
	}
	return 0
}

// pathLine says a peer's path MTU: value, inner MTU, state, source and
// age.
func pathLine(a netip.Addr, p pathmtu.Peer, now time.Time) string {
	return "path MTU of peer " + a.String() + ": " + newPathReport(p, now).text()
}

// pathReport is one peer's path MTU as verify shows it (its line, and
// path_mtu in its JSON), and as the running agent answers
// "path-mtu ADDR" on the health socket (one JSON line, without from and
// why): fields are added, never changed.
type pathReport struct {
	Peer   string  `json:"peer"`
	Path   int     `json:"path,omitempty"`  // bytes the path carries; absent: not known
	Inner  int     `json:"inner,omitempty"` // the inner MTU it leaves, at most the tunnel MTU
	State  string  `json:"state"`           // full, reduced, below_minimum, unknown
	Source string  `json:"source"`          // declared, learned, probed, none
	Age    float64 `json:"age_s"`           // seconds since it was last measured (or declared); 0 when not known
	From   string  `json:"from,omitempty"`  // verify: "agent" (the running agent's) or "flags" (what --path-mtu declares)
	Why    string  `json:"why,omitempty"`   // verify, from "flags": why the agent's is not shown
}

func newPathReport(p pathmtu.Peer, now time.Time) pathReport {
	r := pathReport{Peer: p.Addr.String(), State: p.State.String(), Source: p.Value.Source.String()}
	if p.Value.Source != pathmtu.SourceNone {
		r.Path, r.Inner, r.Age = p.Value.Path, p.Inner, p.Value.Age(now).Seconds()
	}
	return r
}

// text is the report as the log line and verify say it.
func (r pathReport) text() string {
	s := "not known (the tunnel MTU)"
	if r.Source != pathmtu.SourceNone.String() {
		s = fmt.Sprintf("%d bytes (inner MTU %d, %s), %s, age %v", r.Path, r.Inner, r.State, r.Source, time.Duration(r.Age*float64(time.Second)))
	}
	switch r.From {
	case "agent":
		s += " (the running agent's)"
	case "flags":
		s += " (from the flags: " + r.Why + ")"
	}
	return s
}

// pathAnswer is the health socket's answer to "path-mtu ADDR": the peer's
// pathReport as one JSON line, or "not ok: " and why.
func (l *loop) pathAnswer(arg string) string {
	a, err := netip.ParseAddr(arg)
	if err != nil {
		return "not ok: " + err.Error()
	}
	b, err := json.Marshal(newPathReport(l.pmtu.Peer(a), time.Now()))
	if err != nil {
		return "not ok: " + err.Error()
	}
	return string(b)
}

func pathWas(v pathmtu.Value) string {
	if v.Source == pathmtu.SourceNone {
		return "none"
	}
	return fmt.Sprintf("%d %s", v.Path, v.Source)
}

// belowMinimum names the peers whose path is below their family's
// minimum, for the Node condition; "" when none is.
func (l *loop) belowMinimum() string {
	if l.pmtu == nil {
		return ""
	}
	n, first := 0, ""
	for _, p := range l.pmtu.Peers() {
		if p.State == pathmtu.StateBelowMinimum {
			if n == 0 || p.Addr.Less(netip.MustParseAddr(first)) {
				first = p.Addr.String()
			}
			n++
		}
	}
	switch n {
	case 0:
		return ""
	case 1:
		return "the path to peer " + first + " is below its family's minimum MTU: no path MTU is installed for it (clamp TCP MSS, or lower Cilium's MTU)"
	}
	return fmt.Sprintf("the paths to %d peers (first %s) are below their family's minimum MTU: no path MTU is installed for them (clamp TCP MSS, or lower Cilium's MTU)", n, first)
}

var (
	descPathPeers = prometheus.NewDesc("marksplit_path_mtu_peers",
		"Encrypting peers by the state of their path MTU: full (the path carries the tunnel MTU), reduced (the peer's route carries a smaller inner MTU), below_minimum (below the family's minimum: nothing installed), unknown.", []string{"state"}, nil)
	descPathSmallest = prometheus.NewDesc("marksplit_path_mtu_smallest_inner_bytes",
		"The smallest inner MTU among the peers whose value is installed: the MTU Cilium's pod plane (its MTU value) would need for every peer; 0 while none is known.", nil, nil)
)

// pathCollector reads the store at scrape time.
type pathCollector struct{ s *pathmtu.Store }

// addPathMTU registers the path-MTU metrics.
func (m *metrics) addPathMTU(l *loop) {
	if m == nil || l.pmtu == nil {
		return
	}
	m.pathChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "marksplit_path_mtu_changes_total",
		Help: "Changes of the peers' path MTUs, by direction (lower, raise, forget: the peer left) and source (declared, learned, probed).",
	}, []string{"direction", "source"})
	for _, dir := range []string{"lower", "raise", "forget"} {
		for _, src := range []pathmtu.Source{pathmtu.SourceDeclared, pathmtu.SourceLearned, pathmtu.SourceProbed} {
			m.pathChanges.WithLabelValues(dir, src.String()) // shown at 0 from the start
		}
	}
	m.reg.MustRegister(pathCollector{l.pmtu}, m.pathChanges)
}

func (c pathCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPathPeers
	ch <- descPathSmallest
}

func (c pathCollector) Collect(ch chan<- prometheus.Metric) {
	by, smallest := c.s.Counts()
	for _, st := range pathmtu.States {
		ch <- prometheus.MustNewConstMetric(descPathPeers, prometheus.GaugeValue, float64(by[st]), st.String())
	}
	ch <- prometheus.MustNewConstMetric(descPathSmallest, prometheus.GaugeValue, float64(smallest))
}

// pathChange counts a change by direction and source.
func (m *metrics) pathChange(c pathmtu.Change) {
	if m == nil || m.pathChanges == nil {
		return
	}
	src := c.To.Source
	if src == pathmtu.SourceNone {
		src = c.From.Source
	}
	m.pathChanges.WithLabelValues(c.Direction(), src.String()).Inc()
}
