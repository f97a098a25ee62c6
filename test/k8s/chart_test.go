//go:build linux

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The chart's values the API server has to take: a pinned digest and the
// rollout pace, rendered by helm and by kustomize and applied to the real
// API server; and helm test, run by helm against it, passing while the
// split is in place on worker-1 and failing once it is not.

const testDigestK8s = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// dryRunDaemonSet sends the DaemonSet of a rendered manifest to the API
// server with dryRun=All (validated and defaulted, not stored) and returns
// what it would store, or the status code and body of a refusal.
func (c *cluster) dryRunDaemonSet(ctx context.Context, manifest string, edit func(map[string]any)) (map[string]any, int, string, error) {
	objs, err := parseManifests([]byte(manifest))
	if err != nil {
		return nil, 0, "", err
	}
	for _, o := range objs {
		if o.Kind != "DaemonSet" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(o.raw, &m); err != nil {
			return nil, 0, "", err
		}
		if edit != nil {
			edit(m)
		}
		code, b, err := c.admin.do(ctx, "POST", "/apis/apps/v1/namespaces/kube-system/daemonsets?dryRun=All", m)
		if err != nil || code != http.StatusCreated {
			return nil, code, string(b), err
		}
		var got map[string]any
		return got, code, "", json.Unmarshal(b, &got)
	}
	return nil, 0, "", fmt.Errorf("no DaemonSet in the manifest")
}

func dig(m any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			mm, _ := m.(map[string]any)
			m = mm[k]
		case int:
			l, _ := m.([]any)
			if k >= len(l) {
				return nil
			}
			m = l[k]
		}
	}
	return m
}

func TestKernelK8sChartDigestAndPace(t *testing.T) {
	c := need(t)
	helm, err := helmBin()
	if err != nil {
		t.Fatalf("helm: %v", err)
	}
	ctx := ctxFor(t, 2*time.Minute)
	e := c.newDocEnv(t, c.newNode(t), helm)
	for _, tt := range []struct {
		name, render string
		image        string
		pace         any
	}{
		{"chart defaults", "helm template marksplit charts/marksplit -n kube-system", "ghcr.io/marksplit/marksplit:v0.2.0", "10%"},
		{"chart digest and a number", "helm template marksplit charts/marksplit -n kube-system --set image.digest=" + testDigestK8s + " --set updateStrategy.maxUnavailable=3",
			"ghcr.io/marksplit/marksplit:v0.2.0@" + testDigestK8s, float64(3)},
		{"chart percentage", "helm template marksplit charts/marksplit -n kube-system --set updateStrategy.maxUnavailable=25%", "ghcr.io/marksplit/marksplit:v0.2.0", "25%"},
		{"kustomize defaults", "kubectl kustomize deploy/", "ghcr.io/marksplit/marksplit:v0.2.0", "10%"},
		{"kustomize digest", "sed -i 's/^    newTag: v0.2.0$/    newTag: v0.2.0\\n    digest: " + testDigestK8s + "/' deploy/kustomization.yaml && kubectl kustomize deploy/",
			"ghcr.io/marksplit/marksplit:v0.2.0@" + testDigestK8s, "10%"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, code := e.run(t, "", tt.render)
			if code != 0 {
				t.Fatalf("%s: exit %d\n%s", tt.render, code, out)
			}
			got, code, body, err := c.dryRunDaemonSet(ctx, out, nil)
			if err != nil || got == nil {
				t.Fatalf("the API server refused the DaemonSet: %d %s %v", code, body, err)
			}
			if img := dig(got, "spec", "template", "spec", "containers", 0, "image"); img != tt.image {
				t.Errorf("image %v, want %s", img, tt.image)
			}
			if p := dig(got, "spec", "updateStrategy", "rollingUpdate", "maxUnavailable"); p != tt.pace {
				t.Errorf("maxUnavailable %v (%T), want %v", p, p, tt.pace)
			}
		})
	}
	// What the chart's schema refuses, the API server refuses too: a pace
	// of 0 with maxSurge 0 would never roll out.
	out, _ := e.run(t, "", "helm template marksplit charts/marksplit -n kube-system")
	_, code, body, err := c.dryRunDaemonSet(ctx, out, func(m map[string]any) {
		dig(m, "spec", "updateStrategy", "rollingUpdate").(map[string]any)["maxUnavailable"] = 0
	})
	if err != nil || code != http.StatusUnprocessableEntity || !strings.Contains(body, "maxUnavailable") {
		t.Errorf("maxUnavailable 0: %d %s %v, want 422 naming maxUnavailable", code, body, err)
	}
	if out, code := e.run(t, "", "helm template marksplit charts/marksplit -n kube-system --set updateStrategy.maxUnavailable=0"); code == 0 || !strings.Contains(out, "maxUnavailable") {
		t.Errorf("the chart rendered maxUnavailable 0 (exit %d):\n%s", code, out)
	}
}

// helm test, run by helm against the API server, with the test playing the
// kubelet (standIn): Succeeded while worker-1's split is in place for the
// peer, Failed once the uninstall switch has removed it.
func TestKernelK8sHelmTest(t *testing.T) {
	c := need(t)
	needAgent(t)
	helm, err := helmBin()
	if err != nil {
		t.Fatalf("helm: %v", err)
	}
	ctx := ctxFor(t, 5*time.Minute)
	for _, o := range c.rbac {
		c.admin.delete(ctx, o)
	}
	t.Cleanup(func() { c.restoreManifests(t) })
	for _, nd := range []struct{ name, ip string }{{"worker-1", "10.0.0.5"}, {"worker-2", "10.0.0.9"}} {
		if err := firstErr(c.admin.createNode(ctx, nd.name), c.admin.createPeerNode(ctx, nd.name, nd.ip)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.admin.do(context.Background(), "DELETE", "/api/v1/nodes/"+nd.name, nil)
			c.admin.do(context.Background(), "DELETE", ciliumNodes+"/"+nd.name, nil)
		})
	}
	n := c.newNode(t)
	e := c.newDocEnv(t, n, helm)
	s := &standIn{c: c, e: e, log: t.Logf, ran: map[string]bool{}}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.run(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	t.Cleanup(func() { e.run(t, "", "helm uninstall marksplit -n kube-system --wait") })

	out, code := e.run(t, "", `set -e
helm install marksplit charts/marksplit -n kube-system --set tests.node=worker-1 --set tests.peer=10.0.0.9
kubectl -n kube-system rollout status daemonset/marksplit --timeout=2m
helm test marksplit -n kube-system`)
	t.Logf("%s", out)
	if code != 0 || !strings.Contains(out, "Succeeded") {
		t.Fatalf("helm test with the split in place: exit %d, want Succeeded", code)
	}
	if err := n.splitOn(); err != nil {
		t.Fatal(err)
	}
	out, code = e.run(t, "", `kubectl -n kube-system create configmap marksplit-uninstall
for i in $(seq 100); do ip rule | grep -q '^900:' || break; sleep 0.1; done
helm test marksplit -n kube-system`)
	t.Logf("%s", out)
	if code == 0 || !strings.Contains(out, "Failed") {
		t.Errorf("helm test with the split removed: exit %d, want a failed test", code)
	}
	if err := n.splitOff(); err != nil {
		t.Errorf("the switch did not remove the split: %v", err)
	}
}

// TestKernelK8sHelmTakeOver: docs/operations.md's ways into Helm, each
// followed by the doc's upgrades, with real kubectl and helm against the
// API server. Taken over from `kubectl apply -k deploy/`, an upgrade that
// changes a field kubectl applied conflicts with kubectl's field manager
// (Helm 4 applies server-side), and succeeds with --force-conflicts, as the
// doc says; a fresh Helm install upgrades without it. No kubelet is needed:
// the test reads the DaemonSet the API server holds.
func TestKernelK8sHelmTakeOver(t *testing.T) {
	c := need(t)
	helm, err := helmBin()
	if err != nil {
		t.Fatalf("helm: %v", err)
	}
	ctx := ctxFor(t, 5*time.Minute)
	for _, o := range c.rbac {
		c.admin.delete(ctx, o)
	}
	t.Cleanup(func() { c.restoreManifests(t) })
	e := c.newDocEnv(t, c.newNode(t), helm)
	t.Cleanup(func() {
		e.run(t, "", "helm uninstall marksplit -n kube-system --wait; kubectl delete -k deploy/ --ignore-not-found")
	})
	args := func() string {
		t.Helper()
		_, b, err := c.admin.do(ctx, "GET", dsPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	step := func(script string, wantOK bool, want ...string) {
		t.Helper()
		out, code := e.run(t, "", script)
		t.Logf("%s: exit %d\n%s", script, code, out)
		if (code == 0) != wantOK {
			t.Fatalf("%s: exit %d, want success %v", script, code, wantOK)
		}
		ds := args()
		for _, w := range want {
			if !strings.Contains(ds, w) {
				t.Errorf("after %s: the DaemonSet lacks %q", script, w)
			}
		}
	}
	const upgrade = "helm upgrade marksplit charts/marksplit -n kube-system --reset-then-reuse-values"

	// Taken over from kustomize.
	step("kubectl apply -k deploy/", true)
	step("helm install marksplit charts/marksplit -n kube-system --take-ownership", true)
	out, code := e.run(t, "", upgrade+" --set updateStrategy.maxUnavailable=1")
	if code == 0 || !strings.Contains(out, "kubectl-client-side-apply") {
		t.Errorf("after a take-over, an upgrade of the pace without --force-conflicts: exit %d, want the conflict the doc names:\n%s", code, out)
	}
	step(upgrade+" --force-conflicts --set updateStrategy.maxUnavailable=1", true, `"maxUnavailable":1`)
	step(upgrade+" --force-conflicts --set table=901 --set priority=901", true, `--table=901`, `--priority=901`)
	step(upgrade+" --force-conflicts", true, `--table=901`)

	// Installed fresh by Helm: the same upgrades need nothing more.
	step("helm uninstall marksplit -n kube-system --wait", true)
	step("helm install marksplit charts/marksplit -n kube-system", true)
	step(upgrade+" --set updateStrategy.maxUnavailable=1", true, `"maxUnavailable":1`)
	step(upgrade+" --set table=901 --set priority=901", true, `--table=901`, `--priority=901`)
}
