//go:build linux

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// nodeEvent is the part of an events.k8s.io/v1 Event the tests read.
type nodeEvent struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Reason              string `json:"reason"`
	Type                string `json:"type"`
	Note                string `json:"note"`
	Action              string `json:"action"`
	ReportingController string `json:"reportingController"`
	ReportingInstance   string `json:"reportingInstance"`
	EventTime           string `json:"eventTime"`
	Regarding           struct {
		Kind, APIVersion, Name, UID string
	} `json:"regarding"`
	Series *struct {
		Count int `json:"count"`
	} `json:"series"`
}

func (e nodeEvent) count() int {
	if e.Series == nil {
		return 1
	}
	return e.Series.Count
}

const eventsPath = "/apis/events.k8s.io/v1/namespaces/default/events"

// nodeEvents lists the Events about node, as `kubectl get events -n default
// --field-selector regarding.name=NODE` does.
func (k *kube) nodeEvents(ctx context.Context, node string) ([]nodeEvent, error) {
	b, err := k.must(ctx, 200, "GET", eventsPath+"?fieldSelector="+url.QueryEscape("regarding.name="+node), nil)
	if err != nil {
		return nil, err
	}
	var list struct{ Items []nodeEvent }
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("events of %s: %w", node, err)
	}
	return list.Items, nil
}

// byReason returns the Events of evs with reason.
func byReason(evs []nodeEvent, reason string) []nodeEvent {
	var out []nodeEvent
	for _, e := range evs {
		if e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// eventWith is nil once node has exactly one Event with reason, of count at
// least n.
func (k *kube) eventWith(ctx context.Context, node, reason string, n int) error {
	evs, err := k.nodeEvents(ctx, node)
	if err != nil {
		return err
	}
	got := byReason(evs, reason)
	switch {
	case len(got) == 0:
		return fmt.Errorf("no %s Event about %s", reason, node)
	case len(got) > 1:
		return stopPolling(fmt.Errorf("%d %s Events about %s, want one with a series: %+v", len(got), reason, node, got))
	case got[0].count() < n:
		return fmt.Errorf("%s Event about %s: count %d, want %d", reason, node, got[0].count(), n)
	}
	return nil
}

// eventWrites returns the agent's writes of Events (audit events of
// create and patch on events), from request from on.
func eventWrites(evs []auditEvent, from int) []auditEvent {
	var out []auditEvent
	seen := map[string]bool{}
	for _, e := range evs[min(from, len(evs)):] {
		if e.ObjectRef == nil || e.ObjectRef.Resource != "events" || seen[e.AuditID] {
			continue
		}
		seen[e.AuditID] = true
		out = append(out, e)
	}
	return out
}

// fight deletes the rule at 900 n times, each after the agent put it back:
// a fight (three undos in a row) by ip.
func (n *node) fight(t *testing.T, a *agent, undos int) {
	t.Helper()
	for i := range undos {
		if _, err := ipOut(n.ns, "rule", "del", "pref", "900"); err != nil {
			t.Fatal(err)
		}
		eventually(t, repairDeadline, fmt.Sprintf("undo %d repaired", i+1), func() error {
			return firstErr(a.alive(), n.splitOn())
		})
	}
}

// A fight and an opt-out are Events on the Node, as kubectl shows them; a
// repeated fight is one Event whose series counts the fights.
func TestKernelK8sEventsOnNode(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 5*time.Minute)
	n, name, a := c.encrypting(t, ctx)
	eventually(t, watchDeadline, "a SplitInstalled Event", func() error {
		return c.admin.eventWith(ctx, name, "SplitInstalled", 1)
	})

	n.fight(t, a, 4)
	eventually(t, watchDeadline, "a SplitFight Event", func() error {
		return c.admin.eventWith(ctx, name, "SplitFight", 1)
	})
	eventually(t, 30*time.Second, "the fight over", func() error { return a.logged("fight over:") })
	n.fight(t, a, 4)
	eventually(t, watchDeadline, "a second fight", func() error {
		if c := strings.Count(a.output(), "fight: rule 900"); c < 2 {
			return fmt.Errorf("%d fight warnings", c)
		}
		return nil
	})
	// The series is written at most every 30 s.
	eventually(t, 45*time.Second, "the SplitFight Event's series counts 2", func() error {
		return c.admin.eventWith(ctx, name, "SplitFight", 2)
	})

	if err := c.admin.setEncryptionKey(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, watchDeadline, "opted out: EncryptionModeChanged and SplitRemoved Events", func() error {
		return firstErr(a.alive(), n.splitOff(),
			c.admin.eventWith(ctx, name, "EncryptionModeChanged", 1),
			c.admin.eventWith(ctx, name, "SplitRemoved", 1))
	})

	evs, err := c.admin.nodeEvents(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		t.Logf("Event %s: %s %s (%s) x%d: %s", e.Metadata.Name, e.Type, e.Reason, e.Action, e.count(), e.Note)
		if e.Regarding.Kind != "Node" || e.Regarding.APIVersion != "v1" || e.Regarding.Name != name || e.Regarding.UID != name ||
			e.ReportingController != "marksplit.io/agent" || e.ReportingInstance != name || e.EventTime == "" {
			t.Errorf("Event %+v: want regarding Node %s (uid the name), reported by marksplit.io/agent on %s, with an eventTime", e, name, name)
		}
	}
	if f := byReason(evs, "SplitFight"); len(f) != 1 || f[0].Type != "Warning" || !strings.Contains(f[0].Note, "rule 900: not fwmark 0xe00/0xf00 lookup 900 is undone again and again (first by ") {
		t.Errorf("SplitFight Events %+v", f)
	}
	if m := byReason(evs, "EncryptionModeChanged"); len(m) != 1 || m[0].Note != "node encryption: off (was on)" {
		t.Errorf("EncryptionModeChanged Events %+v", m)
	}

	// kubectl describe node lists the core/v1 Events whose involvedObject is
	// the Node, by its uid or (as here) its name.
	sel := url.QueryEscape("involvedObject.kind=Node,involvedObject.name=" + name + ",involvedObject.uid=" + name + ",involvedObject.namespace=")
	b, err := c.admin.must(ctx, 200, "GET", "/api/v1/events?fieldSelector="+sel, nil)
	if err != nil {
		t.Fatal(err)
	}
	var core struct {
		Items []struct {
			Reason string `json:"reason"`
		} `json:"items"`
	}
	if err := json.Unmarshal(b, &core); err != nil {
		t.Fatal(err)
	}
	if len(core.Items) != len(evs) {
		t.Errorf("kubectl describe node's query finds %d Events, want the %d about the node: %s", len(core.Items), len(evs), b)
	}
}

// A program undoing the rule and the table's route as fast as it can makes
// the agent repair about a thousand times a minute: one Event, a handful of
// writes at most.
func TestKernelK8sEventsRateLimited(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 5*time.Minute)
	n, name, a := c.encrypting(t, ctx)
	eventually(t, watchDeadline, "a SplitInstalled Event", func() error {
		return c.admin.eventWith(ctx, name, "SplitInstalled", 1)
	})
	from := len(a.requests(t))
	repairsBefore := repairs(a.output())

	// One ip process, fed a deletion of the rule and a flush of the table
	// every 10 ms for a minute.
	cmd := exec.Command("ip", "-n", n.ns, "-force", "-batch", "-")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	for time.Since(start) < time.Minute {
		if _, err := io.WriteString(in, "rule del pref 900\nroute flush table 900\n"); err != nil {
			t.Fatal(err)
		}
		<-tick.C
	}
	tick.Stop()
	in.Close()
	cmd.Wait()
	took := time.Since(start)
	eventually(t, repairDeadline, "the split back after the fight", func() error {
		return firstErr(a.alive(), n.splitOn())
	})
	got := repairs(a.output()) - repairsBefore
	eventually(t, watchDeadline, "one SplitFight Event", func() error {
		return c.admin.eventWith(ctx, name, "SplitFight", 1)
	})
	writes := eventWrites(a.requests(t), from)
	t.Logf("%d repairs in %s: %d writes of Events: %v", got, took.Round(time.Millisecond), len(writes), writes)
	if got < 600 {
		t.Errorf("%d repairs in %s: the fight was too slow to prove anything", got, took)
	}
	if len(writes) > 5 {
		t.Errorf("%d writes of Events for %d repairs, want at most 5", len(writes), got)
	}
	for _, w := range writes {
		if w.ResponseStatus == nil || w.ResponseStatus.Code/100 != 2 {
			t.Errorf("write of an Event: %v", w)
		}
	}
}

// repairs counts the agent's log lines of the rule and the table's route
// being put back.
func repairs(out string) int {
	n := strings.Count(out, `msg="rule 900: not fwmark`) + strings.Count(out, `msg="table 900: `)
	// While a fight lasts, the agent sums its repairs up in one line every
	// 5 s instead of a line each: "fight: 204 repairs in 5s of 3 objects …".
	for _, m := range fightSummaryRE.FindAllStringSubmatch(out, -1) {
		k, _ := strconv.Atoi(m[1])
		n += k
	}
	return n
}

var fightSummaryRE = regexp.MustCompile(`msg="fight: (\d+) repairs in `)
