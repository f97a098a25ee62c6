package deploy

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The chart's extraArgs against the agent itself (issue 38, H-X): every
// extraArg the chart renders is one the agent takes and then runs with, so no
// render makes every node exit at once or crash-loop. The agent is built from
// this checkout and asked: `marksplit help` for its flags, `marksplit plan`
// for its parsing of a command line.

// neverExtra are the agent's flags that neither a value of the chart sets
// nor extraArgs may, and why. A flag the agent gains must be put here, in
// marksplit.valueFlags or in marksplit.extraFlags (TestChartExtraArgsCoverAgent).
var neverExtra = map[string]string{
	"--version": "prints the version and exits 0: every pod would end at once, for ever",
	"--peer":    "verify's alone: run refuses it",
	"--json":    "verify's alone: run refuses it",
	"--ready":   "health's alone: run refuses it",
	"--netns":   "run works in the namespace it runs in and refuses it: every pod would exit 2",
	"--resync":  "the safety resync's period is the agent's own (5 minutes): a shorter one costs every node a full re-read of its tables",
	// The exec probes ask the default path; another one fails them all.
	"--health-socket": "moves the health socket away from where the probes ask: every pod would be killed",
	// The chart runs --peers=auto, which the mesh mode refuses beside it.
	"--wireguard-link": "the mesh mode goes alone, and the chart always sets --peers: every pod would exit 2",
	"--wireguard-poll": "only with --wireguard-link, which the chart cannot run",
	// Every agent probes every other one on this port.
	"--path-mtu-probe-port": "the responder's port must be the same on every node: one pod alone would probe a port nobody answers",
}

var agentBin struct {
	once sync.Once
	path string
	err  error
}

// agentBinary builds the agent of this checkout once and returns its path.
func agentBinary(t *testing.T) string {
	t.Helper()
	agentBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "marksplit-deploy-")
		if err != nil {
			agentBin.err = err
			return
		}
		agentBin.path = filepath.Join(dir, "marksplit")
		cmd := exec.Command("go", "build", "-o", agentBin.path, "./agent")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			agentBin.err = errors.New("go build ./agent: " + err.Error() + ": " + string(out))
		}
	})
	if agentBin.err != nil {
		t.Fatal(agentBin.err)
	}
	return agentBin.path
}

// agentHelpFlags returns the flags `marksplit help` lists, as --name.
func agentHelpFlags(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command(agentBinary(t), "help").Output()
	if err != nil {
		t.Fatalf("marksplit help: %v", err)
	}
	var flags []string
	for _, m := range regexp.MustCompile(`(?m)^  --?([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, "--"+m[1])
	}
	if len(flags) < 20 {
		t.Fatalf("marksplit help lists %d flags, want every flag: %v\n%s", len(flags), flags, out)
	}
	return flags
}

// chartFlagList returns the flags of the template define called name in
// _helpers.tpl: valueFlags (a line of flags) or extraFlags (YAML keys).
func chartFlagList(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(b), `{{- define "marksplit.`+name+`" -}}`)
	body, _, ok2 := strings.Cut(body, "{{- end }}")
	if !ok || !ok2 {
		t.Fatalf("_helpers.tpl: no define marksplit.%s", name)
	}
	re := regexp.MustCompile(`(?:^|\s)(--[a-z][a-z0-9-]*)`)
	if name == "extraFlags" {
		re = regexp.MustCompile(`(?m)^"(--[a-z][a-z0-9-]*)":`)
	}
	var flags []string
	for _, m := range re.FindAllStringSubmatch(body, -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// agentRuns reports whether the agent takes args after the chart's policy
// and goes on to run: `marksplit plan` (run's checks, without the API with
// --encryption=off and --prefix; it changes nothing) exits 0 without
// printing its version or its usage. It says what it printed otherwise.
func agentRuns(t *testing.T, extra ...string) (bool, string) {
	t.Helper()
	cmd := exec.Command(agentBinary(t), append([]string{"plan", "--prefix=192.0.2.0/24", "--encryption=off", "--metrics-addr="}, extra...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	said := strings.TrimSpace(stdout.String() + stderr.String())
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return false, said
	case err != nil:
		t.Fatalf("marksplit plan %q: %v", extra, err)
	case strings.HasPrefix(stdout.String(), "marksplit ") || strings.Contains(said, "usage: marksplit"):
		return false, "exit 0 at once: " + said
	}
	return true, said
}

// TestChartExtraArgsCoverAgent: each flag of `marksplit help` is a value's
// (refused in extraArgs as such), one that extraArgs may set, or one that
// they may never set (neverExtra, refused too); and each flag the chart
// lets through is the agent's. So an agent that gains or loses a flag fails
// here until the chart says what it does with it.
func TestChartExtraArgsCoverAgent(t *testing.T) {
	agent := agentHelpFlags(t)
	values, extra := chartFlagList(t, "valueFlags"), chartFlagList(t, "extraFlags")
	if len(values) < 18 || len(extra) == 0 {
		t.Fatalf("_helpers.tpl: valueFlags %v, extraFlags %v: the lists did not parse", values, extra)
	}
	for _, f := range agent {
		in := 0
		for _, l := range [][]string{values, extra} {
			if slices.Contains(l, f) {
				in++
			}
		}
		if _, ok := neverExtra[f]; ok {
			in++
		}
		if in != 1 {
			t.Errorf("agent flag %s is in %d of marksplit.valueFlags, marksplit.extraFlags and this test's neverExtra, want exactly one", f, in)
		}
		if _, ok := neverExtra[f]; ok {
			for _, a := range []string{f, f + "=x", f + "=true"} {
				if _, err := renderChart(t, map[string]any{"extraArgs": []any{a}}); err == nil {
					t.Errorf("extraArgs [%s] rendered: %s %s", a, f, neverExtra[f])
				}
			}
		}
	}
	for _, l := range []struct {
		name  string
		flags []string
	}{{"valueFlags", values}, {"extraFlags", extra}, {"neverExtra", slices.Collect(func(yield func(string) bool) {
		for f := range neverExtra {
			if !yield(f) {
				return
			}
		}
	})}} {
		for _, f := range l.flags {
			if !slices.Contains(agent, f) {
				t.Errorf("%s names %s, which marksplit help does not list", l.name, f)
			}
		}
	}
}

// stricter are the extraArgs the chart refuses although `marksplit plan`
// takes them, and why: the plan runs without the pod's policy.
var stricter = map[string]string{
	"--node-name=": "blanks $NODE_NAME, which the chart's --peers=auto and --encryption=auto need: the agent exits 2",
}

// TestChartExtraArgsAgentAccepts: an extraArg the chart renders is one the
// agent takes and runs with; for the flags extraArgs may set, the chart
// takes a value exactly when the agent does. The red team's three (issue
// 38: ---table=254, --verbose, --version rendered, and the agent exited 2, 2
// or 0 on every node) are refused.
func TestChartExtraArgsAgentAccepts(t *testing.T) {
	extra := chartFlagList(t, "extraFlags")
	cands := []string{
		"---table=254", "--verbose", "--version", "--help", "-h", "--", "-node-name=n1", "--node-name",
		"--node-name=n1", "--node-name=", "--node-name=N1", "--node-name=a..b", "--node-name=a.b-c", "--node-name=-a",
		"--node-name=a-", "--node-name=a b", "--node-name=n1=x", "--node-name=é", "--node-name=n1\n",
		"--node-name=" + strings.Repeat("a", 63) + "." + strings.Repeat("b", 189), // 253
		"--node-name=" + strings.Repeat("a", 63) + "." + strings.Repeat("b", 190), // 254
	}
	for _, f := range agentHelpFlags(t) {
		cands = append(cands, f, f+"=", f+"=x", f+"=n1", f+"=true", f+"=0")
	}
	accepted := 0
	for _, a := range cands {
		_, err := renderChart(t, map[string]any{"extraArgs": []any{a}})
		chartOK := err == nil
		flag, _, _ := strings.Cut(a, "=")
		if !chartOK && !slices.Contains(extra, flag) {
			continue // refused by the chart: nothing for the agent to do
		}
		agentOK, said := agentRuns(t, a)
		switch {
		case chartOK && !agentOK:
			t.Errorf("extraArgs [%q] renders, but the agent does not run with it: %s", a, said)
		case !chartOK && agentOK && stricter[a] == "":
			t.Errorf("extraArgs [%q]: the chart refuses it (%v), the agent takes it", a, err)
		case chartOK:
			accepted++
		}
	}
	if accepted < 3 {
		t.Errorf("the chart took %d of the candidates, want at least --node-name=n1, a.b-c and 253 bytes", accepted)
	}
	for _, a := range []string{"---table=254", "--verbose", "--version"} {
		if _, err := renderChart(t, map[string]any{"extraArgs": []any{a}}); err == nil {
			t.Errorf("extraArgs [%s] rendered", a)
		} else {
			t.Logf("extraArgs [%s]: %v", a, err)
		}
	}
}
