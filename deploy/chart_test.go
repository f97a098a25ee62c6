package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The Helm chart, charts/marksplit, tested against the kustomization: by
// default it renders the objects `kustomize build deploy/` does, and with
// monitoring.enabled those of deploy/ with the monitoring component, object
// by object. Helm and kustomize run from their Go modules; no binary.

const chartDir = "../charts/marksplit"

var updateChartFiles = flag.Bool("update", false, "copy deploy/monitoring's files into charts/marksplit/files (TestChartFiles)")

// chartFiles are the chart's copies of the monitoring component's files
// (chart path: deploy path). deploy/monitoring holds the originals, which
// promtool and the dashboard tests check; a chart cannot read outside its
// directory, nor kustomize outside its root, so the chart carries byte copies.
var chartFiles = map[string]string{
	"files/dashboard.json":      "monitoring/dashboard.json",
	"files/prometheusrule.yaml": "monitoring/prometheusrule.yaml",
}

// TestChartFiles fails when a copy in charts/marksplit/files differs from
// its original in deploy/monitoring; with -update it copies them again.
func TestChartFiles(t *testing.T) {
	for copyPath, orig := range chartFiles {
		want, err := os.ReadFile(orig)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(chartDir, copyPath)
		if *updateChartFiles {
			if err := os.WriteFile(dst, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(want, got) {
			t.Errorf("charts/marksplit/%s differs from deploy/%s: run `go test -run TestChartFiles -update` in deploy/", copyPath, orig)
		}
	}
}

// object is one rendered Kubernetes object, decoded as JSON would be.
type object = map[string]any

// objectKey names an object the way the API server does.
func objectKey(o object) string {
	meta, _ := o["metadata"].(map[string]any)
	return fmt.Sprintf("%v %v %v/%v", o["apiVersion"], o["kind"], meta["namespace"], meta["name"])
}

// decodeObjects splits a YAML stream into objects: each document strictly
// through the Kubernetes and Prometheus operator types first (a misspelt
// field in a template fails), then into a map to compare.
func decodeObjects(t *testing.T, what string, data []byte) []object {
	t.Helper()
	if _, err := decodeStreamWith(monitoringDecoder(), data); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, data)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if isBlank(doc) {
			continue
		}
		var o object
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, doc)
		}
		objs = append(objs, o)
	}
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load %s: %v", chartDir, err)
	}
	return c
}

// renderChart renders the chart as `helm template marksplit charts/marksplit
// -n kube-system` with vals as the user's values: coalesced with
// values.yaml, validated against values.schema.json, then through the
// templates. It returns the objects, or the first error.
func renderChart(t *testing.T, vals map[string]any) ([]object, error) {
	t.Helper()
	c := loadChart(t)
	opts := chartutil.ReleaseOptions{Name: name, Namespace: namespace, Revision: 1, IsInstall: true}
	rv, err := chartutil.ToRenderValues(c, vals, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(c, rv)
	if err != nil {
		return nil, err
	}
	var stream bytes.Buffer
	for _, f := range slices.Sorted(func(yield func(string) bool) {
		for f := range out {
			if !yield(f) {
				return
			}
		}
	}) {
		if strings.HasSuffix(f, "NOTES.txt") {
			continue
		}
		fmt.Fprintf(&stream, "---\n# %s\n%s\n", f, out[f])
	}
	return decodeObjects(t, "helm template", stream.Bytes()), nil
}

// mustRenderChart is renderChart that fails the test on an error.
func mustRenderChart(t *testing.T, vals map[string]any) []object {
	t.Helper()
	objs, err := renderChart(t, vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return objs
}

// kustomizeObjects renders deploy/ as `kustomize build deploy/` does, and
// with monitoring as an overlay beside it that adds the monitoring
// component would (in memory, as TestMonitoringComponent).
func kustomizeObjects(t *testing.T, monitoring bool) []object {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	base := readKustomization(t)
	for _, f := range append([]string{"kustomization.yaml"}, base.Resources...) {
		copyInto(t, fs, f, "/repo/deploy/"+f)
	}
	dir := "/repo/deploy"
	if monitoring {
		for _, f := range []string{"kustomization.yaml", "prometheusrule.yaml", "dashboard.json"} {
			copyInto(t, fs, filepath.Join(monitoringDir, f), "/repo/deploy/monitoring/"+f)
		}
		overlay := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy\ncomponents:\n  - ../deploy/monitoring\n"
		if err := fs.WriteFile("/repo/overlay/kustomization.yaml", []byte(overlay)); err != nil {
			t.Fatal(err)
		}
		dir = "/repo/overlay"
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, dir)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return decodeObjects(t, "kustomize build", out)
}

// byKey indexes objects by objectKey; a key twice is an error.
func byKey(t *testing.T, what string, objs []object) map[string]object {
	t.Helper()
	m := map[string]object{}
	for _, o := range objs {
		k := objectKey(o)
		if _, dup := m[k]; dup {
			t.Errorf("%s renders %s twice", what, k)
		}
		m[k] = o
	}
	return m
}

// TestChartMatchesKustomize: with its defaults, the chart renders exactly
// the objects of `kubectl apply -k deploy/`, and with monitoring.enabled
// those of deploy/ with the monitoring component: the same keys, and each
// object equal field by field (labels, args, env, probes, resources,
// security context, tolerations, image...).
func TestChartMatchesKustomize(t *testing.T) {
	for _, tt := range []struct {
		name       string
		vals       map[string]any
		monitoring bool
		objects    int
	}{
		{"defaults", nil, false, 4},
		{"monitoring", map[string]any{"monitoring": map[string]any{"enabled": true}}, true, 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := byKey(t, "kustomize", kustomizeObjects(t, tt.monitoring))
			got := byKey(t, "the chart", mustRenderChart(t, tt.vals))
			if len(want) != tt.objects {
				t.Errorf("kustomize rendered %d objects, want %d", len(want), tt.objects)
			}
			keys := func(m map[string]object) []string {
				return slices.Sorted(func(yield func(string) bool) {
					for k := range m {
						if !yield(k) {
							return
						}
					}
				})
			}
			if diff := cmp.Diff(keys(want), keys(got)); diff != "" {
				t.Errorf("objects (-kustomize +chart):\n%s", diff)
			}
			for _, k := range keys(want) {
				if g, ok := got[k]; ok {
					if diff := cmp.Diff(want[k], g); diff != "" {
						t.Errorf("%s (-kustomize +chart):\n%s", k, diff)
					}
				}
			}
			t.Logf("%d objects compared", len(want))
		})
	}
}

// TestChartVersion: the chart is cut for the release the kustomization
// names (TestReleaseImage: a tag the release workflow publishes). Its
// appVersion is that tag, its version the tag without the v, and its image
// that repository, so both install the same image.
func TestChartVersion(t *testing.T) {
	c := loadChart(t)
	k := readKustomization(t)
	if len(k.Images) != 1 {
		t.Fatalf("kustomization.yaml: want one images entry, got %d", len(k.Images))
	}
	img := k.Images[0]
	if c.Metadata.APIVersion != chart.APIVersionV2 {
		t.Errorf("Chart.yaml apiVersion %q, want %q", c.Metadata.APIVersion, chart.APIVersionV2)
	}
	if c.Metadata.AppVersion != img.NewTag {
		t.Errorf("Chart.yaml appVersion %q, want the kustomization's newTag %q", c.Metadata.AppVersion, img.NewTag)
	}
	if want := strings.TrimPrefix(img.NewTag, "v"); c.Metadata.Version != want {
		t.Errorf("Chart.yaml version %q, want %q (newTag %q without the v)", c.Metadata.Version, want, img.NewTag)
	}
	repo, _ := c.Values["image"].(map[string]any)["repository"].(string)
	if repo != img.NewName {
		t.Errorf("values.yaml image.repository %q, want the kustomization's newName %q", repo, img.NewName)
	}
}

// TestChartRefuses: values the agent would refuse at start (or the chart
// does not know) fail `helm template` and `helm install` with an error that
// names the value, from values.schema.json or the templates' checks.
func TestChartRefuses(t *testing.T) {
	peers := func(auto bool, prefixes []any, link string) map[string]any {
		return map[string]any{"peers": map[string]any{"auto": auto, "prefixes": prefixes, "underlayLink": link}}
	}
	for _, tt := range []struct {
		name string
		vals map[string]any
		want string // in the error
	}{
		{"unknown key", map[string]any{"tabel": 901}, "tabel"},
		{"unknown nested key", map[string]any{"image": map[string]any{"tags": "v1"}}, "tags"},
		{"mark without mask", map[string]any{"mark": "0xe00"}, "/mark"},
		{"mark in decimal", map[string]any{"mark": "3584/3840"}, "/mark"},
		{"mark in upper case", map[string]any{"mark": "0xE00/0xF00"}, "/mark"},
		{"mark 0", map[string]any{"mark": "0x0/0xf00"}, "/mark"},
		{"mask 0", map[string]any{"mark": "0xe00/0x0"}, "/mark"},
		{"mark over 32 bits", map[string]any{"mark": "0x100000000/0x100000000"}, "/mark"},
		{"mark outside the mask", map[string]any{"mark": "0x1e00/0xf00"}, "mark"},
		{"table 0", map[string]any{"table": 0}, "/table"},
		{"table 252", map[string]any{"table": 252}, "/table"},
		{"table 254", map[string]any{"table": 254}, "/table"},
		{"table 255", map[string]any{"table": 255}, "/table"},
		{"table over 32 bits", map[string]any{"table": int64(4294967296)}, "/table"},
		{"table as a string", map[string]any{"table": "900"}, "/table"},
		{"Cilium's table", map[string]any{"table": 2004}, "table 2004"},
		{"Tailscale's table", map[string]any{"table": 52}, "table 52"},
		{"priority 0", map[string]any{"priority": 0}, "/priority"},
		{"priority 32766", map[string]any{"priority": 32766}, "/priority"},
		{"priority 40000", map[string]any{"priority": 40000}, "/priority"},
		{"Cilium's priority", map[string]any{"priority": 100}, "priority 100"},
		{"Tailscale's priority", map[string]any{"priority": 5230}, "priority 5230"},
		{"protocol 0", map[string]any{"protocol": 0}, "/protocol"},
		{"protocol 3", map[string]any{"protocol": 3}, "/protocol"},
		{"protocol 256", map[string]any{"protocol": 256}, "/protocol"},
		{"protocol boot", map[string]any{"protocol": "boot"}, "/protocol"},
		{"protocol unknown name", map[string]any{"protocol": "zebra"}, "/protocol"},
		{"encryption", map[string]any{"encryption": "yes"}, "/encryption"},
		{"encryption bool", map[string]any{"encryption": true}, "/encryption"},
		{"log format", map[string]any{"logFormat": "xml"}, "/logFormat"},
		{"tunnel link empty", map[string]any{"tunnelLink": ""}, "/tunnelLink"},
		{"tunnel link 16 bytes", map[string]any{"tunnelLink": "cilium_wg0123456"}, "/tunnelLink"},
		{"tunnel link 16 bytes in 8 characters", map[string]any{"tunnelLink": "éééééééé"}, "tunnelLink"},
		{"tunnel link with a slash", map[string]any{"tunnelLink": "wg/0"}, "/tunnelLink"},
		{"tunnel link with a colon", map[string]any{"tunnelLink": "wg:0"}, "/tunnelLink"},
		{"tunnel link with a space", map[string]any{"tunnelLink": "wg 0"}, "/tunnelLink"},
		{"tunnel link with a control character", map[string]any{"tunnelLink": "wg\x010"}, "/tunnelLink"},
		{"tunnel link dot dot", map[string]any{"tunnelLink": ".."}, "/tunnelLink"},
		{"peers auto with prefixes", peers(true, []any{"10.0.0.0/16"}, ""), "/peers/prefixes"},
		{"peers auto with underlay link", peers(true, nil, "eth0"), "/peers/underlayLink"},
		{"no peers", peers(false, nil, ""), "/peers"},
		{"prefix not a CIDR", peers(false, []any{"10.0.0.0"}, ""), "/peers/prefixes/0"},
		{"prefix length 33", peers(false, []any{"10.0.0.0/33"}, ""), "/peers/prefixes/0"},
		{"underlay link with a slash", peers(false, nil, "eth/0"), "/peers/underlayLink"},
		{"metrics not loopback", map[string]any{"metrics": map[string]any{"address": "0.0.0.0:9184"}}, "/metrics/address"},
		{"metrics empty", map[string]any{"metrics": map[string]any{"address": ""}}, "/metrics/address"},
		{"metrics port 65536", map[string]any{"metrics": map[string]any{"address": "127.0.0.1:65536"}}, "/metrics/address"},
		{"extra arg not a flag", map[string]any{"extraArgs": []any{"plan"}}, "/extraArgs/0"},
		{"pull policy", map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, "/image/pullPolicy"},
		{"rule label not a string", map[string]any{"monitoring": map[string]any{"ruleLabels": map[string]any{"release": 1}}}, "/monitoring/ruleLabels/release"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := renderChart(t, tt.vals)
			if err == nil {
				t.Fatalf("values %v rendered without error", tt.vals)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error does not name %q:\n%v", tt.want, err)
			}
			t.Logf("%v", err)
		})
	}
}
