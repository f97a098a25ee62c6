//go:build linux

package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/kubewatch"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/prometheus/client_golang/prometheus"
)

// The uninstall switch is a ConfigMap (--uninstall-configmap, in the pod's
// namespace) that the operator creates by hand and that neither deploy/ nor
// the Helm chart ships: while it exists the agent behaves as with
// --encryption=off, whatever the CiliumNodes say, and no re-apply of the
// manifests (kubectl apply, helm upgrade, a GitOps reconcile) can undo it,
// since none of them owns it.

// podNamespaceEnv is the pod's namespace (the downward API's
// metadata.namespace); the service-account directory's namespace file is
// the fallback.
const podNamespaceEnv = "POD_NAMESPACE"

// switchState is what the loop knows of the uninstall switch.
type switchState int32

const (
	switchUnused  switchState = iota // no switch (flag empty, off Kubernetes, --encryption=off)
	switchWaiting                    // not read yet: nothing is planned
	switchAbsent                     // absent, or unreadable at the first read: as before
	switchPresent                    // present: the mode is off
)

func (l *loop) switchState() switchState { return switchState(l.uninstall.Load()) }

// switchedOff reports whether the uninstall switch is present.
func (l *loop) switchedOff() bool { return l.switchState() == switchPresent }

// effectiveMode is the mode the policy plans with: off while the switch is
// present or the agent stands down for node encryption (cilium-config);
// ok is false before the switch has been read, and before node encryption
// has been.
func (l *loop) effectiveMode() (m mtupolicy.Mode, ok bool) {
	switch l.switchState() {
	case switchWaiting:
		return mtupolicy.ModeUnknown, false
	case switchPresent:
		return mtupolicy.ModeOff, true
	}
	switch s := l.nodeEnc().state; {
	case s == nodeEncWaiting || s == nodeEncUnreadable:
		return mtupolicy.ModeUnknown, false
	case s.standsDown():
		return mtupolicy.ModeOff, true
	}
	return l.Mode(), true
}

// uninstallSwitch follows the switch for the loop.
type uninstallSwitch struct {
	w    *kubewatch.Watcher
	what string // namespace/name
	log  *slog.Logger
}

// serviceAccountDir is where the pod's token, CA and namespace are.
func serviceAccountDir() string {
	if dir := os.Getenv(serviceAccountDirEnv); dir != "" {
		return dir
	}
	return defaultServiceAccountDir
}

// newUninstallSwitch returns the switch of o, or nil when there is none:
// the flag is empty, the command does not plan with a mode, the mode is off
// anyway, or the agent does not run in a pod (said in a note by run, which
// logs it once it holds the lock: a second agent says only that).
func newUninstallSwitch(o options, log *slog.Logger, note func(string)) (*uninstallSwitch, error) {
	if o.uninstallConfigMap == "" || !o.usesMode() || o.encryption == encOff {
		return nil, nil
	}
	flag := "--uninstall-configmap=" + o.uninstallConfigMap
	server, err := kubeapi.InClusterServer()
	if err != nil {
		if o.cmd == cmdRun { // once and plan off Kubernetes are tools at hand: no noise
			note("note: " + flag + " ignored: not in a pod (no KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT); --uninstall-configmap= turns this note off")
		}
		return nil, nil
	}
	dir := serviceAccountDir()
	ns := os.Getenv(podNamespaceEnv)
	if ns == "" {
		b, _ := os.ReadFile(filepath.Join(dir, "namespace"))
		ns = strings.TrimSpace(string(b))
	}
	if ns == "" {
		note("note: " + flag + " ignored: the pod's namespace is unknown (no $" + podNamespaceEnv + " and no " + filepath.Join(dir, "namespace") + ")")
		return nil, nil
	}
	if err := kubewatch.ValidName(ns); err != nil {
		return nil, usageErrorf("$%s: %v", podNamespaceEnv, err)
	}
	hc, err := kubeapi.NewHTTPClient(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, usageErrorf("%s reads a ConfigMap from inside a pod: %v (or --uninstall-configmap= to do without the switch)", flag, err)
	}
	w, err := kubewatch.New(kubewatch.Config{
		Client:     kubeapi.Client{Server: server, TokenFile: filepath.Join(dir, "token"), HTTP: hc},
		APIVersion: "v1",
		Kind:       "ConfigMap",
		Collection: "/api/v1/namespaces/" + ns + "/configmaps",
		Name:       o.uninstallConfigMap,
		// The first pass waits for the first read: a hung API server holds it
		// up 10 s at most, then the agent carries on as before.
		RequestTimeout: 10 * time.Second,
		Logger:         log,
	})
	if err != nil {
		return nil, err
	}
	return &uninstallSwitch{w: w, what: ns + "/" + o.uninstallConfigMap, log: log}, nil
}

// run feeds l until ctx ends, calling reported after each report.
func (u *uninstallSwitch) run(ctx context.Context, l *loop, reported func()) {
	u.w.Run(ctx, func(s kubewatch.State) {
		prev := l.switchState()
		next := switchAbsent
		switch s {
		case kubewatch.Present:
			next = switchPresent
			u.log.Info("uninstall switch " + u.what + " present: the split is removed and stays off")
		case kubewatch.Absent:
			if prev == switchPresent {
				u.log.Info("uninstall switch " + u.what + " deleted: the split follows the encryption mode again")
			}
		case kubewatch.Unknown:
			u.log.Warn("uninstall switch " + u.what + " not readable (see the line above): carrying on as if it were absent until it is read")
		}
		l.uninstall.Store(int32(next))
		if next != prev {
			l.r.Trigger()
		}
		reported()
	})
}

var descUninstallSwitch = prometheus.NewDesc("marksplit_uninstall_switch",
	"1 while the uninstall switch (--uninstall-configmap) exists: the split is removed and stays off; 0 while it does not, or could not be read yet. Absent without a switch (flag empty, off Kubernetes, --encryption=off) and before the first read.", nil, nil)

// uninstallCollector reads the loop's switch state at scrape time.
type uninstallCollector struct{ l *loop }

// addUninstall registers the switch's metric when u is not nil.
func (m *metrics) addUninstall(l *loop, u *uninstallSwitch) {
	if m == nil || u == nil {
		return
	}
	m.reg.MustRegister(&uninstallCollector{l: l})
}

func (c *uninstallCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descUninstallSwitch }

func (c *uninstallCollector) Collect(ch chan<- prometheus.Metric) {
	switch c.l.switchState() {
	case switchPresent:
		ch <- prometheus.MustNewConstMetric(descUninstallSwitch, prometheus.GaugeValue, 1)
	case switchAbsent:
		ch <- prometheus.MustNewConstMetric(descUninstallSwitch, prometheus.GaugeValue, 0)
	}
}
