//go:build linux

package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/marksplit/marksplit/internal/ciliumnode"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
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
	changes  *prometheus.CounterVec
	failed   *prometheus.CounterVec
	fights   *prometheus.CounterVec
	mode     *prometheus.GaugeVec
	lastGood prometheus.Gauge
}

func newMetrics(w *netwatch.Watcher, src *ciliumnode.Source, snmp string) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_passes_total",
			Help: "Reconcile passes, by result: unchanged, changed, failed, damped (repairs delayed by fight damping), waiting (cache not synced or encryption mode unknown).",
		}, []string{"result"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_changes_total",
			Help: "Kernel changes applied, by kind: route-replace, route-delete, rule-add, rule-delete, route-repair.",
		}, []string{"kind"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_failed_operations_total",
			Help: "Kernel changes that failed, by kind.",
		}, []string{"kind"}),
		fights: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "marksplit_fights_damped_total",
			Help: "Repairs delayed because another program keeps undoing the object, by object kind (route, rule).",
		}, []string{"object"}),
		mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "marksplit_encryption_mode",
			Help: "The node's encryption mode as the agent knows it: 1 for the current mode (on, off, unknown), 0 for the others.",
		}, []string{"mode"}),
		lastGood: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "marksplit_last_successful_pass_timestamp_seconds",
			Help: "When a pass last converged (Unix time); 0 before the first.",
		}),
	}
	for _, k := range []netwatch.OpKind{netwatch.RouteReplace, netwatch.RouteDelete, netwatch.RuleAdd, netwatch.RuleDelete} {
		m.changes.WithLabelValues(k.String())
		m.failed.WithLabelValues(k.String())
	}
	m.changes.WithLabelValues("route-repair")
	m.failed.WithLabelValues("route-repair")
	for _, r := range []string{"unchanged", "changed", "failed", "damped", "waiting"} {
		m.passes.WithLabelValues(r)
	}
	m.fights.WithLabelValues("route")
	m.fights.WithLabelValues("rule")
	m.setMode(mtupolicy.ModeUnknown)
	m.reg.MustRegister(m.passes, m.changes, m.failed, m.fights, m.mode, m.lastGood,
		&scrapeCollector{w: w, src: src, snmp: snmp},
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

func (m *metrics) pass(result string) {
	if m != nil {
		m.passes.WithLabelValues(result).Inc()
	}
}

func (m *metrics) change(op netwatch.Op) {
	if m != nil {
		m.changes.WithLabelValues(opKindLabel(op)).Inc()
	}
}

func (m *metrics) failedOp(op netwatch.Op) {
	if m != nil {
		m.failed.WithLabelValues(opKindLabel(op)).Inc()
	}
}

func (m *metrics) fightDamped(op netwatch.Op) {
	if m == nil {
		return
	}
	obj := "route"
	if op.Kind == netwatch.RuleAdd || op.Kind == netwatch.RuleDelete {
		obj = "rule"
	}
	m.fights.WithLabelValues(obj).Inc()
}

func (m *metrics) setMode(mode mtupolicy.Mode) {
	if m == nil {
		return
	}
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
	w    *netwatch.Watcher
	src  *ciliumnode.Source // nil unless --encryption=auto
	snmp string
}

var (
	descEvents = prometheus.NewDesc("marksplit_events_total",
		"rtnetlink changes applied to the cache, by object kind (link, addr, route, rule).", []string{"kind"}, nil)
	descResyncs = prometheus.NewDesc("marksplit_resyncs_total",
		"Full or route re-dumps of the cache, by cause: initial, overflow (ENOBUFS: events lost), interrupted, reconnect, requested (the periodic safety resync), routes (after a change the kernel does not announce).", []string{"cause"}, nil)
	descSynced = prometheus.NewDesc("marksplit_watcher_synced",
		"1 when the cache mirrors the kernel.", nil, nil)
	descReconnects = prometheus.NewDesc("marksplit_watcher_reconnects_total",
		"rtnetlink sessions that failed and were reopened.", nil, nil)
	descMalformed = prometheus.NewDesc("marksplit_watcher_malformed_messages_total",
		"rtnetlink messages that could not be decoded (each forces a resync).", nil, nil)
	descSyncDuration = prometheus.NewDesc("marksplit_watcher_last_sync_duration_seconds",
		"How long the last full dump took.", nil, nil)
	descFragOKs = prometheus.NewDesc("marksplit_host_ip_frag_oks_total",
		"The host's IPv4 datagrams fragmented (Ip: FragOKs in /proc/net/snmp of the agent's network namespace).", nil, nil)
	descFragCreates = prometheus.NewDesc("marksplit_host_ip_frag_creates_total",
		"The host's IPv4 fragments created (Ip: FragCreates in /proc/net/snmp of the agent's network namespace).", nil, nil)
	descRequests = prometheus.NewDesc("marksplit_ciliumnode_requests_total",
		"Requests to the Kubernetes API for the node's CiliumNode, by outcome.", []string{"outcome"}, nil)
)

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEvents, descResyncs, descSynced, descReconnects, descMalformed,
		descSyncDuration, descFragOKs, descFragCreates, descRequests} {
		ch <- d
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.w.Stats()
	for _, k := range []netwatch.Kind{netwatch.KindLink, netwatch.KindAddr, netwatch.KindRoute, netwatch.KindRule} {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(st.Events[k]), k.String())
	}
	for cause := netwatch.ResyncInitial; cause <= netwatch.ResyncRoutes; cause++ {
		ch <- prometheus.MustNewConstMetric(descResyncs, prometheus.CounterValue, float64(st.Resyncs[cause]), cause.String())
	}
	synced := 0.0
	if st.Synced {
		synced = 1
	}
	ch <- prometheus.MustNewConstMetric(descSynced, prometheus.GaugeValue, synced)
	ch <- prometheus.MustNewConstMetric(descReconnects, prometheus.CounterValue, float64(st.Reconnects))
	ch <- prometheus.MustNewConstMetric(descMalformed, prometheus.CounterValue, float64(st.Malformed))
	ch <- prometheus.MustNewConstMetric(descSyncDuration, prometheus.GaugeValue, st.LastSyncDuration.Seconds())
	if f, err := readFragCounters(c.snmp); err != nil {
		ch <- prometheus.NewInvalidMetric(descFragOKs, err)
	} else {
		ch <- prometheus.MustNewConstMetric(descFragOKs, prometheus.CounterValue, float64(f.OKs))
		ch <- prometheus.MustNewConstMetric(descFragCreates, prometheus.CounterValue, float64(f.Creates))
	}
	if c.src != nil {
		for outcome, n := range c.src.Stats().Requests() {
			ch <- prometheus.MustNewConstMetric(descRequests, prometheus.CounterValue, float64(n), outcome)
		}
	}
}

// serveHTTP serves /metrics, /healthz and /readyz on ln until ctx ends.
func serveHTTP(ctx context.Context, ln net.Listener, m *metrics, healthy, ready func() error, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(err.Error() + "\n"))
				return
			}
			w.Write([]byte("ok\n"))
		}
	}
	mux.Handle("/healthz", probe(healthy))
	mux.Handle("/readyz", probe(ready))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		srv.Close()
	}
	<-done
}
