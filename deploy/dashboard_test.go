package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The Grafana dashboard of the monitoring component (monitoring/dashboard.json): every
// query is parsed by Prometheus's own parser (promtool check rules, each query a
// recording rule) and names only metrics the agent exports, as listed by
// ../agent/testdata/metrics.txt (kept equal to the agent's registry by the agent's
// TestMetricsGolden).

// agentMetricsFile lists the metric names the agent's /metrics shows, one a line.
var agentMetricsFile = filepath.Join("..", "agent", "testdata", "metrics.txt")

// loadAgentMetrics reads agentMetricsFile into a set.
func loadAgentMetrics(t *testing.T) map[string]bool {
	t.Helper()
	f, err := os.Open(agentMetricsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if n := strings.TrimSpace(sc.Text()); n != "" {
			names[n] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !names["marksplit_ready"] {
		t.Fatalf("%s does not name marksplit_ready: not the agent's list?", agentMetricsFile)
	}
	return names
}

// dashboard is what the tests read of a Grafana dashboard.
type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Datasource *datasourceRef  `json:"datasource"`
			AllValue   string          `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description"`
	Datasource  *datasourceRef `json:"datasource"`
	GridPos     struct{ H, W, X, Y int }
	Targets     []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// dashboardConfigMap is the ConfigMap the monitoring component generates from
// dashboard.json, for Grafana's dashboard sidecar (it loads every ConfigMap labelled
// grafana_dashboard: "1").
const dashboardConfigMap = "marksplit-dashboard"

// checkDashboardConfigMap checks the ConfigMap the component rendered: in kube-system,
// without a hash suffix, labelled for the sidecar, holding dashboard.json unchanged.
func checkDashboardConfigMap(t *testing.T, cm *corev1.ConfigMap) {
	t.Helper()
	if cm == nil {
		t.Fatalf("no ConfigMap %s rendered", dashboardConfigMap)
	}
	if cm.Namespace != namespace || cm.Labels["grafana_dashboard"] != "1" || cm.Labels[appLabel] != name {
		t.Errorf("ConfigMap %s/%s labels %v: want %s, grafana_dashboard=1, %s=%s", cm.Namespace, cm.Name, cm.Labels, namespace, appLabel, name)
	}
	want, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"marksplit.json": string(want)}, cm.Data); diff != "" {
		t.Errorf("ConfigMap %s data (-dashboard.json +rendered):\n%s", dashboardConfigMap, diff)
	}
}

// dashboardDS is how every panel and query names the data source: the template variable.
var dashboardDS = datasourceRef{Type: "prometheus", UID: "${datasource}"}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// allPanels returns the dashboard's panels, those in collapsed rows included.
func (d dashboard) allPanels() []panel {
	var ps []panel
	for _, p := range d.Panels {
		ps = append(ps, p)
		ps = append(ps, p.Panels...)
	}
	return ps
}

// dashboardQuery is one panel target's expression.
type dashboardQuery struct {
	where string // panel title and refId, for messages
	expr  string
}

func (d dashboard) queries() []dashboardQuery {
	var qs []dashboardQuery
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			qs = append(qs, dashboardQuery{where: fmt.Sprintf("panel %d %q, query %s", p.ID, p.Title, tg.RefID), expr: tg.Expr})
		}
	}
	return qs
}

// grafanaVars are values for the variables the queries may use, as Grafana substitutes
// them: $node in a regex matcher (multi-value with "All" → the allValue .+), and
// Grafana's interval variables.
var grafanaVars = map[string]string{
	"node":            ".+",
	"__rate_interval": "1m",
	"__interval":      "1m",
	"__range":         "1h",
}

var grafanaVarRE = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)`)

// expandVars replaces the Grafana variables in expr; it fails on one it does not know.
func expandVars(expr string) (string, error) {
	var unknown []string
	out := grafanaVarRE.ReplaceAllStringFunc(expr, func(m string) string {
		sub := grafanaVarRE.FindStringSubmatch(m)
		name := sub[1] + sub[2]
		v, ok := grafanaVars[name]
		if !ok {
			unknown = append(unknown, m)
		}
		return v
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown Grafana variables %q", unknown)
	}
	return out, nil
}

var (
	promStringRE = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promBraceRE  = regexp.MustCompile(`\{[^}]*\}`)
	promRangeRE  = regexp.MustCompile(`\[[^\]]*\]`)
	promGroupRE  = regexp.MustCompile(`(?i)\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdentRE  = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	// promKeywords are PromQL's words that are not metric names: operators, modifiers,
	// aggregations (which need not be followed by a parenthesis: sum by (x) (...)).
	promKeywords = map[string]bool{
		"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true,
		"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"inf": true, "nan": true, "start": true, "end": true,
		"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
		"limitk": true, "limit_ratio": true,
	}
)

// metricNames returns the metric names a PromQL expression (one promtool parsed) selects:
// its identifiers that are not keywords, function calls, label names (inside braces or
// grouping lists), strings or durations.
func metricNames(expr string) []string {
	s := promStringRE.ReplaceAllString(expr, `""`)
	s = promBraceRE.ReplaceAllString(s, "{}")
	s = promRangeRE.ReplaceAllString(s, "[]")
	s = promGroupRE.ReplaceAllString(s, "$1 ()")
	var names []string
	for _, loc := range promIdentRE.FindAllStringIndex(s, -1) {
		if loc[0] > 0 && strings.ContainsRune("0123456789.", rune(s[loc[0]-1])) {
			continue // the exponent of a number (1e9) or a duration's unit (5m)
		}
		id := s[loc[0]:loc[1]]
		if promKeywords[strings.ToLower(id)] || strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") {
			continue
		}
		names = append(names, id)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`sum by (instance) (rate(a_total{kind="x", instance=~"y"}[5m]))`, []string{"a_total"}},
		{`count(b == 0) or vector(0)`, []string{"b"}},
		{`time() - (c > 0)`, []string{"c"}},
		{`d and on (instance, job) e{f="g h"}`, []string{"d", "e"}},
		{`max without (mode) (x) * 1e9 + y offset 5m`, []string{"x", "y"}},
		{`sum(z) by (le)`, []string{"z"}},
		{`rate(q:rec[1m:30s])`, []string{"q:rec"}},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, metricNames(tc.expr)); diff != "" {
				t.Errorf("metricNames(%q) (-want +got):\n%s", tc.expr, diff)
			}
		})
	}
}

// TestDashboard checks the dashboard's structure, and that its queries name only the
// agent's metrics.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	agent := loadAgentMetrics(t)
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want a uid, a title, schemaVersion >= 36", d.UID, d.Title, d.SchemaVersion)
	}

	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		switch v.Name {
		case "datasource":
			if v.Type != "datasource" || string(v.Query) != `"prometheus"` {
				t.Errorf("variable datasource: type %q query %s, want a datasource variable of Prometheus data sources", v.Type, v.Query)
			}
		case "node":
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable node: query %s: %v", v.Query, err)
			}
			m := regexp.MustCompile(`^label_values\((\w+),\s*instance\)$`).FindStringSubmatch(q.Query)
			if m == nil || !agent[m[1]] {
				t.Errorf("variable node: query %q, want label_values(<an agent metric>, instance)", q.Query)
			}
			if v.Datasource == nil || *v.Datasource != dashboardDS || v.AllValue != grafanaVars["node"] {
				t.Errorf("variable node: datasource %v, allValue %q; want %v, %q", v.Datasource, v.AllValue, dashboardDS, grafanaVars["node"])
			}
		default:
			t.Errorf("variable %q: the tests know only datasource and node", v.Name)
		}
	}
	if !vars["datasource"] || !vars["node"] {
		t.Errorf("variables %v, want datasource and node", vars)
	}

	ids, titles := map[int]bool{}, map[string]bool{}
	for _, p := range d.allPanels() {
		if ids[p.ID] || titles[p.Title] {
			t.Errorf("panel %d %q: its id or title repeats", p.ID, p.Title)
		}
		ids[p.ID], titles[p.Title] = true, true
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Description == "" || len(p.Targets) == 0 {
			t.Errorf("panel %q: %d queries, description %q; want queries and a description", p.Title, len(p.Targets), p.Description)
		}
		if p.Datasource == nil || *p.Datasource != dashboardDS {
			t.Errorf("panel %q: datasource %v, want %v", p.Title, p.Datasource, dashboardDS)
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || *tg.Datasource != dashboardDS {
				t.Errorf("panel %q query %s: datasource %v, want %v", p.Title, tg.RefID, tg.Datasource, dashboardDS)
			}
		}
	}

	for _, q := range d.queries() {
		expr, err := expandVars(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: %q names no metric", q.where, q.expr)
		}
		for _, n := range names {
			if !agent[n] {
				t.Errorf("%s: %s is not among the agent's metrics (%s)", q.where, n, agentMetricsFile)
			}
		}
		if !strings.Contains(q.expr, `instance=~"$node"`) {
			t.Errorf("%s: %q does not follow the node variable (instance=~\"$node\")", q.where, q.expr)
		}
	}
}

// TestDashboardPromtool parses every query with Prometheus's parser: each becomes a
// recording rule of a rule file that `promtool check rules` reads.
func TestDashboardPromtool(t *testing.T) {
	d := loadDashboard(t)
	var rules []map[string]string
	var where []string
	for _, q := range d.queries() {
		expr, err := expandVars(q.expr)
		if err != nil {
			t.Fatalf("%s: %v", q.where, err)
		}
		rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", len(rules)+1), "expr": expr})
		where = append(where, q.where)
	}
	data, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "dashboard.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(findPromtool(t), "check", "rules", "dashboard.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		// promtool names a failing rule by its place in the group, from 1; say which query it is.
		var legend strings.Builder
		for i, w := range where {
			fmt.Fprintf(&legend, "rule %d: %s\n", i+1, w)
		}
		t.Errorf("promtool check rules: %v\n%s\nthe rules are the dashboard's queries:\n%s", err, out, legend.String())
	}
	if want := fmt.Sprintf("SUCCESS: %d rules found", len(rules)); err == nil && !strings.Contains(string(out), want) {
		t.Errorf("promtool check rules said %q, want %q", out, want)
	}
}

// TestDashboardRepairsCountAll: a panel about repairs counts every kind of
// marksplit_changes_total. A rule or a table route the agent puts back is a
// rule-add or a route-replace (no label tells it from an install); a panel
// of kind="route-repair" alone missed them (issue 30: five rules and a
// table-900 route put back did not move it).
func TestDashboardRepairsCountAll(t *testing.T) {
	n := 0
	for _, q := range loadDashboard(t).queries() {
		if !strings.Contains(strings.ToLower(q.where), "repair") {
			continue
		}
		n++
		if !strings.Contains(q.expr, "marksplit_changes_total") || strings.Contains(q.expr, "kind=") || strings.Contains(q.expr, "kind =") {
			t.Errorf("%s: %s: want marksplit_changes_total with no kind selector", q.where, q.expr)
		}
	}
	if n == 0 {
		t.Error("no panel about repairs")
	}
}
