//go:build linux

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/kubeevents"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	"github.com/prometheus/client_golang/prometheus"
)

// The Events the agent records on its Node (docs/operations.md, "Events").
const (
	reasonFight       = "SplitFight"
	reasonPassFailing = "PassFailing"
	reasonModeChanged = "EncryptionModeChanged"
	reasonTunnelGone  = "TunnelLinkMissing"
	reasonInstalled   = "SplitInstalled"
	reasonRemoved     = "SplitRemoved"
	reasonStandDown   = "NodeEncryptionOff"
	reasonSteppedBack = "RepairSteppedBack"
	reasonResume      = "NodeEncryptionOn"
)

// A pass that keeps failing is an Event once failFor has passed since the
// first failure of the streak, or after failPasses failures in a row (with
// the retries' back-off, about 8 s), and again every failEvery while it
// goes on (joining the Event's series).
const (
	failPasses = 10
	failFor    = time.Minute
	failEvery  = time.Minute
)

// nodeEvents turns what the loop sees into Events on the Node. Its methods
// are safe on a nil *nodeEvents (no Events) and never block: the Recorder
// only counts in memory. fight and pass run on the Reconciler's goroutine,
// policy inside its pass; setMode runs on a source's goroutine.
type nodeEvents struct {
	rec *kubeevents.Recorder
	cfg mtupolicy.Config
	// recordGroup is rec.RecordGroup (a test's capture).
	recordGroup func(group, typ, reason, action, note string)
	// uninstall names the uninstall switch and reports whether it is
	// present; nil without a switch.
	uninstall func() (what string, present bool)
	// standingDown says why the agent stands down for node encryption, ""
	// when it does not; nil without --encryption=auto.
	standingDown func() string

	// Set by policy, read by pass.
	haveRule   atomic.Bool // the kernel has a rule at the priority
	tunnelGone atomic.Bool // the node encrypts and the tunnel link does not exist

	// The Reconciler's goroutine only.
	hadRule   int8 // the last converged pass's rule: -1 not known yet, 0 none, 1 the rule
	wasGone   bool
	failures  int
	failSince time.Time
	failLast  time.Time // when the streak was last recorded
}

// newNodeEvents returns the Events of `marksplit run`, or nil with a line
// saying why there are none: --events=false, or no in-cluster API access
// (then the agent runs as before).
func newNodeEvents(o options, log *slog.Logger) *nodeEvents {
	if o.noEvents {
		log.Info("events: off (--events=false): no Kubernetes Events on the Node")
		return nil
	}
	rec, err := newRecorder(o, log)
	if err != nil {
		log.Info("events: off: " + err.Error() + ": no Kubernetes Events on the Node; the agent works without them")
		return nil
	}
	return &nodeEvents{rec: rec, recordGroup: rec.RecordGroup, cfg: o.policy, hadRule: -1}
}

func newRecorder(o options, log *slog.Logger) (*kubeevents.Recorder, error) {
	if o.nodeName == "" {
		return nil, errors.New("no Node to record Kubernetes Events on (--node-name or $NODE_NAME)")
	}
	server, err := kubeapi.InClusterServer()
	if err != nil {
		return nil, err
	}
	dir := os.Getenv(serviceAccountDirEnv)
	if dir == "" {
		dir = defaultServiceAccountDir
	}
	token := filepath.Join(dir, "token")
	if _, err := os.Stat(token); err != nil {
		return nil, fmt.Errorf("no service-account token: %w", err)
	}
	hc, err := kubeapi.NewHTTPClient(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("no cluster CA: %w", err)
	}
	return kubeevents.New(kubeevents.Config{
		Client:   &kubeapi.Client{Server: server, TokenFile: token, HTTP: hc},
		NodeName: o.nodeName,
		Logger:   log,
	})
}

// policy notes what the view says about the split: whether the kernel has
// the rule (after a pass that converged, with nothing to do, the view is the
// desired state), and whether the tunnel link is missing while the node
// encrypts.
func (e *nodeEvents) policy(v netwatch.View, mode mtupolicy.Mode, ok bool) {
	if e == nil || !ok {
		return
	}
	have := false
	for _, f := range []netwatch.Family{netwatch.IPv4, netwatch.IPv6} {
		for r := range v.Rules(f) {
			have = have || r.Priority == e.cfg.Priority
		}
	}
	e.haveRule.Store(have)
	_, tunnel := v.LinkByName(e.cfg.TunnelLink)
	e.tunnelGone.Store(mode == mtupolicy.ModeOn && !tunnel)
}

// fight records the start of a fight; its end is in the log. The fights
// over one object are one Event, whoever the program: a script that runs
// `ip rule del` again and again is a new process each time, often gone
// before /proc could name it. The note names the first.
func (e *nodeEvents) fight(f reconcile.Fight) {
	if e == nil || f.Over {
		return
	}
	e.recordGroup(f.Object, kubeevents.Warning, reasonFight, "Repair",
		fmt.Sprintf("%s is undone again and again (first by %s); the agent repairs it, rate-limited; its log names each program", f.Line, f.By))
}

// setMode records a change of the encryption mode between on and off (not
// the first mode the agent learns).
func (e *nodeEvents) setMode(prev, m mtupolicy.Mode) {
	if e == nil || prev == mtupolicy.ModeUnknown || prev == m {
		return
	}
	e.record(kubeevents.Normal, reasonModeChanged, "ReadCiliumNode", fmt.Sprintf("node encryption: %s (was %s)", m, prev))
}

// stepBack records a repaired route given up: another program re-asserts
// it. One Event per route.
func (e *nodeEvents) stepBack(f reconcile.Fight) {
	if e == nil {
		return
	}
	e.recordGroup(f.Object, kubeevents.Warning, reasonSteppedBack, "StepBack",
		fmt.Sprintf("%s is undone %d times in %s by %s, which re-asserts it: the agent stepped back and no longer repairs it", f.Line, f.Undos, f.Since.Round(100*time.Millisecond), f.By))
}

// standDown records the start of a stand-down for node encryption: one
// Event, whose note says why.
func (e *nodeEvents) standDown(why string) {
	if e == nil {
		return
	}
	e.record(kubeevents.Warning, reasonStandDown, "StandDown",
		why+": the agent stands down: it removes the split, repairs nothing and leaves the main table alone")
}

// resume records the end of a stand-down.
func (e *nodeEvents) resume(why string) {
	if e == nil {
		return
	}
	e.record(kubeevents.Normal, reasonResume, "Resume", why+": the agent resumes: the split follows the node's CiliumNode again")
}

// pass records a streak of failed passes, the tunnel link going missing
// while the node encrypts, and the split coming and going.
func (e *nodeEvents) pass(p reconcile.Pass, converged bool, mode mtupolicy.Mode, now time.Time) {
	if e == nil || !p.Planned {
		return
	}
	if p.Err != nil {
		e.failed(p.Err, now)
	} else {
		e.failures, e.failLast = 0, time.Time{}
	}
	gone := e.tunnelGone.Load()
	if gone && !e.wasGone {
		e.record(kubeevents.Warning, reasonTunnelGone, "Split",
			fmt.Sprintf("tunnel link %s does not exist while the node encrypts: nothing is split", e.cfg.TunnelLink))
	}
	e.wasGone = gone
	have := int8(0)
	if e.haveRule.Load() {
		have = 1
	}
	if e.hadRule < 0 {
		e.hadRule = have // before the first pass changed anything
	}
	if !converged {
		return
	}
	switch {
	case have == 1 && e.hadRule == 0:
		e.installed()
	case have == 0 && e.hadRule == 1:
		e.removed(mode, gone)
	}
	e.hadRule = have
}

// record records an Event whose note is all of its identity.
func (e *nodeEvents) record(typ, reason, action, note string) {
	e.recordGroup(note, typ, reason, action, note)
}

func (e *nodeEvents) failed(err error, now time.Time) {
	e.failures++
	if e.failures == 1 {
		e.failSince = now
	}
	if e.failures < failPasses && now.Sub(e.failSince) < failFor || !e.failLast.IsZero() && now.Sub(e.failLast) < failEvery {
		return
	}
	e.failLast = now
	e.record(kubeevents.Warning, reasonPassFailing, "Reconcile",
		"reconcile passes keep failing (the split may be incomplete; see the agent's log): "+err.Error())
}

func (e *nodeEvents) installed() {
	c := e.cfg
	e.record(kubeevents.Normal, reasonInstalled, "Install",
		fmt.Sprintf("split installed: rule %d (not fwmark %v/%v lookup %d): host traffic to the split destinations takes table %d at %s's MTU",
			c.Priority, c.Mark, c.Mask, c.Table, c.Table, c.TunnelLink))
}

func (e *nodeEvents) removed(mode mtupolicy.Mode, gone bool) {
	why := "nothing is left to split"
	what, switchedOff := "", false
	if e.uninstall != nil {
		what, switchedOff = e.uninstall()
	}
	standDown := ""
	if e.standingDown != nil {
		standDown = e.standingDown()
	}
	switch {
	case switchedOff:
		why = "uninstall switch " + what + " present"
	case standDown != "":
		return // the stand-down's own Event (NodeEncryptionOff) says it: one Event
	case mode == mtupolicy.ModeOff:
		why = "the node does not encrypt"
	case gone:
		why = "tunnel link " + e.cfg.TunnelLink + " does not exist"
	}
	e.record(kubeevents.Normal, reasonRemoved, "Remove",
		fmt.Sprintf("split removed: rule %d and table %d's routes are gone (%s)", e.cfg.Priority, e.cfg.Table, why))
}

var (
	descEventsWritten = prometheus.NewDesc("marksplit_node_events_written_total",
		"Kubernetes Events about the Node written to the API server, by kind: create (a new Event), series (a repeat's count, by merge PATCH).", []string{"kind"}, nil)
	descEventsFailed = prometheus.NewDesc("marksplit_node_events_failed_requests_total",
		"Requests for Kubernetes Events that got no answer, 429 or 5xx; the Events wait and are retried with back-off.", nil, nil)
	descEventsDropped = prometheus.NewDesc("marksplit_node_events_dropped_total",
		"Kubernetes Events dropped: refused by the API server (4xx: the log says why, once), beyond the 64 held while it is unreachable, or unwritten for an hour.", nil, nil)
)

// eventsCollector reads the Recorder's counters at scrape time; all zero
// without Events.
type eventsCollector struct{ e *nodeEvents }

// addEvents registers the Events' metrics, whether or not there are Events.
func (m *metrics) addEvents(e *nodeEvents) {
	if m != nil {
		m.reg.MustRegister(eventsCollector{e})
	}
}

func (c eventsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descEventsWritten
	ch <- descEventsFailed
	ch <- descEventsDropped
}

func (c eventsCollector) Collect(ch chan<- prometheus.Metric) {
	var st kubeevents.Stats
	if c.e != nil {
		st = c.e.rec.Stats()
	}
	ch <- prometheus.MustNewConstMetric(descEventsWritten, prometheus.CounterValue, float64(st.Created), "create")
	ch <- prometheus.MustNewConstMetric(descEventsWritten, prometheus.CounterValue, float64(st.Patched), "series")
	ch <- prometheus.MustNewConstMetric(descEventsFailed, prometheus.CounterValue, float64(st.Failed))
	ch <- prometheus.MustNewConstMetric(descEventsDropped, prometheus.CounterValue, float64(st.Dropped))
}
