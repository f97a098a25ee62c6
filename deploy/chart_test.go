package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/kubewatch"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The Helm chart, charts/marksplit, tested against the kustomization: by
// default it renders the objects `kustomize build deploy/` does, and with
// monitoring.enabled those of deploy/ with the monitoring component, object
// by object. Helm and kustomize run from their Go modules; no binary.

const chartDir = "../charts/marksplit"

// testDigest is an image digest for the tests: 64 hex digits.
const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

var updateChartFiles = flag.Bool("update", false, "copy deploy/monitoring's files into charts/marksplit/files (TestChartFiles)")

// chartFiles are the chart's copies of the monitoring component's files
// (chart path: deploy path). deploy/monitoring holds the originals, which
// promtool and the dashboard tests check; a chart cannot read outside its
// directory, nor kustomize outside its root, so the chart carries byte copies.
var chartFiles = map[string]string{
	"files/dashboard.json":      "monitoring/dashboard.json",
	"files/podmonitor.yaml":     "monitoring/podmonitor.yaml",
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

// kustomizeOpts are the overlays kustomizeObjects puts beside deploy/.
type kustomizeOpts struct {
	monitoring     bool             // the monitoring component
	nodeCondition  bool             // the node-condition component
	digest         string           // an images entry's digest (kustomize edit set image …@digest)
	maxUnavailable any              // the pace patch's value, in place of kustomization.yaml's
	image          *kusttypes.Image // the images entry, in place of kustomization.yaml's (what `kustomize edit set image` writes)
	// namePrefix and nameSuffix: the overlay's renames.
	namePrefix, nameSuffix string
}

// kustomizeObjects renders deploy/ as `kustomize build deploy/` does, and
// through an overlay beside it with the components and edits of o (in
// memory, as TestMonitoringComponent).
func kustomizeObjects(t *testing.T, o kustomizeOpts) []object {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	base := readKustomization(t)
	for _, f := range append([]string{"kustomization.yaml"}, base.Resources...) {
		copyInto(t, fs, f, "/repo/deploy/"+f)
	}
	if o.digest != "" || o.maxUnavailable != nil || o.image != nil {
		k := base
		if o.image != nil {
			k.Images = []kusttypes.Image{*o.image}
		}
		if o.digest != "" {
			k.Images = slices.Clone(k.Images)
			k.Images[0].Digest = o.digest
		}
		if o.maxUnavailable != nil {
			k.Patches = slices.Clone(k.Patches)
			b, _ := json.Marshal(o.maxUnavailable)
			k.Patches[0].Patch = strings.Replace(k.Patches[0].Patch, "value: 10%", "value: "+string(b), 1)
		}
		data, err := yaml.Marshal(k)
		if err != nil {
			t.Fatal(err)
		}
		if err := fs.WriteFile("/repo/deploy/kustomization.yaml", data); err != nil {
			t.Fatal(err)
		}
	}
	dir := "/repo/deploy"
	var components []string
	if o.monitoring {
		for _, f := range []string{"kustomization.yaml", "podmonitor.yaml", "prometheusrule.yaml", "dashboard.json"} {
			copyInto(t, fs, filepath.Join(monitoringDir, f), "/repo/deploy/monitoring/"+f)
		}
		components = append(components, "../deploy/monitoring")
	}
	if o.nodeCondition {
		for _, f := range []string{"kustomization.yaml", "rbac.yaml", "policy.yaml", "kustomizeconfig.yaml"} {
			copyInto(t, fs, filepath.Join("node-condition", f), "/repo/deploy/node-condition/"+f)
		}
		components = append(components, "../deploy/node-condition")
	}
	if len(components) > 0 || o.namePrefix != "" || o.nameSuffix != "" {
		overlay := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy\n"
		if len(components) > 0 {
			overlay += "components:\n  - " + strings.Join(components, "\n  - ") + "\n"
		}
		for k, v := range map[string]string{"namePrefix": o.namePrefix, "nameSuffix": o.nameSuffix} {
			if v != "" {
				overlay += k + ": " + v + "\n"
			}
		}
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

// kustomizedDaemonSet is the DaemonSet kustomizeObjects renders.
func kustomizedDaemonSet(t *testing.T, o kustomizeOpts) *appsv1.DaemonSet {
	t.Helper()
	for _, obj := range kustomizeObjects(t, o) {
		if obj["kind"] == "DaemonSet" {
			b, err := json.Marshal(obj)
			if err != nil {
				t.Fatal(err)
			}
			var ds appsv1.DaemonSet
			if err := json.Unmarshal(b, &ds); err != nil {
				t.Fatal(err)
			}
			return &ds
		}
	}
	t.Fatal("kustomize renders no DaemonSet")
	return nil
}

// isHook reports whether o is a Helm hook (helm test's pod), which
// `helm install` does not apply and kustomize has no counterpart of.
func isHook(o object) bool {
	md, _ := o["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	_, ok := ann["helm.sh/hook"]
	return ok
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
		name    string
		vals    map[string]any
		kust    kustomizeOpts
		objects int
	}{
		// ServiceAccount, ClusterRole, ClusterRoleBinding, the Roles and
		// RoleBindings of the Events, of the uninstall switch and of
		// cilium-config, the metrics reader's ClusterRole, the DaemonSet.
		{"defaults", nil, kustomizeOpts{}, 11},
		// And the scraper's ServiceAccount, token Secret and
		// ClusterRoleBinding, the PodMonitor, the rule and the dashboard.
		{"monitoring", map[string]any{"monitoring": map[string]any{"enabled": true}}, kustomizeOpts{monitoring: true}, 17},
		// And the ClusterRole, its binding, the ValidatingAdmissionPolicy
		// and its binding; the DaemonSet's --node-condition.
		{"node condition", map[string]any{"nodeCondition": map[string]any{"enabled": true}}, kustomizeOpts{nodeCondition: true}, 15},
		{"digest", map[string]any{"image": map[string]any{"digest": testDigest}}, kustomizeOpts{digest: testDigest}, 11},
		{"pace as a number", map[string]any{"updateStrategy": map[string]any{"maxUnavailable": 3}}, kustomizeOpts{maxUnavailable: 3}, 11},
		{"pace as a percentage", map[string]any{"updateStrategy": map[string]any{"maxUnavailable": "25%"}}, kustomizeOpts{maxUnavailable: "25%"}, 11},
		{"everything", map[string]any{"monitoring": map[string]any{"enabled": true}, "nodeCondition": map[string]any{"enabled": true},
			"image": map[string]any{"digest": testDigest}, "updateStrategy": map[string]any{"maxUnavailable": 1},
			"tests": map[string]any{"node": "worker-1", "peer": "10.0.0.9"}},
			kustomizeOpts{monitoring: true, nodeCondition: true, digest: testDigest, maxUnavailable: 1}, 21},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := byKey(t, "kustomize", kustomizeObjects(t, tt.kust))
			var rendered []object
			for _, o := range mustRenderChart(t, tt.vals) {
				if !isHook(o) {
					rendered = append(rendered, o)
				}
			}
			got := byKey(t, "the chart", rendered)
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
	c := loadChart(t)
	if c.Schema == nil {
		t.Fatal("the chart has no values.schema.json")
	}
	if err := chartutil.ValidateAgainstSchema(c, c.Values); err != nil {
		t.Fatalf("values.yaml does not pass values.schema.json: %v", err)
	}
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
		{"underlay link is the tunnel link", peers(false, nil, "cilium_wg0"), "peers.underlayLink"},
		{"metrics not loopback", map[string]any{"metrics": map[string]any{"address": "0.0.0.0:9184"}}, "/metrics/address"},
		{"metrics empty", map[string]any{"metrics": map[string]any{"address": ""}}, "/metrics/address"},
		{"metrics on a name", map[string]any{"metrics": map[string]any{"address": "$(NODE_NAME):9184"}}, "/metrics/address"},
		{"metrics port 65536", map[string]any{"metrics": map[string]any{"address": "127.0.0.1:65536"}}, "/metrics/address"},
		{"secure metrics without port", map[string]any{"metrics": map[string]any{"secureAddress": "9185"}}, "/metrics/secureAddress"},
		{"secure metrics port 0", map[string]any{"metrics": map[string]any{"secureAddress": ":0"}}, "/metrics/secureAddress"},
		{"secure metrics on a name", map[string]any{"metrics": map[string]any{"secureAddress": "node1:9185"}}, "/metrics/secureAddress"},
		{"secure metrics on the metrics port", map[string]any{"metrics": map[string]any{"secureAddress": ":9184"}}, "metrics.secureAddress"},
		{"secure metrics on [::] and the metrics port", map[string]any{"metrics": map[string]any{"secureAddress": "[::]:9184"}}, "metrics.secureAddress"},
		{"secure metrics at metrics.address", map[string]any{"metrics": map[string]any{"address": "$(POD_IP):9185", "secureAddress": "$(POD_IP):9185"}}, "metrics.secureAddress"},
		{"monitoring of a loopback listener", map[string]any{"metrics": map[string]any{"secureAddress": "127.0.0.1:9185"}, "monitoring": map[string]any{"enabled": true}}, "metrics.secureAddress"},
		{"certificate without secure metrics", map[string]any{"metrics": map[string]any{"secureAddress": "", "tls": map[string]any{"secretName": "tls"}}}, "metrics.tls.secretName"},
		{"certificate Secret name", map[string]any{"metrics": map[string]any{"tls": map[string]any{"secretName": "Metrics_TLS"}}}, "/metrics/tls/secretName"},
		{"monitoring without secure metrics", map[string]any{"metrics": map[string]any{"secureAddress": ""}, "monitoring": map[string]any{"enabled": true}}, "metrics.secureAddress"},
		{"events not a bool", map[string]any{"events": map[string]any{"enabled": "no"}}, "/events/enabled"},
		{"events unknown key", map[string]any{"events": map[string]any{"namespace": "kube-system"}}, "namespace"},
		{"uninstall switch upper case", map[string]any{"uninstall": map[string]any{"configMapName": "Marksplit-Uninstall"}}, "/uninstall/configMapName"},
		{"uninstall switch null", map[string]any{"uninstall": map[string]any{"configMapName": nil}}, "configMapName"},
		{"extra arg not a flag", map[string]any{"extraArgs": []any{"plan"}}, "/extraArgs/0"},
		// extraArgs come after the values' flags, and the agent takes the
		// last of a flag given twice: a value's flag there would get past
		// every check above (issue 31: --table=254 rendered, and every
		// agent exited 2).
		{"digest not sha256", map[string]any{"image": map[string]any{"digest": "sha512:abc"}}, "/image/digest"},
		{"digest short", map[string]any{"image": map[string]any{"digest": "sha256:0123"}}, "/image/digest"},
		{"pace 0", map[string]any{"updateStrategy": map[string]any{"maxUnavailable": 0}}, "/updateStrategy/maxUnavailable"},
		{"pace 0%", map[string]any{"updateStrategy": map[string]any{"maxUnavailable": "0%"}}, "/updateStrategy/maxUnavailable"},
		{"pace 150%", map[string]any{"updateStrategy": map[string]any{"maxUnavailable": "150%"}}, "/updateStrategy/maxUnavailable"},
		{"pace as a string number", map[string]any{"updateStrategy": map[string]any{"maxUnavailable": "3"}}, "/updateStrategy/maxUnavailable"},
		{"pod label over the selector", map[string]any{"podLabels": map[string]any{"app.kubernetes.io/name": "x"}}, "/podLabels"},
		{"pod label component", map[string]any{"podLabels": map[string]any{"app.kubernetes.io/component": "x"}}, "/podLabels"},
		{"pod annotation not a string", map[string]any{"podAnnotations": map[string]any{"a": 1}}, "/podAnnotations/a"},
		{"node condition not a bool", map[string]any{"nodeCondition": map[string]any{"enabled": "yes"}}, "/nodeCondition/enabled"},
		{"test peer not an address", map[string]any{"tests": map[string]any{"node": "n1", "peer": "node-2"}}, "/tests/peer"},
		{"extra arg overrides table", map[string]any{"extraArgs": []any{"--table=254"}}, "extraArgs: --table"},
		{"extra arg overrides mark", map[string]any{"extraArgs": []any{"--mark=0xe00"}}, "extraArgs: --mark"},
		{"extra arg overrides peers", map[string]any{"extraArgs": []any{"--prefix=10.0.0.0/16"}}, "extraArgs: --prefix"},
		{"extra arg overrides metrics", map[string]any{"extraArgs": []any{"--metrics-addr=0.0.0.0:9184"}}, "extraArgs: --metrics-addr"},
		{"extra arg bool flag", map[string]any{"extraArgs": []any{"--allow-shared"}}, "extraArgs: --allow-shared"},
		{"extra arg events", map[string]any{"extraArgs": []any{"--events=false"}}, "extraArgs: --events"},
		{"extra arg log format", map[string]any{"extraArgs": []any{"--log-format=xml"}}, "extraArgs: --log-format"},
		{"pull policy", map[string]any{"image": map[string]any{"pullPolicy": "Sometimes"}}, "/image/pullPolicy"},
		{"rule label not a string", map[string]any{"monitoring": map[string]any{"ruleLabels": map[string]any{"release": 1}}}, "/monitoring/ruleLabels/release"},
		{"pod monitor label not a string", map[string]any{"monitoring": map[string]any{"podMonitorLabels": map[string]any{"release": 1}}}, "/monitoring/podMonitorLabels/release"},
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

// chartDaemonSet renders the chart with the values of a values file and
// returns its DaemonSet and every object.
func chartDaemonSet(t *testing.T, valuesYAML string) (*appsv1.DaemonSet, []object) {
	t.Helper()
	vals, err := chartutil.ReadValues([]byte(valuesYAML))
	if err != nil {
		t.Fatal(err)
	}
	objs := mustRenderChart(t, vals)
	var ds *appsv1.DaemonSet
	for _, o := range objs {
		if o["kind"] != "DaemonSet" {
			continue
		}
		j, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		ds = new(appsv1.DaemonSet)
		if err := json.Unmarshal(j, ds); err != nil {
			t.Fatal(err)
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet rendered")
	}
	return ds, objs
}

// chartObject decodes the rendered object of that kind, namespace and name
// into a T; nil when the chart did not render it.
func chartObject[T any](t *testing.T, objs []object, kind, ns, objName string) *T {
	t.Helper()
	for _, o := range objs {
		meta, _ := o["metadata"].(map[string]any)
		gotNS, _ := meta["namespace"].(string)
		if o["kind"] != kind || gotNS != ns || meta["name"] != objName {
			continue
		}
		j, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		v := new(T)
		if err := json.Unmarshal(j, v); err != nil {
			t.Fatalf("%s %s/%s: %v", kind, ns, objName, err)
		}
		return v
	}
	return nil
}

// TestChartValues: each value reaches the flag or field it documents, in a
// values file as `helm install -f` reads it.
func TestChartValues(t *testing.T) {
	container := func(ds *appsv1.DaemonSet) corev1.Container { return ds.Spec.Template.Spec.Containers[0] }
	args := func(t *testing.T, ds *appsv1.DaemonSet) map[string][]string {
		return parseArgs(t, container(ds).Args)
	}
	for _, tt := range []struct {
		name, values string
		check        func(t *testing.T, ds *appsv1.DaemonSet, objs []object)
	}{
		{"prefixes and underlay link", "peers:\n  auto: false\n  prefixes: [10.0.0.0/16, 'fd00::/64']\n  underlayLink: enp7s0\n",
			func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
				a := args(t, ds)
				if diff := cmp.Diff([]string{"10.0.0.0/16", "fd00::/64"}, a["prefix"]); diff != "" {
					t.Errorf("--prefix (-want +got):\n%s", diff)
				}
				if got := a["underlay-link"]; !slices.Equal(got, []string{"enp7s0"}) {
					t.Errorf("--underlay-link = %q", got)
				}
				if got, ok := a["peers"]; ok {
					t.Errorf("--peers = %q beside --prefix: the agent refuses it", got)
				}
			}},
		{"policy", "tunnelLink: wg0\nmark: '0x1e00/0x1f00'\ntable: 4294967295\npriority: 32765\nprotocol: kernel\nencryption: 'off'\nlogFormat: json\nextraArgs: [--node-name=n1]\n",
			func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
				want := map[string][]string{
					"tunnel-link": {"wg0"}, "mark": {"0x1e00/0x1f00"}, "table": {"4294967295"},
					"priority": {"32765"}, "peers": {"auto"}, "path-mtu-probe": {"true"}, "protocol": {"kernel"},
					"encryption": {"off"}, "uninstall-configmap": {uninstallConfigMap},
					"cilium-namespace": {"kube-system"}, "cilium-configmap": {"cilium-config"},
					"metrics-addr": {"127.0.0.1:9184"}, "secure-metrics-addr": {":9185"},
					"log-format": {"json"}, "node-name": {"n1"},
				}
				if diff := cmp.Diff(want, args(t, ds)); diff != "" {
					t.Errorf("args (-want +got):\n%s", diff)
				}
				// encryption is the literal flag, and no variable an
				// uninstall would have to change.
				testUninstallEnv(t, container(ds).Env)
			}},
		{"pod values", "podAnnotations: {example.com/owner: net}\npodLabels: {team: net}\naffinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/os, operator: In, values: [linux]}]}]}}}\n",
			func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
				tpl := ds.Spec.Template
				if diff := cmp.Diff(map[string]string{"example.com/owner": "net"}, tpl.Annotations); diff != "" {
					t.Errorf("pod annotations (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(map[string]string{appLabel: name, "app.kubernetes.io/component": "agent", "team": "net"}, tpl.Labels); diff != "" {
					t.Errorf("pod labels (-want +got):\n%s", diff)
				}
				if len(ds.Labels) != 2 || len(ds.Spec.Selector.MatchLabels) != 1 {
					t.Errorf("DaemonSet labels %v, selector %v: podLabels are the pod's only", ds.Labels, ds.Spec.Selector.MatchLabels)
				}
				na := tpl.Spec.Affinity
				if na == nil || na.NodeAffinity == nil || na.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "kubernetes.io/os" {
					t.Errorf("affinity %+v, want the node affinity given", na)
				}
			}},
		{"digest", "image: {digest: '" + testDigest + "', tag: v9.9.9}\n", func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			if got, want := container(ds).Image, "ghcr.io/marksplit/marksplit:v9.9.9@"+testDigest; got != want {
				t.Errorf("image %q, want %q (pulled by the digest; the tag says which release)", got, want)
			}
		}},
		{"pace", "updateStrategy: {maxUnavailable: 50%}\n", func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			if got := ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String(); got != "50%" {
				t.Errorf("maxUnavailable %s, want 50%%", got)
			}
		}},
		{"no helm test without its values", "", func(t *testing.T, _ *appsv1.DaemonSet, objs []object) {
			for _, o := range objs {
				if isHook(o) {
					t.Errorf("a hook rendered by default: %v", o["metadata"])
				}
			}
		}},
		{"helm test", "tests: {node: worker-1, peer: 10.0.0.9}\nprotocol: kernel\nimage: {digest: '" + testDigest + "'}\n", func(t *testing.T, ds *appsv1.DaemonSet, objs []object) {
			pod := chartObject[corev1.Pod](t, objs, "Pod", namespace, "marksplit-test-verify")
			if pod == nil {
				t.Fatal("no test pod")
			}
			if pod.Annotations["helm.sh/hook"] != "test" || pod.Spec.NodeName != "worker-1" || !pod.Spec.HostNetwork ||
				pod.Spec.ServiceAccountName != name || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("test pod %+v %+v: want a helm test hook on worker-1, hostNetwork, the agent's ServiceAccount, never restarted", pod.Annotations, pod.Spec)
			}
			tc := pod.Spec.Containers[0]
			if tc.Image != container(ds).Image {
				t.Errorf("test image %q, want the agent's %q", tc.Image, container(ds).Image)
			}
			// verify, the peer, and exactly the agent's policy flags.
			var policy []string
			for _, a := range container(ds).Args {
				for _, f := range []string{"--tunnel-link=", "--mark=", "--table=", "--priority=", "--peers=", "--prefix=", "--underlay-link=", "--protocol="} {
					if strings.HasPrefix(a, f) {
						policy = append(policy, a)
					}
				}
			}
			want := append(append([]string{"verify", "--peer=10.0.0.9"}, policy...), "--metrics-addr=")
			if diff := cmp.Diff(want, tc.Args); diff != "" {
				t.Errorf("test args (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(container(ds).Env[:2], tc.Env); diff != "" {
				t.Errorf("test env (-agent +test):\n%s", diff)
			}
			if diff := cmp.Diff(container(ds).SecurityContext, tc.SecurityContext); diff != "" {
				t.Errorf("test securityContext (-agent +test):\n%s", diff)
			}
		}},
		{"protocol number", "protocol: 77\n", func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			if got := args(t, ds)["protocol"]; !slices.Equal(got, []string{"77"}) {
				t.Errorf("--protocol = %q, want 77", got)
			}
		}},
		{"shared table", "allowShared: true\ntable: 2004\n", func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			a := args(t, ds)
			if !slices.Equal(a["allow-shared"], []string{"true"}) || !slices.Equal(a["table"], []string{"2004"}) {
				t.Errorf("args %q, want --allow-shared=true --table=2004", container(ds).Args)
			}
		}},
		{"metrics on IPv6 loopback", "metrics:\n  address: '[::1]:9186'\n", func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			c := container(ds)
			if got := args(t, ds)["metrics-addr"]; !slices.Equal(got, []string{"[::1]:9186"}) {
				t.Errorf("--metrics-addr = %q", got)
			}
			for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
				if p.Exec == nil || p.HTTPGet != nil {
					t.Errorf("probe %+v: want the exec probe over the health socket, whatever the listener", p.ProbeHandler)
				}
			}
		}},
		{"metrics on the node's IP", "metrics:\n  address: '$(POD_IP):9184'\n", func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			c := container(ds)
			if got := args(t, ds)["metrics-addr"]; !slices.Equal(got, []string{"$(POD_IP):9184"}) {
				t.Errorf("--metrics-addr = %q", got)
			}
			want := corev1.EnvVar{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "status.podIP"}}}
			if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" }); i < 0 {
				t.Errorf("env %+v has no POD_IP", c.Env)
			} else if diff := cmp.Diff(want, c.Env[i]); diff != "" {
				t.Errorf("POD_IP (-want +got):\n%s", diff)
			}
			for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
				if p.Exec == nil || p.HTTPGet != nil {
					t.Errorf("probe %+v: want the exec probe over the health socket, whatever the listener", p.ProbeHandler)
				}
			}
		}},
		{"pod", `image: {repository: registry.example.com/marksplit, tag: dev, pullPolicy: Always}
imagePullSecrets: [{name: pull}]
nodeSelector: {kubernetes.io/os: linux}
tolerations: []
priorityClassName: ""
resources: {limits: {memory: 256Mi}}
`, func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			spec := ds.Spec.Template.Spec
			c := spec.Containers[0]
			if c.Image != "registry.example.com/marksplit:dev" || c.ImagePullPolicy != corev1.PullAlways {
				t.Errorf("image %s, pull policy %s", c.Image, c.ImagePullPolicy)
			}
			if diff := cmp.Diff([]corev1.LocalObjectReference{{Name: "pull"}}, spec.ImagePullSecrets); diff != "" {
				t.Errorf("imagePullSecrets (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[string]string{"kubernetes.io/os": "linux"}, spec.NodeSelector); diff != "" {
				t.Errorf("nodeSelector (-want +got):\n%s", diff)
			}
			if len(spec.Tolerations) != 0 || spec.PriorityClassName != "" {
				t.Errorf("tolerations %v, priorityClassName %q: want none", spec.Tolerations, spec.PriorityClassName)
			}
			// Helm merges a map value into the default: the other three stay.
			want := corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("48Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
			}
			if !equality.Semantic.DeepEqual(want, c.Resources) {
				t.Errorf("resources %v, want %v", c.Resources, want)
			}
		}},
		{"secure metrics off", "metrics:\n  secureAddress: ''\n", func(t *testing.T, ds *appsv1.DaemonSet, objs []object) {
			c := container(ds)
			if got, ok := args(t, ds)["secure-metrics-addr"]; ok {
				t.Errorf("--secure-metrics-addr = %q, want none", got)
			}
			if len(c.Ports) != 0 {
				t.Errorf("ports %+v, want none without a secure listener", c.Ports)
			}
			if r := chartObject[rbacv1.ClusterRole](t, objs, "ClusterRole", "", metricsReader); r != nil {
				t.Errorf("ClusterRole %s rendered without a secure listener", metricsReader)
			}
			// The reviews are the secure listener's: without it the agent
			// reads its CiliumNodes, and nothing else.
			role := chartObject[rbacv1.ClusterRole](t, objs, "ClusterRole", "", name)
			want := []rbacv1.PolicyRule{{APIGroups: []string{"cilium.io"}, Resources: []string{"ciliumnodes"}, Verbs: []string{"get", "list", "watch"}}}
			if role == nil {
				t.Fatalf("no ClusterRole %s", name)
			}
			if diff := cmp.Diff(want, role.Rules); diff != "" {
				t.Errorf("ClusterRole rules (-want +got):\n%s", diff)
			}
		}},
		{"secure metrics on the node's IP", "metrics:\n  secureAddress: '[$(POD_IP)]:9443'\n", func(t *testing.T, ds *appsv1.DaemonSet, objs []object) {
			c := container(ds)
			if got := args(t, ds)["secure-metrics-addr"]; !slices.Equal(got, []string{"[$(POD_IP)]:9443"}) {
				t.Errorf("--secure-metrics-addr = %q", got)
			}
			wantPorts := []corev1.ContainerPort{{Name: "https-metrics", ContainerPort: 9443, Protocol: corev1.ProtocolTCP}}
			if diff := cmp.Diff(wantPorts, c.Ports); diff != "" {
				t.Errorf("ports (-want +got):\n%s", diff)
			}
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "POD_IP" }) {
				t.Errorf("env %+v has no POD_IP", c.Env)
			}
			if r := chartObject[rbacv1.ClusterRole](t, objs, "ClusterRole", "", metricsReader); r == nil {
				t.Errorf("no ClusterRole %s", metricsReader)
			}
		}},
		{"two listeners on one port", "metrics:\n  address: '127.0.0.1:9185'\n  secureAddress: '$(POD_IP):9185'\n", func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			a := args(t, ds)
			if !slices.Equal(a["metrics-addr"], []string{"127.0.0.1:9185"}) || !slices.Equal(a["secure-metrics-addr"], []string{"$(POD_IP):9185"}) {
				t.Errorf("args %q: two addresses may share a port", container(ds).Args)
			}
		}},
		{"certificate", "metrics:\n  tls: {secretName: marksplit-metrics-tls}\n", func(t *testing.T, ds *appsv1.DaemonSet, _ []object) {
			c := container(ds)
			a := args(t, ds)
			if !slices.Equal(a["tls-cert-file"], []string{"/etc/marksplit/tls/tls.crt"}) || !slices.Equal(a["tls-key-file"], []string{"/etc/marksplit/tls/tls.key"}) {
				t.Errorf("args %q, want --tls-cert-file and --tls-key-file in /etc/marksplit/tls", c.Args)
			}
			// After the health socket's (deploy/daemonset.yaml's).
			wantMounts := []corev1.VolumeMount{{Name: "metrics-tls", MountPath: "/etc/marksplit/tls", ReadOnly: true}}
			if diff := cmp.Diff(wantMounts, c.VolumeMounts[1:]); diff != "" {
				t.Errorf("volumeMounts (-want +got):\n%s", diff)
			}
			mode := int32(0o400)
			wantVolumes := []corev1.Volume{{Name: "metrics-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "marksplit-metrics-tls", DefaultMode: &mode}}}}
			if diff := cmp.Diff(wantVolumes, ds.Spec.Template.Spec.Volumes[1:]); diff != "" {
				t.Errorf("volumes (-want +got):\n%s", diff)
			}
		}},
		{"events off", "events: {enabled: false}\n", func(t *testing.T, ds *appsv1.DaemonSet, objs []object) {
			if got := args(t, ds)["events"]; !slices.Equal(got, []string{"false"}) {
				t.Errorf("--events = %q, want false", got)
			}
			for _, kind := range []string{"Role", "RoleBinding"} {
				if o := chartObject[object](t, objs, kind, eventsNamespace, name); o != nil {
					t.Errorf("%s %s/%s rendered with events.enabled false", kind, eventsNamespace, name)
				}
			}
		}},
		{"another uninstall switch", "uninstall: {configMapName: marksplit-off}\n", func(t *testing.T, ds *appsv1.DaemonSet, objs []object) {
			if got := args(t, ds)["uninstall-configmap"]; !slices.Equal(got, []string{"marksplit-off"}) {
				t.Errorf("--uninstall-configmap = %q, want marksplit-off", got)
			}
			role := chartObject[rbacv1.Role](t, objs, "Role", namespace, name)
			if role == nil || len(role.Rules) != 1 || !slices.Equal(role.Rules[0].ResourceNames, []string{"marksplit-off"}) {
				t.Errorf("Role %s/%s = %+v, want it to read the ConfigMap marksplit-off", namespace, name, role)
			}
		}},
		{"no uninstall switch", "uninstall: {configMapName: ''}\n", func(t *testing.T, ds *appsv1.DaemonSet, objs []object) {
			// Empty, not absent: the agent's default is the switch.
			if got := args(t, ds)["uninstall-configmap"]; !slices.Equal(got, []string{""}) {
				t.Errorf("--uninstall-configmap = %q, want it empty", got)
			}
			for _, kind := range []string{"Role", "RoleBinding"} {
				if o := chartObject[object](t, objs, kind, namespace, name); o != nil {
					t.Errorf("%s %s/%s rendered without a switch", kind, namespace, name)
				}
			}
		}},
		{"Cilium elsewhere", "cilium: {namespace: cilium, configMapName: cilium-config-2}\n", func(t *testing.T, ds *appsv1.DaemonSet, objs []object) {
			a := args(t, ds)
			if !slices.Equal(a["cilium-namespace"], []string{"cilium"}) || !slices.Equal(a["cilium-configmap"], []string{"cilium-config-2"}) {
				t.Errorf("--cilium-namespace %q, --cilium-configmap %q; want cilium, cilium-config-2", a["cilium-namespace"], a["cilium-configmap"])
			}
			role := chartObject[rbacv1.Role](t, objs, "Role", "cilium", ciliumConfigRole)
			if role == nil || len(role.Rules) != 1 || !slices.Equal(role.Rules[0].ResourceNames, []string{"cilium-config-2"}) {
				t.Errorf("Role cilium/%s = %+v, want it to read the ConfigMap cilium-config-2 alone", ciliumConfigRole, role)
			}
			if chartObject[object](t, objs, "RoleBinding", "cilium", ciliumConfigRole) == nil {
				t.Errorf("no RoleBinding cilium/%s", ciliumConfigRole)
			}
		}},
		{"encryption on reads no cilium-config", "encryption: 'on'\n", func(t *testing.T, _ *appsv1.DaemonSet, objs []object) {
			for _, kind := range []string{"Role", "RoleBinding"} {
				if o := chartObject[object](t, objs, kind, namespace, ciliumConfigRole); o != nil {
					t.Errorf("%s %s/%s rendered with encryption on", kind, namespace, ciliumConfigRole)
				}
			}
		}},
		{"pod monitor", "monitoring:\n  enabled: true\n  podMonitorLabels: {release: prometheus}\n  tlsConfig: {serverName: marksplit.kube-system, ca: {secret: {name: marksplit-metrics-ca, key: ca.crt}}}\n", func(t *testing.T, _ *appsv1.DaemonSet, objs []object) {
			pm := chartObject[monv1.PodMonitor](t, objs, "PodMonitor", namespace, name)
			if pm == nil {
				t.Fatal("no PodMonitor rendered")
			}
			wantLabels := map[string]string{appLabel: name, "app.kubernetes.io/component": "metrics", "release": "prometheus"}
			if diff := cmp.Diff(wantLabels, pm.Labels); diff != "" {
				t.Errorf("PodMonitor labels (-want +got):\n%s", diff)
			}
			serverName := "marksplit.kube-system"
			want := &monv1.SafeTLSConfig{
				ServerName: &serverName,
				CA: monv1.SecretOrConfigMap{Secret: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "marksplit-metrics-ca"}, Key: "ca.crt"}},
			}
			if diff := cmp.Diff(want, pm.Spec.PodMetricsEndpoints[0].TLSConfig); diff != "" {
				t.Errorf("tlsConfig (-want +got):\n%s", diff)
			}
		}},
		{"rule labels", "monitoring:\n  enabled: true\n  ruleLabels: {release: prometheus}\n", func(t *testing.T, _ *appsv1.DaemonSet, objs []object) {
			for _, o := range objs {
				if o["kind"] != "PrometheusRule" {
					continue
				}
				want := map[string]any{appLabel: name, "app.kubernetes.io/component": "alerts", "release": "prometheus"}
				if diff := cmp.Diff(want, o["metadata"].(map[string]any)["labels"]); diff != "" {
					t.Errorf("PrometheusRule labels (-want +got):\n%s", diff)
				}
				return
			}
			t.Error("no PrometheusRule rendered")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ds, objs := chartDaemonSet(t, tt.values)
			tt.check(t, ds, objs)
		})
	}
}

// TestChartLint runs `helm lint` (helm's lint package, with its default
// values and in kube-system, as strict as --strict) and fails on any message
// of severity warning or above. The one info it may print is the missing
// icon: the project has none.
func TestChartLint(t *testing.T) {
	for _, vals := range []map[string]any{
		nil,
		{"monitoring": map[string]any{"enabled": true}},
	} {
		linter := lint.All(chartDir, vals, namespace, true)
		for _, m := range linter.Messages {
			t.Logf("helm lint, values %v: %s", vals, m)
			if m.Severity >= support.WarningSev || !strings.Contains(m.Err.Error(), "icon is recommended") {
				t.Errorf("helm lint, values %v: %s", vals, m)
			}
		}
	}
}

// TestChartAgreesWithAgent: the chart accepts a table, priority, protocol,
// mark, link name or uninstall switch name exactly when the agent's own
// checks do (netwatch/reconcile's types, which the agent's flags parse with,
// and kubewatch.ValidName, which checks --uninstall-configmap), in the
// notation the chart takes: integers for table and priority, an integer, a
// decimal or a name for protocol, lowercase 0x hex for the mark. Prefixes
// are left out: the chart checks their form, the agent also their host bits;
// so are the listeners' addresses (TestChartRefuses, TestChartValues).
func TestChartAgreesWithAgent(t *testing.T) {
	accepts := func(vals map[string]any) bool {
		_, err := renderChart(t, vals)
		return err == nil
	}
	agree := func(t *testing.T, what string, vals map[string]any, agentErr error) {
		t.Helper()
		if chartOK, agentOK := accepts(vals), agentErr == nil; chartOK != agentOK {
			t.Errorf("%s: the chart accepts it: %v; the agent: %v (%v)", what, chartOK, agentOK, agentErr)
		}
	}
	neighbour := func(n string) error {
		if n != "" {
			return errors.New(n)
		}
		return nil
	}

	tables := []uint64{0, 1, 51, 52, 53, 199, 200, 201, 202, 203, 251, 252, 253, 254, 255, 256, 900, 2003, 2004, 2005, 2006, 1 << 31, 1<<32 - 1, 1 << 32}
	priorities := []uint64{0, 1, 2, 7, 8, 9, 10, 11, 19, 20, 21, 99, 100, 101, 108, 109, 112, 113, 900, 5209, 5210, 5240, 5270, 5271, 32765, 32766, 32767, 1 << 32}
	for _, shared := range []bool{false, true} {
		for _, n := range tables {
			var v reconcile.OwnTable
			err := v.Set(strconv.FormatUint(n, 10))
			if err == nil && !shared {
				err = neighbour(v.Shared())
			}
			agree(t, fmt.Sprintf("table %d, allowShared %v", n, shared), map[string]any{"table": n, "allowShared": shared}, err)
		}
		for _, n := range priorities {
			var v reconcile.OwnPriority
			err := v.Set(strconv.FormatUint(n, 10))
			if err == nil && !shared {
				err = neighbour(v.Shared())
			}
			agree(t, fmt.Sprintf("priority %d, allowShared %v", n, shared), map[string]any{"priority": n, "allowShared": shared}, err)
		}
	}

	// Every protocol number, as a number, in decimal, and by its iproute2
	// name where it has one.
	for n := range 257 {
		var v reconcile.OwnProtocol
		err := v.Set(strconv.Itoa(n))
		agree(t, fmt.Sprintf("protocol %d", n), map[string]any{"protocol": n}, err)
		agree(t, fmt.Sprintf("protocol %q", strconv.Itoa(n)), map[string]any{"protocol": strconv.Itoa(n)}, err)
		if n < 256 {
			if s := netwatch.Protocol(n).String(); s != strconv.Itoa(n) {
				agree(t, fmt.Sprintf("protocol %q", s), map[string]any{"protocol": s}, v.Set(s))
			}
		}
	}
	var p reconcile.OwnProtocol
	agree(t, `protocol "zebra"`, map[string]any{"protocol": "zebra"}, p.Set("zebra"))

	for _, m := range []string{
		"0xe00/0xf00", "0x1e00/0xf00", "0xe00/0x1f00", "0x1/0x1", "0x2/0x1", "0xffffffff/0xffffffff",
		"0x80000000/0xffffffff", "0x0/0xf00", "0xe00/0x0", "0x00000e00/0x00000f00",
		"0x100000000/0xffffffff", "0xf0f0/0xff0f", "0xf0f0/0xfff0",
	} {
		var v reconcile.MarkMask
		agree(t, "mark "+m, map[string]any{"mark": m}, v.Set(m))
	}

	// The uninstall switch's name, which the agent checks as a Kubernetes
	// name; empty is no switch to both.
	for _, n := range []string{
		"marksplit-uninstall", "", "a", "0", "a.b", "a-b", "a--b", "-a", "a-", ".a", "a.", "a..b", "a.-b",
		"A", "a_b", "a b", "é", strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 253),
		strings.Repeat("a", 254), strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 127),
	} {
		var err error
		if n != "" {
			err = kubewatch.ValidName(n)
		}
		agree(t, fmt.Sprintf("uninstall.configMapName %q", n), map[string]any{"uninstall": map[string]any{"configMapName": n}}, err)
	}

	for _, l := range []string{
		"cilium_wg0", "", "a", strings.Repeat("a", 15), strings.Repeat("a", 16), "wg/0", "wg:0", "wg 0",
		"wg\t0", "wg\n0", "wg\x010", "wg\x7f", ".", "..", "...", ".a", "..a", "a.", "éééééééé", "ééééééé",
		"wg\u00a00", "eth0.100", "br-1a2b", "wg#0",
	} {
		agree(t, fmt.Sprintf("tunnelLink %q", l), map[string]any{"tunnelLink": l}, reconcile.LinkName(l).Check())
		if l != "" {
			err := reconcile.LinkName(l).Check()
			if err == nil && l == "cilium_wg0" {
				err = errors.New("the tunnel link") // mtupolicy: the underlay link is not the tunnel link
			}
			agree(t, fmt.Sprintf("underlayLink %q", l), map[string]any{"peers": map[string]any{"auto": false, "underlayLink": l}}, err)
		}
	}
}

// TestChartNeverShipsTheSwitch: whatever the values, the chart renders no
// ConfigMap that is the uninstall switch: a `helm upgrade` must never create
// or delete it (docs/operations.md, "Uninstall").
func TestChartNeverShipsTheSwitch(t *testing.T) {
	for _, vals := range []map[string]any{
		nil,
		{"monitoring": map[string]any{"enabled": true}},
		{"uninstall": map[string]any{"configMapName": dashboardConfigMap + "-off"}, "monitoring": map[string]any{"enabled": true}},
	} {
		switchName := uninstallConfigMap
		if u, ok := vals["uninstall"].(map[string]any); ok {
			switchName = u["configMapName"].(string)
		}
		for _, o := range mustRenderChart(t, vals) {
			if o["kind"] != "ConfigMap" {
				continue
			}
			meta := o["metadata"].(map[string]any)
			if meta["name"] != dashboardConfigMap {
				t.Errorf("values %v: the chart renders the ConfigMap %v/%v; its only ConfigMap is the dashboard's", vals, meta["namespace"], meta["name"])
			}
			if meta["name"] == switchName {
				t.Errorf("values %v: the chart renders the uninstall switch %v", vals, switchName)
			}
		}
	}
}

// setFlag is a --set in a command of the docs: the value's path.
var setFlag = regexp.MustCompile(`--set '?([A-Za-z][A-Za-z0-9.]*)=`)

// TestChartDocs: every value the docs set with --set is one of the chart's,
// and the chart's README names every top-level value.
func TestChartDocs(t *testing.T) {
	c := loadChart(t)
	vals := chartutil.Values(c.Values)
	n := 0
	for _, f := range []string{"../docs/operations.md", filepath.Join(chartDir, "README.md")} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range setFlag.FindAllStringSubmatch(string(data), -1) {
			n++
			if _, err := vals.PathValue(m[1]); err != nil {
				if _, terr := vals.Table(m[1]); terr != nil {
					t.Errorf("%s: --set %s: the chart has no such value", f, m[1])
				}
			}
		}
		if strings.HasSuffix(f, "README.md") {
			for k := range c.Values {
				if !strings.Contains(string(data), "`"+k+"`") && !strings.Contains(string(data), "`"+k+".") {
					t.Errorf("%s does not name the value %s", f, k)
				}
			}
		}
	}
	if n == 0 {
		t.Error("no --set found in the docs: the pattern is wrong")
	}
}

// TestChartValueFlagsCovered: every flag a value of the chart renders is
// one extraArgs may not set (marksplit.valueFlags), whatever values render
// it; otherwise an extraArg would override a checked value (issue 31).
func TestChartValueFlagsCovered(t *testing.T) {
	flags := map[string]bool{}
	for _, vals := range []string{
		"",
		"peers: {auto: false, prefixes: [10.0.0.0/16], underlayLink: enp7s0}\nprotocol: kernel\nallowShared: true\n",
		"metrics: {tls: {secretName: tls}}\nevents: {enabled: false}\nnodeCondition: {enabled: true}\n",
	} {
		ds, _ := chartDaemonSet(t, vals)
		for _, a := range ds.Spec.Template.Spec.Containers[0].Args[1:] {
			f, _, _ := strings.Cut(a, "=")
			flags[f] = true
		}
	}
	if len(flags) < 18 {
		t.Errorf("the renders give %d flags, want every value's: %v", len(flags), flags)
	}
	for f := range flags {
		t.Run(f, func(t *testing.T) {
			_, err := renderChart(t, map[string]any{"extraArgs": []any{f + "=x"}})
			if err == nil || !strings.Contains(err.Error(), "extraArgs: "+f+" is set by a value") {
				t.Errorf("extraArgs [%s=x]: %v, want it refused as a value's flag", f, err)
			}
		})
	}
	// A flag no value sets still passes.
	if _, err := renderChart(t, map[string]any{"extraArgs": []any{"--node-name=n1"}}); err != nil {
		t.Errorf("extraArgs [--node-name=n1]: %v", err)
	}
}
