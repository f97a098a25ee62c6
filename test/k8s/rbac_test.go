//go:build linux

package k8s

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// The deploy ClusterRole and Role, bound to the deploy ServiceAccount, let a
// real token do what the agent does (get, list and watch its CiliumNode;
// create and patch Events in default) and nothing more.
func TestK8sDeployRBAC(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 2*time.Minute)
	name := c.nodeName()
	if err := c.admin.createCiliumNode(ctx, name, 255); err != nil {
		t.Fatal(err)
	}
	token, err := c.token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sa := c.admin.withToken(token)

	b, err := sa.must(ctx, http.StatusOK, "GET", ciliumNodes+"/"+name, nil)
	if err != nil {
		t.Fatalf("the agent's read of its CiliumNode: %v", err)
	}
	var cn struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &cn); err != nil || cn.Metadata.ResourceVersion == "" {
		t.Fatalf("GET ciliumnode %s: no resourceVersion in %s", name, b)
	}
	sel := url.QueryEscape("metadata.name=" + name)
	patch := []byte(`{"spec":{"encryption":{"key":7}}}`)
	event := func(ns, evName string) map[string]any {
		return map[string]any{
			"apiVersion": "events.k8s.io/v1", "kind": "Event",
			"metadata":            map[string]string{"name": evName, "namespace": ns},
			"eventTime":           time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00"),
			"reportingController": "marksplit.io/agent", "reportingInstance": name,
			"action": "Test", "reason": "RBACTest", "type": "Normal", "note": "rbac test",
			"regarding": map[string]string{"kind": "Node", "apiVersion": "v1", "name": name, "uid": name},
		}
	}
	eventPath := "/apis/events.k8s.io/v1/namespaces/default/events"
	seriesPatch := []byte(`{"series":{"count":2,"lastObservedTime":"` + time.Now().UTC().Format("2006-01-02T15:04:05.000000Z07:00") + `"}}`)

	for _, tc := range []struct {
		name         string
		method, path string
		body         any
		want         int
	}{
		// What the agent needs.
		{"get ciliumnode", "GET", ciliumNodes + "/" + name, nil, http.StatusOK},
		{"list ciliumnodes by name", "GET", ciliumNodes + "?fieldSelector=" + sel, nil, http.StatusOK},
		{"watch ciliumnode by name", "GET", ciliumNodes + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=1&fieldSelector=" + sel +
			"&resourceVersion=" + cn.Metadata.ResourceVersion, nil, http.StatusOK},
		{"create an Event in default", "POST", eventPath, event("default", name+".rbac"), http.StatusCreated},
		{"patch its series", "PATCH", eventPath + "/" + name + ".rbac", seriesPatch, http.StatusOK},
		// What it must not be able to do.
		{"patch ciliumnode", "PATCH", ciliumNodes + "/" + name, patch, http.StatusForbidden},
		{"delete ciliumnode", "DELETE", ciliumNodes + "/" + name, nil, http.StatusForbidden},
		{"create ciliumnode", "POST", ciliumNodes, map[string]any{
			"apiVersion": "cilium.io/v2", "kind": "CiliumNode", "metadata": map[string]string{"name": name + "x"},
		}, http.StatusForbidden},
		{"list nodes", "GET", "/api/v1/nodes", nil, http.StatusForbidden},
		{"create an Event in kube-system", "POST", "/apis/events.k8s.io/v1/namespaces/kube-system/events", event("kube-system", name+".rbac"), http.StatusForbidden},
		{"list Events", "GET", eventPath, nil, http.StatusForbidden},
		{"delete an Event", "DELETE", eventPath + "/" + name + ".rbac", nil, http.StatusForbidden},
		{"create a core Event", "POST", "/api/v1/namespaces/default/events", event("default", name+".core"), http.StatusForbidden},
		{"get the node", "GET", "/api/v1/nodes/" + name, nil, http.StatusForbidden},
		{"list secrets", "GET", "/api/v1/namespaces/" + c.sa.Metadata.Namespace + "/secrets", nil, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct := "application/json"
			if tc.method == "PATCH" {
				ct = "application/merge-patch+json"
			}
			code, body, err := sa.doType(ctx, tc.method, tc.path, ct, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.want {
				t.Errorf("%s %s: status %d, want %d: %s", tc.method, tc.path, code, tc.want, body)
			}
		})
	}
}
