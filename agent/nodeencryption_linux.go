//go:build linux

package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/kubewatch"
	"github.com/prometheus/client_golang/prometheus"
)

// Node encryption is Cilium's encrypt-node in its cilium-config ConfigMap
// (--cilium-namespace, --cilium-configmap). A non-zero encryption key on the
// CiliumNode does not say it: Cilium's WireGuard agent publishes one on every
// WireGuard node, node encryption or not, and zero only on a node that opts
// out while node encryption is on (docs/design.md, "Encryption mode"). With
// --encryption=auto the node encrypts its host traffic when encrypt-node is
// true AND its key is non-zero; when encrypt-node is false, missing, not a
// boolean, or cilium-config does not exist, the agent stands down: it
// removes what it owns, repairs nothing and says why (docs/operations.md,
// "Cilium 1.22 and node encryption's removal").

// nodeEncryption follows cilium-config's encrypt-node for the loop.
type nodeEncryption struct {
	w    *kubewatch.Watcher
	what string // namespace/name
	log  *slog.Logger
}

// newNodeEncryption returns the follower of cilium-config with
// --encryption=auto for a command that plans with a mode, else nil.
func newNodeEncryption(o options, log *slog.Logger) (*nodeEncryption, error) {
	if !o.usesMode() || o.encryption != encAuto {
		return nil, nil
	}
	server, err := kubeapi.InClusterServer()
	if err != nil {
		return nil, usageErrorf("--encryption=auto reads %s/%s from inside a pod: %v (or use --encryption=on or off)", o.ciliumNamespace, o.ciliumConfigMap, err)
	}
	dir := serviceAccountDir()
	hc, err := kubeapi.NewHTTPClient(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, usageErrorf("--encryption=auto reads %s/%s from inside a pod: %v (or use --encryption=on or off)", o.ciliumNamespace, o.ciliumConfigMap, err)
	}
	w, err := kubewatch.New(kubewatch.Config{
		Client:     kubeapi.Client{Server: server, TokenFile: filepath.Join(dir, "token"), HTTP: hc},
		APIVersion: "v1",
		Kind:       "ConfigMap",
		Collection: "/api/v1/namespaces/" + o.ciliumNamespace + "/configmaps",
		Name:       o.ciliumConfigMap,
		Key:        encryptNodeKey,
		// The first pass waits for the first read: a hung API server holds
		// it up 10 s at most, then the condition says so.
		RequestTimeout: 10 * time.Second,
		Logger:         log,
	})
	if err != nil {
		return nil, err
	}
	return &nodeEncryption{w: w, what: o.ciliumNamespace + "/" + o.ciliumConfigMap, log: log}, nil
}

// run feeds l until ctx ends, calling reported after each report. A failed
// read after a good one reports nothing (kubewatch keeps the last reading):
// the last state stands.
func (n *nodeEncryption) run(ctx context.Context, l *loop, reported func()) {
	_ = n.w.RunKey(ctx, func(r kubewatch.Reading) {
		l.setNodeEncryption(judge(r, n.what))
		reported()
	})
}

// nodeEnc returns what the loop knows of node encryption.
func (l *loop) nodeEnc() nodeEncFacts {
	if f := l.nodeEncryption.Load(); f != nil {
		return *f
	}
	return nodeEncFacts{}
}

// standingDown says why the agent stands down for node encryption, or ""
// when it does not.
func (l *loop) standingDown() string {
	if f := l.nodeEnc(); f.state.standsDown() {
		return f.why
	}
	return ""
}

// setNodeEncryption records what cilium-config says and, when the stand-down
// begins or ends, logs it, records one Event and asks for a pass.
func (l *loop) setNodeEncryption(next nodeEncFacts) {
	prev := l.nodeEncryption.Swap(&next)
	if prev != nil && *prev == next {
		return
	}
	was := nodeEncWaiting
	if prev != nil {
		was = prev.state
	}
	switch {
	case next.state == nodeEncUnreadable:
		l.log.Warn("node encryption: " + next.why)
	case next.state.standsDown() && !was.standsDown():
		l.log.Warn("node encryption: " + next.why + "; standing down: the split is removed, nothing is repaired, the main table is left alone")
		l.ev.standDown(next.why)
	case next.state.standsDown():
		l.log.Warn("node encryption: " + next.why + "; still standing down")
	case was.standsDown():
		l.log.Info("node encryption: " + next.why + "; resuming: the split follows the node's CiliumNode again")
		l.ev.resume(next.why)
	default:
		l.log.Info("node encryption: " + next.why)
	}
	l.r.Trigger()
}

// nodeEncKnown reports whether the mode can be planned with as far as node
// encryption goes: read, or not followed.
func (l *loop) nodeEncKnown() bool {
	s := l.nodeEnc().state
	return s != nodeEncWaiting && s != nodeEncUnreadable
}

var descNodeEncryption = prometheus.NewDesc("marksplit_node_encryption",
	"Cilium's node encryption as --encryption=auto reads it from cilium-config's encrypt-node: 1 for the current state (on; off, key_missing, configmap_missing, invalid: the agent stands down; unknown: not read yet), 0 for the others. Absent without --encryption=auto.",
	[]string{"state"}, nil)

// nodeEncCollector reads the loop's node-encryption state at scrape time.
type nodeEncCollector struct{ l *loop }

// addNodeEncryption registers the node-encryption metric when n is not nil.
func (m *metrics) addNodeEncryption(l *loop, n *nodeEncryption) {
	if m == nil || n == nil {
		return
	}
	m.reg.MustRegister(&nodeEncCollector{l: l})
}

func (c *nodeEncCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descNodeEncryption }

func (c *nodeEncCollector) Collect(ch chan<- prometheus.Metric) {
	cur := nodeEncLabels[c.l.nodeEnc().state]
	if cur == "" {
		cur = "unknown"
	}
	for _, label := range []string{"on", "off", "key_missing", "configmap_missing", "invalid", "unknown"} {
		ch <- prometheus.MustNewConstMetric(descNodeEncryption, prometheus.GaugeValue, bool01(label == cur), label)
	}
}
