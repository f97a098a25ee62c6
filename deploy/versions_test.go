package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDefaultImageIsThisTree (issue 39, V11): the image the manifests
// name by default is the release this tree becomes, so that every flag a
// value renders is one that image takes. The manifests pass the flags of
// their own release; while they still named v0.1.0, `--path-mtu-probe` (a
// default) and `--node-condition` (nodeCondition.enabled) made that image
// exit 2 on every node. CHANGELOG.md's newest section names the release
// this tree becomes ("## vX.Y.Z", or "## vX.Y.Z (unreleased)" between
// releases): the kustomization's newTag and the chart's appVersion must be
// it, and the renders' flags must all be in `marksplit help` of this tree.
func TestDefaultImageIsThisTree(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## (.*)$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("CHANGELOG.md has no release section (## …)")
	}
	newest := strings.TrimSuffix(m[1], " (unreleased)")
	k := readKustomization(t)
	if len(k.Images) != 1 {
		t.Fatalf("kustomization.yaml: want one images entry, got %d", len(k.Images))
	}
	if tag := k.Images[0].NewTag; tag != newest {
		t.Errorf("kustomization.yaml newTag %s, but CHANGELOG.md's newest section is %q: the manifests "+
			"pass this tree's flags, which an older image may lack (exit 2 on every node); name the release this tree becomes", tag, m[1])
	}
	if app := loadChart(t).Metadata.AppVersion; app != newest {
		t.Errorf("Chart.yaml appVersion %s, but CHANGELOG.md's newest section is %q", app, m[1])
	}

	// Every value the chart offers that renders a flag, set.
	renders := []string{
		"",
		"peers: {auto: false, prefixes: [10.0.0.0/16], underlayLink: enp7s0}\nprotocol: kernel\nallowShared: true\n",
		"pathMTU: {declared: [10.1.0.0/16=1368], probe: false, learn: false}\nencryption: \"on\"\n",
		"metrics: {tls: {secretName: tls}}\nevents: {enabled: false}\nnodeCondition: {enabled: true}\nlogFormat: json\n",
		"uninstall: {configMapName: \"\"}\ncilium: {namespace: cilium, configMapName: cfg}\nmonitoring: {enabled: true}\n",
	}
	agent := agentHelpFlags(t)
	seen := map[string]bool{}
	for _, vals := range renders {
		ds, _ := chartDaemonSet(t, vals)
		for _, a := range ds.Spec.Template.Spec.Containers[0].Args[1:] {
			f, _, _ := strings.Cut(a, "=")
			seen[f] = true
			if !slices.Contains(agent, f) {
				t.Errorf("values %q render %s, which the default image (this tree's agent) does not take", vals, a)
			}
		}
	}
	for _, f := range []string{"--path-mtu", "--path-mtu-probe", "--path-mtu-learn", "--node-condition", "--prefix", "--underlay-link"} {
		if !seen[f] {
			t.Errorf("no render gave %s: the value sets above miss a value", f)
		}
	}
}
