//go:build linux

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/nodecondition"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	"github.com/prometheus/client_golang/prometheus"
)

// newNodeCondition returns the Writer of --node-condition for run, wired to
// l's passes, or nil without the flag. Unlike Events, a condition asked for
// but impossible (no $NODE_NAME, not in a pod) is an error: a controller
// would wait for it forever.
func newNodeCondition(o options, l *loop, switchWhat string, log *slog.Logger) (*nodecondition.Writer, error) {
	if o.nodeCondition == "" {
		return nil, nil
	}
	if o.nodeName == "" {
		return nil, errors.New("--node-condition needs --node-name or $NODE_NAME: the Node to set it on")
	}
	server, err := kubeapi.InClusterServer()
	if err != nil {
		return nil, fmt.Errorf("--node-condition: %w", err)
	}
	dir := serviceAccountDir()
	token := filepath.Join(dir, "token")
	if _, err := os.Stat(token); err != nil {
		return nil, fmt.Errorf("--node-condition: no service-account token: %w", err)
	}
	hc, err := kubeapi.NewHTTPClient(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("--node-condition: no cluster CA: %w", err)
	}
	w, err := nodecondition.New(nodecondition.Config{
		Client:   &kubeapi.Client{Server: server, TokenFile: token, HTTP: hc},
		NodeName: o.nodeName,
		Type:     o.nodeCondition,
		Logger:   log,
	})
	if err != nil {
		return nil, err
	}
	prev := l.onPass
	l.onPass = func(p reconcile.Pass) {
		if s, ok := conditionState(l.passFacts(p, switchWhat)); ok {
			w.Set(s)
		}
		if prev != nil {
			prev(p)
		}
	}
	log.Info("node condition " + o.nodeCondition + ": set on node " + o.nodeName + " after each pass that says something")
	return w, nil
}

// passFacts reads what the condition needs after pass p, on the
// Reconciler's goroutine.
func (l *loop) passFacts(p reconcile.Pass, switchWhat string) passFacts {
	f := passFacts{planned: p.Planned, converged: l.r.Converged(), err: p.Err, cfg: l.cfg, incomplete: l.peersIncomplete(), pathBelow: l.belowMinimum()}
	f.mode, _ = l.effectiveMode()
	f.nodeEnc = l.nodeEnc()
	if l.switchedOff() {
		f.switchWhat = switchWhat
	}
	l.r.Watcher.Read(func(v netwatch.View) {
		_, f.tunnel = v.LinkByName(l.cfg.TunnelLink)
		for _, fam := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
			for r := range v.Rules(fam) {
				f.rule = f.rule || r.Priority == l.cfg.Priority
			}
		}
	})
	return f
}

var (
	descConditionWrites = prometheus.NewDesc("marksplit_node_condition_writes_total",
		"Writes of the Node condition (--node-condition) the API server accepted, by kind: change (a new state), heartbeat (an unchanged state, every 5 min while passes confirm it).", []string{"kind"}, nil)
	descConditionChanges = prometheus.NewDesc("marksplit_node_condition_changes_total",
		"Changes of the Node condition's state; those beyond one per 10 s are coalesced into the next write (the latest state).", nil, nil)
	descConditionFailed = prometheus.NewDesc("marksplit_node_condition_failed_writes_total",
		"Writes of the Node condition that failed, by result: error (no answer, 429, 5xx), refused (4xx: RBAC or the admission policy). Retried with back-off, at most one write per 10 s.", []string{"result"}, nil)
)

// conditionCollector reads the Writer's counters at scrape time; all zero
// without --node-condition.
type conditionCollector struct{ w *nodecondition.Writer }

// addNodeCondition registers the Node condition's metrics, whether or not
// there is one.
func (m *metrics) addNodeCondition(w *nodecondition.Writer) {
	if m != nil {
		m.reg.MustRegister(conditionCollector{w})
	}
}

func (c conditionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descConditionWrites
	ch <- descConditionChanges
	ch <- descConditionFailed
}

func (c conditionCollector) Collect(ch chan<- prometheus.Metric) {
	var st nodecondition.Stats
	if c.w != nil {
		st = c.w.Stats()
	}
	ch <- prometheus.MustNewConstMetric(descConditionWrites, prometheus.CounterValue, float64(st.Written), "change")
	ch <- prometheus.MustNewConstMetric(descConditionWrites, prometheus.CounterValue, float64(st.Heartbeats), "heartbeat")
	ch <- prometheus.MustNewConstMetric(descConditionChanges, prometheus.CounterValue, float64(st.Changes))
	ch <- prometheus.MustNewConstMetric(descConditionFailed, prometheus.CounterValue, float64(st.Failed), "error")
	ch <- prometheus.MustNewConstMetric(descConditionFailed, prometheus.CounterValue, float64(st.Refused), "refused")
}
