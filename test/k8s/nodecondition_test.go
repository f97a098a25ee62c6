//go:build linux

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The opt-in Node condition (deploy/node-condition), against the real API
// server: the agent sets MarkSplitReady on its own Node as the split comes
// and goes, with a token bound to a Pod on that node as the kubelet mounts
// it; the shipped ValidatingAdmissionPolicy refuses the same token on
// another Node, on another condition or field, and a token that names no
// node at all.

// nodeConditionManifests applies deploy/node-condition's objects as
// shipped, removed when t ends, and waits until the policy denies (a
// ValidatingAdmissionPolicy takes effect a moment after it is created).
func (c *cluster) nodeConditionManifests(t *testing.T, ctx context.Context) {
	t.Helper()
	var objs []object
	for _, f := range []string{"rbac.yaml", "policy.yaml"} {
		b, err := os.ReadFile(filepath.Join(c.repo, "deploy", "node-condition", f))
		if err != nil {
			t.Fatal(err)
		}
		o, err := parseManifests(b)
		if err != nil {
			t.Fatalf("deploy/node-condition/%s: %v", f, err)
		}
		objs = append(objs, o...)
	}
	for _, o := range objs {
		if err := c.admin.create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.admin.delete(context.Background(), o) })
	}
}

// createNode creates a Node object named name (no kubelet behind it).
func (k *kube) createNode(ctx context.Context, name string) error {
	_, err := k.must(ctx, http.StatusCreated, "POST", "/api/v1/nodes", map[string]any{
		"apiVersion": "v1", "kind": "Node",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"kubernetes.io/hostname": name}},
	})
	return err
}

// podToken creates a Pod of the agent's ServiceAccount on node (as the
// DaemonSet controller does; nothing runs it) and returns a token bound to
// it, as the kubelet mounts in the pod: the API server records the pod's
// node in the token (user extra authentication.kubernetes.io/node-name).
func (c *cluster) podToken(t *testing.T, ctx context.Context, node string) string {
	t.Helper()
	return c.podTokenFor(t, ctx, c.sa.Metadata.Namespace, c.sa.Metadata.Name, node)
}

// podTokenFor is podToken for ServiceAccount ns/sa.
func (c *cluster) podTokenFor(t *testing.T, ctx context.Context, ns, sa, node string) string {
	t.Helper()
	b, err := c.admin.must(ctx, http.StatusCreated, "POST", "/api/v1/namespaces/"+ns+"/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "marksplit-" + node, "labels": map[string]any{"app.kubernetes.io/name": "marksplit"}},
		"spec": map[string]any{
			"nodeName": node, "serviceAccountName": sa,
			"containers": []any{map[string]any{"name": "marksplit", "image": "ghcr.io/marksplit/marksplit:v0.2.0"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var pod struct {
		Metadata struct{ Name, UID string } `json:"metadata"`
	}
	if err := json.Unmarshal(b, &pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.admin.do(context.Background(), "DELETE", "/api/v1/namespaces/"+ns+"/pods/"+pod.Metadata.Name+"?gracePeriodSeconds=0", nil)
	})
	b, err = c.admin.must(ctx, http.StatusCreated, "POST", "/api/v1/namespaces/"+ns+"/serviceaccounts/"+sa+"/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"expirationSeconds": 3600,
			"boundObjectRef": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": pod.Metadata.Name, "uid": pod.Metadata.UID}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		Status struct{ Token string } `json:"status"`
	}
	if err := json.Unmarshal(b, &tr); err != nil || tr.Status.Token == "" {
		t.Fatalf("TokenRequest: %v %s", err, b)
	}
	return tr.Status.Token
}

type nodeCondition struct {
	Type, Status, Reason, Message         string
	LastTransitionTime, LastHeartbeatTime string
}

// condition returns node's condition typ, or an error when it has none.
func (k *kube) condition(ctx context.Context, node, typ string) (nodeCondition, error) {
	b, err := k.must(ctx, http.StatusOK, "GET", "/api/v1/nodes/"+node, nil)
	if err != nil {
		return nodeCondition{}, err
	}
	var n struct {
		Status struct{ Conditions []nodeCondition } `json:"status"`
	}
	if err := json.Unmarshal(b, &n); err != nil {
		return nodeCondition{}, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c, nil
		}
	}
	return nodeCondition{}, fmt.Errorf("node %s has no condition %s: %+v", node, typ, n.Status.Conditions)
}

// waitCondition waits until node's MarkSplitReady has status and reason.
func (c *cluster) waitCondition(t *testing.T, node, status, reason string) nodeCondition {
	t.Helper()
	var got nodeCondition
	// The agent writes its condition at most once per 10 s (a change right
	// after a write waits for the rest): a deadline only a hang can reach.
	eventually(t, 2*time.Minute, "MarkSplitReady "+status+" "+reason+" on "+node, func() error {
		var err error
		got, err = c.admin.condition(context.Background(), node, "MarkSplitReady")
		if err == nil && (got.Status != status || got.Reason != reason) {
			err = fmt.Errorf("MarkSplitReady %s %s: %s", got.Status, got.Reason, got.Message)
		}
		return err
	})
	return got
}

// statusPatch PATCHes node's status with a strategic-merge patch as token.
func (c *cluster) statusPatch(ctx context.Context, token, node string, patch map[string]any) (int, string, error) {
	code, b, err := c.admin.withToken(token).doType(ctx, "PATCH", "/api/v1/nodes/"+node+"/status", "application/strategic-merge-patch+json", patch)
	return code, string(b), err
}

func condPatch(typ, status string) map[string]any {
	now := time.Now().UTC().Format(time.RFC3339)
	return map[string]any{"status": map[string]any{"conditions": []any{map[string]any{
		"type": typ, "status": status, "reason": "Test", "message": "from the test",
		"lastHeartbeatTime": now, "lastTransitionTime": now}}}}
}

func TestKernelK8sNodeCondition(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 3*time.Minute)
	c.nodeConditionManifests(t, ctx)
	name, other := c.nodeName(), c.nodeName()
	for _, nd := range []string{name, other} {
		if err := c.admin.createNode(ctx, nd); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.admin.do(context.Background(), "DELETE", "/api/v1/nodes/"+nd, nil) })
	}
	if err := c.admin.createCiliumNode(ctx, name, 255); err != nil {
		t.Fatal(err)
	}
	token := c.podToken(t, ctx, name)

	// The policy, as shipped, before any agent: the bound token may set
	// MarkSplitReady on its own Node and nothing else. (A new policy takes
	// effect a moment after it is created: wait for the first denial.)
	eventually(t, watchDeadline, "the policy denies a write to another Node", func() error {
		code, body, err := c.statusPatch(ctx, token, other, condPatch("MarkSplitReady", "True"))
		if err == nil && (code != http.StatusForbidden || !strings.Contains(body, "own Node only")) {
			err = fmt.Errorf("PATCH of node %s's status with %s's token: %d %s", other, name, code, body)
		}
		return err
	})
	unbound, err := c.token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		what, token, node string
		patch             map[string]any
		code              int
		want              string
	}{
		{"own Node, its condition", token, name, condPatch("MarkSplitReady", "False"), http.StatusOK, ""},
		{"another Node", token, other, condPatch("MarkSplitReady", "True"), http.StatusForbidden, "own Node only"},
		{"another condition", token, name, condPatch("Ready", "False"), http.StatusForbidden, "MarkSplitReady condition only"},
		{"a label through the status", token, name, map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "y"}}}, http.StatusForbidden, "MarkSplitReady condition only"},
		{"an address", token, name, map[string]any{"status": map[string]any{"addresses": []any{map[string]any{"type": "InternalIP", "address": "10.9.9.9"}}}}, http.StatusForbidden, "MarkSplitReady condition only"},
		{"a token that names no node", unbound, name, condPatch("MarkSplitReady", "True"), http.StatusForbidden, "own Node only"},
	} {
		code, body, err := c.statusPatch(ctx, tt.token, tt.node, tt.patch)
		if err != nil {
			t.Fatal(err)
		}
		if code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("%s: %d %.300s, want %d with %q", tt.what, code, body, tt.code, tt.want)
		}
	}

	c.refusesFields(t, ctx, token, name, other)

	// The agent sets it as the split comes and goes.
	n := c.newNode(t)
	a := c.launchToken(t, n, name, token, []string{"run", "--encryption=auto", "--prefix=10.0.0.0/16", "--metrics-addr=", "--node-condition=MarkSplitReady"})
	t.Cleanup(func() { a.finish(t) })
	eventually(t, watchDeadline, "split", func() error { return firstErr(a.alive(), n.splitOn()) })
	on := c.waitCondition(t, name, "True", "SplitInPlace")
	t.Logf("MarkSplitReady: %+v", on)
	if !strings.Contains(on.Message, "rule 900") {
		t.Errorf("message %q does not name the rule", on.Message)
	}

	// The tunnel link goes: False, TunnelLinkMissing.
	if out, err := exec.Command("ip", "-n", n.ns, "link", "del", "cilium_wg0").CombinedOutput(); err != nil {
		t.Fatalf("ip link del cilium_wg0: %v: %s", err, out)
	}
	off := c.waitCondition(t, name, "False", "TunnelLinkMissing")
	if off.LastTransitionTime == "" {
		t.Errorf("no lastTransitionTime: %+v", off)
	}
	// Opted out: True again, NotEncrypting.
	if err := c.admin.setEncryptionKey(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	c.waitCondition(t, name, "True", "NotEncrypting")
	// The agent never wrote the other Node's (the only writes there are the
	// test's probes, which may land before the new policy takes effect).
	if got, err := c.admin.condition(ctx, other, "MarkSplitReady"); err == nil && got.Reason != "Test" {
		t.Errorf("node %s has MarkSplitReady %+v, not from the test's probe", other, got)
	}
}

// fieldPatches are the writes of the red team's V2 (issue 38) and more: each
// changes one field of a Node other than its MarkSplitReady condition,
// through nodes/status, as the agent's token could. The policy refuses
// each; only the condition may change.
func fieldPatches(other string) map[string]map[string]any {
	md := func(k string, v any) map[string]any { return map[string]any{"metadata": map[string]any{k: v}} }
	st := func(k string, v any) map[string]any { return map[string]any{"status": map[string]any{k: v}} }
	return map[string]map[string]any{
		// A forged owner: the garbage collector would delete the Node.
		"ownerReferences": md("ownerReferences", []any{map[string]any{"apiVersion": "v1", "kind": "Node", "name": other,
			"uid": "6b1b5d2e-0000-4000-8000-000000000001"}}),
		"finalizers":      md("finalizers", []any{"example.com/hold"}),
		"annotations":     md("annotations", map[string]any{"example.com/x": "y"}),
		"images":          st("images", []any{map[string]any{"names": []any{"example.com/evil:1"}, "sizeBytes": 1}}),
		"volumesInUse":    st("volumesInUse", []any{"kubernetes.io/csi/evil^1"}),
		"volumesAttached": st("volumesAttached", []any{map[string]any{"name": "kubernetes.io/csi/evil^1", "devicePath": "/dev/evil"}}),
		"capacity":        st("capacity", map[string]any{"example.com/gpu": "8"}),
		"phase":           st("phase", "Terminated"),
		// The condition changes too, as an agent's write would: the
		// other field must still refuse the whole write.
		"a condition and a finalizer": map[string]any{
			"metadata": map[string]any{"finalizers": []any{"example.com/hold"}},
			"status":   condPatch("MarkSplitReady", "True")["status"]},
	}
}

// refusesFields checks that token (bound to a pod on node) may change no
// field of node but its condition, and nothing at all on other.
func (c *cluster) refusesFields(t *testing.T, ctx context.Context, token, node, other string) {
	t.Helper()
	for what, patch := range fieldPatches(other) {
		code, body, err := c.statusPatch(ctx, token, node, patch)
		if err != nil {
			t.Fatal(err)
		}
		if code != http.StatusForbidden || !strings.Contains(body, "MarkSplitReady condition only") {
			t.Errorf("%s on its own Node: %d %.300s, want 403 naming the MarkSplitReady condition", what, code, body)
		}
	}
	code, body, err := c.statusPatch(ctx, token, other, condPatch("MarkSplitReady", "True"))
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusForbidden || !strings.Contains(body, "own Node only") {
		t.Errorf("MarkSplitReady on another Node: %d %.300s, want 403", code, body)
	}
	code, body, err = c.statusPatch(ctx, token, node, condPatch("MarkSplitReady", "False"))
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK {
		t.Errorf("MarkSplitReady on its own Node: %d %.300s, want 200", code, body)
	}
}

// kustomizeOverlay renders, with `kubectl kustomize`, an overlay beside a
// copy of deploy/ that adds the node-condition component and the lines of
// edits (namePrefix: prod-, …), and returns its objects but the DaemonSet.
func (c *cluster) kustomizeOverlay(t *testing.T, edits string) []object {
	t.Helper()
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		skipOrFail(t, "kubectl not found on PATH: it renders the kustomize overlays")
	}
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join(c.repo, "deploy"), dir).CombinedOutput(); err != nil {
		t.Fatalf("cp deploy: %v: %s", err, out)
	}
	overlay := filepath.Join(dir, "overlay")
	if err := os.Mkdir(overlay, 0o755); err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy\ncomponents:\n  - ../deploy/node-condition\n" + edits + "\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl, "kustomize", overlay).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize (%s): %v", edits, err)
	}
	objs, err := parseManifests(out)
	if err != nil {
		t.Fatal(err)
	}
	var keep []object
	for _, o := range objs {
		if o.Kind != "DaemonSet" {
			keep = append(keep, o)
		}
	}
	return keep
}

// V1 of issue 38: an overlay that renames the agent (namePrefix,
// nameSuffix) keeps it under the policy. The renamed ServiceAccount's token,
// bound to a pod on its node, may set MarkSplitReady there and nothing
// else, and nothing on another Node.
func TestKernelK8sNodeConditionOverlays(t *testing.T) {
	c := need(t)
	for _, tt := range []struct{ name, edits, sa string }{
		{"namePrefix", "namePrefix: prod-", "prod-marksplit"},
		{"nameSuffix", "nameSuffix: -blue", "marksplit-blue"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := ctxFor(t, 3*time.Minute)
			for _, o := range c.kustomizeOverlay(t, tt.edits) {
				if err := c.admin.create(ctx, o); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.admin.delete(context.Background(), o) })
			}
			name, other := c.nodeName(), c.nodeName()
			for _, nd := range []string{name, other} {
				if err := c.admin.createNode(ctx, nd); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.admin.do(context.Background(), "DELETE", "/api/v1/nodes/"+nd, nil) })
			}
			token := c.podTokenFor(t, ctx, "kube-system", tt.sa, name)
			eventually(t, 2*time.Minute, "the policy denies a write to another Node", func() error {
				code, body, err := c.statusPatch(ctx, token, other, condPatch("MarkSplitReady", "True"))
				if err == nil && (code != http.StatusForbidden || !strings.Contains(body, "own Node only")) {
					err = fmt.Errorf("PATCH of node %s's status with %s's token: %d %s", other, name, code, body)
				}
				return err
			})
			if code, body, err := c.statusPatch(ctx, token, name, condPatch("Ready", "False")); err != nil || code != http.StatusForbidden {
				t.Errorf("Ready on its own Node: %d %.300s %v, want 403", code, body, err)
			}
			c.refusesFields(t, ctx, token, name, other)
		})
	}
}
