//go:build linux

package main

import (
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the agent's Prometheus metrics. The loop's counters are
// updated as it goes; the watcher's, the CiliumNode source's and the
// host's fragmentation counters are read at scrape time.
type metrics struct {
	reg      *prometheus.Registry
	passes   *prometheus.CounterVec
	took     prometheus.Histogram
	changes  *prometheus.CounterVec
	failed   *prometheus.CounterVec
	fights   prometheus.Counter
	fighting prometheus.Gauge
	// steppedBack counts the repairs given up: routes another program
	// re-asserts (reconcile.Reconciler.OnStepBack).
	steppedBack prometheus.Counter
	mode        *prometheus.GaugeVec
	ready       prometheus.Gauge
	lastGood    prometheus.Gauge
	// listenFailed counts the failed tries to listen, by listener
	// (listenRetry).
	listenFailed *prometheus.CounterVec
	// pathChanges counts the peers' path-MTU changes (pathmtu_linux.go);
	// nil until addPathMTU.
	pathChanges *prometheus.CounterVec

	modeMu   sync.Mutex // guards curMode and isReadyV, for the scrape
	curMode  mtupolicy.Mode
	isReadyV bool
}

// newMetrics returns the agent's metrics; requests returns the API request
// counters by outcome, and is nil without a reader of the API.
func newMetrics(w *netwatch.Watcher, cfg mtupolicy.Config, requests func() map[string]uint64, snmp string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_passes_total",
			Help: "Reconcile passes, by result: unchanged, changed, failed, deferred (an object's changes rate-limited, as in a fight), waiting (cache not synced or encryption mode unknown).",
		}, []string{"result"}),
		took: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "marksplit_pass_duration_seconds",
			Help: "How long a reconcile pass took, from the cache's change to the kernel's answers: policy, plan and apply, for the passes that had something to do or failed.",
			// From a repair (~0.5 ms) to a 100,000-route table (~1 s).
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 8),
		}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_changes_total",
			Help: "Kernel changes applied, by kind: route-replace, route-delete, rule-add, rule-delete, route-repair.",
		}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_failed_operations_total",
			Help: "Kernel changes that failed, by kind.",
		}, []string{"kind"}),
		fights: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marksplit_fights_total",
			Help: "Fights: episodes of another program undoing what the agent made, again and again (one episode however many objects it undoes; the log's fight: line names them and the program).",
		}),
		fighting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "marksplit_fight_in_progress",
			Help: "Fights going on now: one per program undoing what the agent made; 0 when there is none.",
		}),
		steppedBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "marksplit_repairs_stepped_back_total",
			Help: "Main-table routes the agent stopped repairing because another program kept re-asserting their MTU (a route reconciler such as Cilium's); the log's fight: ... stepping back line names each route and program.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "marksplit_ready",
			Help: "1 when the last pass converged (what /readyz answers 200 for), else 0.",
		}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "marksplit_encryption_mode",
			Help: "The node's encryption mode as the agent knows it: 1 for the current mode (on, off, unknown), 0 for the others.",
		}, []string{"mode"}),
		lastGood: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "marksplit_last_successful_pass_timestamp_seconds",
			Help: "When a pass last converged (Unix time); 0 before the first.",
		}),
		listenFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_listen_failures_total",
			Help: "Failed tries to listen on --metrics-addr (metrics) or --secure-metrics-addr (secure-metrics), such as a port another program holds; the agent runs on and tries again, every 30 s at most.",
		}, []string{"listener"}),
	}
	m.listenFailed.WithLabelValues("metrics")
	m.listenFailed.WithLabelValues("secure-metrics")
	for _, k := range []netwatch.OpKind{netwatch.RouteReplace, netwatch.RouteDelete, netwatch.RuleAdd, netwatch.RuleDelete} {
		m.changes.WithLabelValues(k.String())
		m.failed.WithLabelValues(k.String())
	}
	m.changes.WithLabelValues("route-repair")
	m.failed.WithLabelValues("route-repair")
	for _, r := range passResults {
		m.passes.WithLabelValues(r)
	}
	m.setMode(mtupolicy.ModeUnknown)
	m.reg.MustRegister(m.passes, m.took, m.changes, m.failed, m.fights, m.fighting, m.steppedBack, m.mode, m.ready, m.lastGood, m.listenFailed,
		&scrapeCollector{w: w, cfg: cfg, requests: requests, snmp: snmp, m: m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "marksplit_build_info",
		Help:        "The agent's version, as a label; always 1.",
		ConstLabels: prometheus.Labels{"version": version},
	})
	info.Set(1)
	m.reg.MustRegister(info)
	return m
}

func opKindLabel(op netwatch.Op) string {
	if op.Repair {
		return "route-repair"
	}
	return op.Kind.String()
}

// The methods below are safe on a nil *metrics.

// passResults are the values of marksplit_passes_total's result label.
var passResults = []string{"unchanged", "changed", "failed", "deferred", "waiting"}

// passResult names what a pass did.
func passResult(p reconcile.Pass) string {
	switch {
	case !p.Planned:
		return "waiting"
	case p.Err != nil:
		return "failed"
	case p.Deferred > 0:
		return "deferred"
	case len(p.Applied) > 0:
		return "changed"
	}
	return "unchanged"
}

// pass counts a pass; converged is the Reconciler's state after it.
func (m *metrics) pass(p reconcile.Pass, converged bool) {
	if m == nil {
		return
	}
	m.passes.WithLabelValues(passResult(p)).Inc()
	if p.Planned && (len(p.Applied)+len(p.Failed) > 0 || p.Err != nil) {
		m.took.Observe(p.Took.Seconds())
	}
	for _, op := range p.Failed {
		m.failed.WithLabelValues(opKindLabel(op)).Inc()
	}
	m.modeMu.Lock()
	m.isReadyV = converged
	m.modeMu.Unlock()
	m.ready.Set(bool01(converged))
	if converged {
		m.lastPass(time.Now())
	}
}

func (m *metrics) change(op netwatch.Op) {
	if m != nil {
		m.changes.WithLabelValues(opKindLabel(op)).Inc()
	}
}

// fight counts a fight's start and marks it in progress until its end.
func (m *metrics) fight(f reconcile.Fight) {
	if m == nil {
		return
	}
	if f.Over {
		m.fighting.Dec()
		return
	}
	m.fights.Inc()
	m.fighting.Inc()
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// modeIs reports whether the mode gauge says mode.
func (m *metrics) modeIs(mode mtupolicy.Mode) bool {
	m.modeMu.Lock()
	defer m.modeMu.Unlock()
	return m.curMode == mode
}

func (m *metrics) isReady() bool {
	m.modeMu.Lock()
	defer m.modeMu.Unlock()
	return m.isReadyV
}

func (m *metrics) setMode(mode mtupolicy.Mode) {
	if m == nil {
		return
	}
	m.modeMu.Lock()
	m.curMode = mode
	m.modeMu.Unlock()
	for _, x := range []mtupolicy.Mode{mtupolicy.ModeUnknown, mtupolicy.ModeOn, mtupolicy.ModeOff} {
		v := 0.0
		if x == mode {
			v = 1
		}
		m.mode.WithLabelValues(x.String()).Set(v)
	}
}

func (m *metrics) lastPass(t time.Time) {
	if m != nil {
		m.lastGood.Set(float64(t.UnixNano()) / 1e9)
	}
}

// scrapeCollector reads counters kept elsewhere when Prometheus scrapes.
type scrapeCollector struct {
	w        *netwatch.Watcher
	cfg      mtupolicy.Config
	requests func() map[string]uint64 // nil without a reader of the API
	snmp     string
	m        *metrics
}

var (
	descEvents = prometheus.NewDesc("marksplit_events_total",
		"rtnetlink changes applied to the cache, by object kind (link, addr, route, rule).", []string{"kind"}, nil)
	descResyncs = prometheus.NewDesc("marksplit_resyncs_total",
		"Full or route re-dumps of the cache, by cause: initial, overflow (ENOBUFS: events lost), interrupted, reconnect, requested (the periodic safety resync), routes (a family's routes, after a change the kernel does not announce), rules (after a rule event that does not say which of two equal rules it was), link-routes (only the routes out of one link, after a change of the link).", []string{"cause"}, nil)
	descSynced = prometheus.NewDesc("marksplit_watcher_synced",
		"1 when the cache mirrors the kernel.", nil, nil)
	descReconnects = prometheus.NewDesc("marksplit_watcher_reconnects_total",
		"rtnetlink sessions that failed and were reopened.", nil, nil)
	descMalformed = prometheus.NewDesc("marksplit_watcher_malformed_messages_total",
		"rtnetlink messages that could not be decoded (each forces a resync).", nil, nil)
	descSyncDuration = prometheus.NewDesc("marksplit_watcher_last_sync_duration_seconds",
		"How long the last full dump took.", nil, nil)
	descMapped = prometheus.NewDesc("marksplit_watcher_mapped_bytes",
		"Memory the cached routes hold outside the Go heap, which go_memstats_* does not count (the route arrays of tables past 4,096 routes, about 40 bytes a route).", nil, nil)
	descFragOKs = prometheus.NewDesc("marksplit_host_ip_frag_oks_total",
		"The host's IPv4 datagrams fragmented (Ip: FragOKs in /proc/net/snmp of the agent's network namespace).", nil, nil)
	descFragCreates = prometheus.NewDesc("marksplit_host_ip_frag_creates_total",
		"The host's IPv4 fragments created (Ip: FragCreates in /proc/net/snmp of the agent's network namespace).", nil, nil)
	descRequests = prometheus.NewDesc("marksplit_ciliumnode_requests_total",
		"Requests to the Kubernetes API for CiliumNodes (the node's own, or with --peers=auto every node's), by outcome.", []string{"outcome"}, nil)
	descTunnel = prometheus.NewDesc("marksplit_tunnel_link_present",
		"1 when the tunnel link (--tunnel-link) exists, else 0.", nil, nil)
	descTableRoutes = prometheus.NewDesc("marksplit_table_routes",
		"Routes in the agent's table, by family (4, 6).", []string{"family"}, nil)
	descSplit = prometheus.NewDesc("marksplit_split_active",
		"1 when the split is in place: encryption on, the tunnel link present, routes in the table, and the last pass converged.", nil, nil)
)

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEvents, descResyncs, descSynced, descReconnects, descMalformed,
		descSyncDuration, descMapped, descFragOKs, descFragCreates, descRequests, descTunnel, descTableRoutes, descSplit} {
		ch <- d
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.w.Stats()
	for _, k := range []netwatch.Kind{netwatch.KindLink, netwatch.KindAddr, netwatch.KindRoute, netwatch.KindRule} {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(st.Events[k]), k.String())
	}
	for cause, n := range st.Resyncs {
		ch <- prometheus.MustNewConstMetric(descResyncs, prometheus.CounterValue, float64(n), cause)
	}
	ch <- prometheus.MustNewConstMetric(descSynced, prometheus.GaugeValue, bool01(st.Synced))
	ch <- prometheus.MustNewConstMetric(descReconnects, prometheus.CounterValue, float64(st.Reconnects))
	ch <- prometheus.MustNewConstMetric(descMalformed, prometheus.CounterValue, float64(st.Malformed))
	ch <- prometheus.MustNewConstMetric(descSyncDuration, prometheus.GaugeValue, st.LastSyncDuration.Seconds())
	ch <- prometheus.MustNewConstMetric(descMapped, prometheus.GaugeValue, float64(st.MappedBytes))
	if f, err := readFragCounters(c.snmp); err != nil {
		ch <- prometheus.NewInvalidMetric(descFragOKs, err)
	} else {
		ch <- prometheus.MustNewConstMetric(descFragOKs, prometheus.CounterValue, float64(f.OKs))
		ch <- prometheus.MustNewConstMetric(descFragCreates, prometheus.CounterValue, float64(f.Creates))
	}
	var tunnel bool
	var routes [2]int
	c.w.Read(func(v netwatch.View) {
		_, tunnel = v.LinkByName(c.cfg.TunnelLink)
		for i, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
			for range v.Routes(f, c.cfg.Table) {
				routes[i]++
			}
		}
	})
	ch <- prometheus.MustNewConstMetric(descTunnel, prometheus.GaugeValue, bool01(tunnel))
	ch <- prometheus.MustNewConstMetric(descTableRoutes, prometheus.GaugeValue, float64(routes[0]), "4")
	ch <- prometheus.MustNewConstMetric(descTableRoutes, prometheus.GaugeValue, float64(routes[1]), "6")
	split := tunnel && routes[0]+routes[1] > 0 && c.m.modeIs(mtupolicy.ModeOn) && c.m.isReady()
	ch <- prometheus.MustNewConstMetric(descSplit, prometheus.GaugeValue, bool01(split))
	if c.requests != nil {
		for outcome, n := range c.requests() {
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(n), outcome)
		}
	}
}

// handler serves the registry.
func (m *metrics) handler(log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)})
}

// stepBack counts a repair given up.
func (m *metrics) stepBack() {
	if m != nil {
		m.steppedBack.Inc()
	}
}
