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
	ns := c.sa.Metadata.Namespace
	b, err := c.admin.must(ctx, http.StatusCreated, "POST", "/api/v1/namespaces/"+ns+"/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "marksplit-" + node, "labels": map[string]any{"app.kubernetes.io/name": "marksplit"}},
		"spec": map[string]any{
			"nodeName": node, "serviceAccountName": c.sa.Metadata.Name,
			"containers": []any{map[string]any{"name": "marksplit", "image": "ghcr.io/marksplit/marksplit:v0.1.0"}},
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
	b, err = c.admin.must(ctx, http.StatusCreated, "POST", "/api/v1/namespaces/"+ns+"/serviceaccounts/"+c.sa.Metadata.Name+"/token", map[string]any{
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
	eventually(t, watchDeadline, "MarkSplitReady "+status+" "+reason+" on "+node, func() error {
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
