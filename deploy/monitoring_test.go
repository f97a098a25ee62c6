package deploy

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The monitoring component: deploy/monitoring holds a PrometheusRule, tested here three
// ways: decoded strictly into the Prometheus operator's types, rendered with kustomize on
// top of deploy/, and run through promtool (check rules, and the unit tests of
// monitoring/testdata/alerts_test.yaml). Its dashboard is tested in dashboard_test.go.

const monitoringDir = "monitoring"

// The alerts of issue 17. The metrics their expressions may use are the agent's:
// loadAgentMetrics.
var wantAlerts = []string{
	"MarksplitNotReady", "MarksplitFight", "MarksplitResyncOverflow",
	"MarksplitTunnelLinkMissing", "MarksplitHostFragmentation", "MarksplitAgentAbsent",
}

// scrapeMetrics are the series not of the agent that a rule may use:
// Prometheus's own up for a target, and kube-state-metrics' of the
// DaemonSet, for MarksplitAgentAbsent (an agent that is not scraped exports
// nothing).
var scrapeMetrics = map[string]bool{
	"up": true, "kube_daemonset_status_desired_number_scheduled": true, "kube_daemonset_status_number_available": true,
}

// monitoringDecoder is strictDecoder with the Prometheus operator's types too.
func monitoringDecoder() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme, monv1.AddToScheme, admissionv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err) // static registrations; cannot fail
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// loadPrometheusRule decodes monitoring/prometheusrule.yaml strictly.
func loadPrometheusRule(t *testing.T) *monv1.PrometheusRule {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(monitoringDir, "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj, _, err := monitoringDecoder().Decode(data, nil, nil)
	if err != nil {
		t.Fatalf("prometheusrule.yaml: %v", err)
	}
	pr, ok := obj.(*monv1.PrometheusRule)
	if !ok {
		t.Fatalf("prometheusrule.yaml: %T, want a PrometheusRule", obj)
	}
	return pr
}

func TestMonitoringDecoderRejects(t *testing.T) {
	// As TestStrictDecoderRejects: the decoder must be strict for the checks to mean anything.
	const head = "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: x\nspec:\n  groups:\n    - name: g\n      rules:\n"
	for name, doc := range map[string]string{
		"unknown rule field": head + "        - alert: A\n          expr: up\n          fro: 5m\n",
		"unknown spec field": "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: x\nspec:\n  group: []\n",
		"duplicate key":      head + "        - alert: A\n          expr: up\n          expr: down\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, _, err := monitoringDecoder().Decode([]byte(doc), nil, nil); err == nil {
				t.Errorf("decoded without error:\n%s", doc)
			}
		})
	}
}

func TestMonitoringRule(t *testing.T) {
	pr := loadPrometheusRule(t)
	if pr.Name != name || pr.Namespace != namespace || pr.Labels[appLabel] != name {
		t.Errorf("PrometheusRule %s/%s labels %v, want %s/%s with %s=%s", pr.Namespace, pr.Name, pr.Labels, namespace, name, appLabel, name)
	}
	if len(pr.Spec.Groups) != 1 || pr.Spec.Groups[0].Name != name {
		t.Fatalf("groups %+v, want one group %q", pr.Spec.Groups, name)
	}
	readme, err := os.ReadFile(filepath.Join(monitoringDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	agentMetrics := loadAgentMetrics(t)
	var got []string
	for _, r := range pr.Spec.Groups[0].Rules {
		got = append(got, r.Alert)
		t.Run(r.Alert, func(t *testing.T) {
			if r.Record != "" || r.Alert == "" {
				t.Errorf("rule %q/%q: want an alert, no recording rule", r.Alert, r.Record)
			}
			if r.For == nil || *r.For == "" {
				t.Errorf("no for: an alert on one bad scrape pages")
			}
			if r.Labels["severity"] != "warning" {
				t.Errorf("severity %q, want warning", r.Labels["severity"])
			}
			expr := r.Expr.String()
			for _, m := range metricNames(expr) {
				if !agentMetrics[m] && !scrapeMetrics[m] {
					t.Errorf("expression uses %s, which the agent does not export (nor Prometheus, nor kube-state-metrics about the DaemonSet)", m)
				}
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("no %s annotation", a)
				}
			}
			// The description points at the alert's section of the README.
			anchor := "deploy/monitoring/README.md#" + strings.ToLower(r.Alert)
			if !strings.Contains(r.Annotations["description"], anchor) {
				t.Errorf("description does not link %s", anchor)
			}
			if !bytes.Contains(readme, []byte("\n### "+r.Alert+"\n")) {
				t.Errorf("README.md has no section ### %s", r.Alert)
			}
		})
	}
	if diff := cmp.Diff(wantAlerts, got); diff != "" {
		t.Errorf("alerts (-want +got):\n%s", diff)
	}
}

// TestMonitoringComponent decodes the component's kustomization strictly and renders deploy/
// with the component the way an overlay would, checking that it adds exactly the
// PrometheusRule and the dashboard's ConfigMap, and changes nothing else.
func TestMonitoringComponent(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(monitoringDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatalf("monitoring/kustomization.yaml: %v", err)
	}
	var k kusttypes.Kustomization
	strict, err := kjson.UnmarshalStrict(j, &k)
	if err == nil {
		err = errors.Join(strict...)
	}
	if err != nil {
		t.Fatalf("monitoring/kustomization.yaml: %v", err)
	}
	if k.Kind != kusttypes.ComponentKind || k.APIVersion != kusttypes.ComponentVersion {
		t.Errorf("monitoring/kustomization.yaml is %s %s, want %s %s", k.APIVersion, k.Kind, kusttypes.ComponentVersion, kusttypes.ComponentKind)
	}
	if diff := cmp.Diff([]string{"podmonitor.yaml", "prometheusrule.yaml"}, k.Resources); diff != "" {
		t.Errorf("component resources (-want +got):\n%s", diff)
	}

	// An overlay beside deploy/, in memory: deploy/ plus the component.
	fs := filesys.MakeFsInMemory()
	base := readKustomization(t)
	for _, f := range append([]string{"kustomization.yaml"}, base.Resources...) {
		copyInto(t, fs, f, "/repo/deploy/"+f)
	}
	for _, f := range []string{"kustomization.yaml", "podmonitor.yaml", "prometheusrule.yaml", "dashboard.json"} {
		copyInto(t, fs, filepath.Join(monitoringDir, f), "/repo/deploy/monitoring/"+f)
	}
	overlay := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy\ncomponents:\n  - ../deploy/monitoring\n"
	if err := fs.WriteFile("/repo/overlay/kustomization.yaml", []byte(overlay)); err != nil {
		t.Fatal(err)
	}
	render := func(dir string) []runtime.Object {
		t.Helper()
		rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, dir)
		if err != nil {
			t.Fatalf("kustomize build %s: %v", dir, err)
		}
		out, err := rm.AsYaml()
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeStreamWith(monitoringDecoder(), out)
		if err != nil {
			t.Fatalf("rendered %s: %v\n%s", dir, err, out)
		}
		return objs
	}
	plain, with := render("/repo/deploy"), render("/repo/overlay")
	var rule *monv1.PrometheusRule
	var dash *corev1.ConfigMap
	var rest []runtime.Object
	scrape := map[string]bool{}
	for _, o := range with {
		switch o := o.(type) {
		case *monv1.PodMonitor:
			scrape["PodMonitor/"+o.Name] = true
			continue
		case *corev1.ServiceAccount:
			if o.Name == scraper {
				scrape["ServiceAccount/"+o.Name] = true
				continue
			}
		case *corev1.Secret:
			scrape["Secret/"+o.Name] = true
			continue
		case *rbacv1.ClusterRoleBinding:
			if o.Name == scraper {
				scrape["ClusterRoleBinding/"+o.Name] = true
				continue
			}
		}
		if pr, ok := o.(*monv1.PrometheusRule); ok {
			if rule != nil {
				t.Errorf("two PrometheusRules rendered")
			}
			rule = pr
			continue
		}
		if cm, ok := o.(*corev1.ConfigMap); ok && cm.Name == dashboardConfigMap {
			dash = cm
			continue
		}
		rest = append(rest, o)
	}
	wantScrape := map[string]bool{"PodMonitor/" + name: true, "ServiceAccount/" + scraper: true,
		"Secret/" + scraper + "-token": true, "ClusterRoleBinding/" + scraper: true}
	if diff := cmp.Diff(wantScrape, scrape); diff != "" {
		t.Errorf("rendered scrape objects (-want +got):\n%s", diff)
	}
	checkDashboardConfigMap(t, dash)
	if rule == nil || rule.Name != name || rule.Namespace != namespace {
		t.Fatalf("rendered PrometheusRule %v, want %s/%s", rule, namespace, name)
	}
	if len(plain) != len(rest) {
		t.Errorf("%d other objects with the component, %d without", len(rest), len(plain))
	} else {
		for i := range plain {
			if !equality.Semantic.DeepEqual(plain[i], rest[i]) {
				t.Errorf("the component changed %T:\nwithout: %+v\nwith: %+v", plain[i], plain[i], rest[i])
			}
		}
	}
	if diff := cmp.Diff(loadPrometheusRule(t).Spec, rule.Spec); diff != "" {
		t.Errorf("rendered rule differs from prometheusrule.yaml (-file +rendered):\n%s", diff)
	}
}

func copyInto(t *testing.T, fs filesys.FileSystem, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.MkdirAll(filepath.Dir(to)); err != nil {
		t.Fatal(err)
	}
	if err := fs.WriteFile(to, data); err != nil {
		t.Fatal(err)
	}
}

// alertTests is what TestMonitoringRulesCovered reads of testdata/alerts_test.yaml.
type alertTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		Name  string `json:"name"`
		Cases []struct {
			Alert  string `json:"alertname"`
			Alerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestMonitoringRulesCovered: every alert has a promtool case where it fires and one where
// it does not.
func TestMonitoringRulesCovered(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(monitoringDir, "testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var at alertTests
	if err := yaml.Unmarshal(data, &at); err != nil {
		t.Fatalf("alerts_test.yaml: %v", err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range at.Tests {
		for _, c := range tc.Cases {
			if len(c.Alerts) > 0 {
				fires[c.Alert] = true
			} else {
				silent[c.Alert] = true
			}
		}
	}
	for _, a := range wantAlerts {
		if !fires[a] || !silent[a] {
			t.Errorf("%s: a case where it fires %v, one where it does not %v; want both", a, fires[a], silent[a])
		}
	}
	if diff := cmp.Diff([]string{"rules.yaml"}, at.RuleFiles); diff != "" {
		t.Errorf("rule_files (-want +got):\n%s", diff)
	}
}

// TestMonitoringPromtool runs `promtool check rules` on the PrometheusRule's groups and
// `promtool test rules` on testdata/alerts_test.yaml. promtool comes from PATH, from the
// cache, or from Debian's prometheus package (see findPromtool).
func TestMonitoringPromtool(t *testing.T) {
	promtool := findPromtool(t)
	dir := t.TempDir()
	rules, err := yaml.Marshal(map[string]any{"groups": loadPrometheusRule(t).Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(monitoringDir, "testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Errorf("promtool %s: %v", strings.Join(args, " "), err)
		}
	}
}

// strictEnv reports whether a missing tool must fail the test rather than skip it: CI sets
// both.
func strictEnv() bool {
	return os.Getenv("MARKSPLIT_KERNEL_TESTS") == "1" || os.Getenv("CI") == "true"
}

// findPromtool returns promtool from PATH, or the copy cached in
// $MARKSPLIT_CACHE/promtool (default /var/cache/marksplit, or the user's cache directory
// when not root), extracting it there from Debian's prometheus package when missing.
// The package is downloaded and unpacked, never installed: installing it would start a
// Prometheus server (its init script) on the machine.
func findPromtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	dir := promtoolCacheDir()
	bin := filepath.Join(dir, "promtool")
	if err := exec.Command(bin, "--version").Run(); err == nil {
		return bin
	}
	if err := installPromtool(dir, bin); err != nil {
		msg := fmt.Sprintf("promtool is not on PATH and could not be taken from Debian's prometheus package: %v "+
			"(apt-get install prometheus, or put promtool on PATH)", err)
		if strictEnv() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Logf("promtool extracted from Debian's prometheus package into %s", bin)
	return bin
}

func promtoolCacheDir() string {
	if d := os.Getenv("MARKSPLIT_CACHE"); d != "" {
		return filepath.Join(d, "promtool")
	}
	if os.Geteuid() == 0 {
		return "/var/cache/marksplit/promtool"
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "marksplit", "promtool")
	}
	return filepath.Join(os.TempDir(), "marksplit-promtool")
}

// installPromtool downloads Debian's prometheus package with apt-get (after apt-get update
// if the first try fails and we are root) and extracts usr/bin/promtool into bin.
func installPromtool(dir, bin string) error {
	for _, tool := range []string{"apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("no %s (not a Debian system?)", tool)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(dir, "download-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", "download", "-q", "prometheus")
		cmd.Dir = tmp
		return cmd.CombinedOutput()
	}
	out, err := download()
	if err != nil && os.Geteuid() == 0 {
		if upd, uerr := exec.Command("apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return fmt.Errorf("apt-get update: %v: %s", uerr, lastLine(upd))
		}
		out, err = download()
	}
	if err != nil {
		return fmt.Errorf("apt-get download prometheus: %v: %s", err, lastLine(out))
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "prometheus_*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download prometheus left %d .deb files", len(debs))
	}
	cmd := exec.Command("dpkg-deb", "--fsys-tarfile", debs[0])
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	fsys, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	found, xerr := extractFile(fsys, "./usr/bin/promtool", filepath.Join(tmp, "promtool"))
	io.Copy(io.Discard, fsys)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile: %v: %s", err, lastLine(stderr.Bytes()))
	}
	switch {
	case xerr != nil:
		return xerr
	case !found:
		return errors.New("the prometheus package holds no usr/bin/promtool")
	}
	if out, err := exec.Command(filepath.Join(tmp, "promtool"), "--version").CombinedOutput(); err != nil {
		return fmt.Errorf("the extracted promtool does not run: %v: %s", err, lastLine(out))
	}
	return os.Rename(filepath.Join(tmp, "promtool"), bin)
}

// extractFile copies the file called name out of the tar stream r into to.
func extractFile(r io.Reader, name, to string) (bool, error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if h.Name != name || h.Typeflag != tar.TypeReg {
			continue
		}
		f, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
		if err != nil {
			return false, err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return false, err
		}
		return true, f.Close()
	}
}

func lastLine(b []byte) string {
	lines := slices.DeleteFunc(strings.Split(strings.TrimSpace(string(b)), "\n"), func(s string) bool { return s == "" })
	if len(lines) == 0 {
		return "(no output)"
	}
	return lines[len(lines)-1]
}

// scraper is the service account the component's PodMonitor scrapes with.
const scraper = "marksplit-metrics-scraper"

// TestMonitoringPodMonitor decodes podmonitor.yaml strictly and checks that its
// PodMonitor scrapes the DaemonSet's secure port over HTTPS with the token of a
// service account bound to the reader ClusterRole of rbac.yaml, and nothing more.
func TestMonitoringPodMonitor(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(monitoringDir, "podmonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStreamWith(monitoringDecoder(), data)
	if err != nil {
		t.Fatalf("podmonitor.yaml: %v", err)
	}
	if len(objs) != 4 {
		t.Fatalf("podmonitor.yaml: %d objects, want ServiceAccount, Secret, ClusterRoleBinding, PodMonitor", len(objs))
	}
	sa, ok1 := objs[0].(*corev1.ServiceAccount)
	secret, ok2 := objs[1].(*corev1.Secret)
	binding, ok3 := objs[2].(*rbacv1.ClusterRoleBinding)
	pm, ok4 := objs[3].(*monv1.PodMonitor)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		t.Fatalf("podmonitor.yaml: %T, %T, %T, %T; want ServiceAccount, Secret, ClusterRoleBinding, PodMonitor", objs[0], objs[1], objs[2], objs[3])
	}
	ds := loadDaemonSet(t)
	pod := ds.Spec.Template

	if sa.Name != scraper || sa.Namespace != namespace {
		t.Errorf("ServiceAccount %s/%s, want %s/%s", sa.Namespace, sa.Name, namespace, scraper)
	}
	if secret.Type != corev1.SecretTypeServiceAccountToken || secret.Namespace != namespace ||
		secret.Annotations[corev1.ServiceAccountNameKey] != sa.Name || len(secret.Data)+len(secret.StringData) != 0 {
		t.Errorf("Secret %s/%s type %s annotations %v: want an empty %s for %s, filled by Kubernetes",
			secret.Namespace, secret.Name, secret.Type, secret.Annotations, corev1.SecretTypeServiceAccountToken, sa.Name)
	}
	wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: metricsReader}
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}
	if diff := cmp.Diff(wantRef, binding.RoleRef); diff != "" {
		t.Errorf("ClusterRoleBinding roleRef (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantSubjects, binding.Subjects); diff != "" {
		t.Errorf("ClusterRoleBinding subjects (-want +got):\n%s", diff)
	}
	readerInRBAC := false
	for _, o := range decodeFile(t, "rbac.yaml") {
		if cr, ok := o.(*rbacv1.ClusterRole); ok && cr.Name == metricsReader {
			readerInRBAC = true
		}
	}
	if !readerInRBAC {
		t.Errorf("rbac.yaml has no ClusterRole %s to bind", metricsReader)
	}

	if pm.Namespace != namespace || pm.Name != name {
		t.Errorf("PodMonitor %s/%s, want %s/%s", pm.Namespace, pm.Name, namespace, name)
	}
	sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
		t.Errorf("PodMonitor selector %v (%v) does not select the DaemonSet's pods %v", pm.Spec.Selector, err, pod.Labels)
	}
	if len(pm.Spec.PodMetricsEndpoints) != 1 {
		t.Fatalf("%d podMetricsEndpoints, want 1", len(pm.Spec.PodMetricsEndpoints))
	}
	ep := pm.Spec.PodMetricsEndpoints[0]
	var ports []string
	for _, p := range pod.Spec.Containers[0].Ports {
		ports = append(ports, p.Name)
	}
	if ep.Port == nil || !slices.Contains(ports, *ep.Port) {
		t.Errorf("endpoint port %v, want one of the DaemonSet's ports %q", ep.Port, ports)
	}
	if ep.Scheme == nil || ep.Scheme.String() != "https" || ep.Path != "/metrics" {
		t.Errorf("endpoint scheme %v path %q, want https /metrics", ep.Scheme, ep.Path)
	}
	a := ep.Authorization
	if a == nil || a.Credentials == nil || a.Credentials.Name != secret.Name || a.Credentials.Key != corev1.ServiceAccountTokenKey || a.Validate() != nil {
		t.Errorf("authorization %+v, want the token of the Secret %s", a, secret.Name)
	}
	if tc := ep.TLSConfig; tc == nil || tc.InsecureSkipVerify == nil || !*tc.InsecureSkipVerify {
		t.Errorf("tlsConfig %+v: the agent's certificate is self-signed, want insecureSkipVerify", tc)
	}
}
