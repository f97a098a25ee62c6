package deploy

import (
	"testing"
)

// The node-condition component's admission policy follows the agent under
// any overlay that renames it: the binding's paramRef names the
// ClusterRoleBinding that grants patch on nodes/status, whose subject is the
// DaemonSet's ServiceAccount by its new name and namespace, and the binding
// names the policy by its new name. (The policy itself matches whoever
// that ClusterRoleBinding grants: test/k8s holds it against a real API
// server with these overlays.)
func TestNodeConditionOverlays(t *testing.T) {
	for _, tt := range []struct {
		name string
		o    kustomizeOpts
	}{
		{"as shipped", kustomizeOpts{}},
		{"namePrefix", kustomizeOpts{namePrefix: "prod-"}},
		{"nameSuffix", kustomizeOpts{nameSuffix: "-blue"}},
		{"both", kustomizeOpts{namePrefix: "prod-", nameSuffix: "-blue"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.o
			o.nodeCondition = true
			byKind := map[string][]object{}
			for _, obj := range kustomizeObjects(t, o) {
				k, _ := obj["kind"].(string)
				byKind[k] = append(byKind[k], obj)
			}
			str := func(o object, path ...any) string { s, _ := dig(o, path...).(string); return s }
			one := func(kind string) object {
				t.Helper()
				if len(byKind[kind]) != 1 {
					t.Fatalf("%d %s objects, want 1", len(byKind[kind]), kind)
				}
				return byKind[kind][0]
			}
			ds, vap, vapb := one("DaemonSet"), one("ValidatingAdmissionPolicy"), one("ValidatingAdmissionPolicyBinding")
			sa, ns := str(ds, "spec", "template", "spec", "serviceAccountName"), str(ds, "metadata", "namespace")
			wantName := o.namePrefix + "marksplit" + o.nameSuffix
			if sa != wantName {
				t.Errorf("the DaemonSet's ServiceAccount is %q, want %q", sa, wantName)
			}
			// The ClusterRoleBinding that grants the node-condition role.
			var crb object
			for _, b := range byKind["ClusterRoleBinding"] {
				if str(b, "roleRef", "name") == o.namePrefix+"marksplit-node-condition"+o.nameSuffix {
					crb = b
				}
			}
			if crb == nil {
				t.Fatalf("no ClusterRoleBinding of the node-condition ClusterRole")
			}
			if got, want := str(vapb, "spec", "policyName"), str(vap, "metadata", "name"); got != want {
				t.Errorf("the binding names policy %q, the policy is %q", got, want)
			}
			if got, want := str(vapb, "spec", "paramRef", "name"), str(crb, "metadata", "name"); got != want {
				t.Errorf("the binding's paramRef names %q, the ClusterRoleBinding is %q: the policy would not see the agent", got, want)
			}
			if got := str(vapb, "spec", "paramRef", "parameterNotFoundAction"); got != "Allow" {
				t.Errorf("parameterNotFoundAction %q, want Allow (Deny would block every Node's status once the binding is gone)", got)
			}
			if got := str(vap, "spec", "paramKind", "kind"); got != "ClusterRoleBinding" {
				t.Errorf("paramKind %q, want ClusterRoleBinding", got)
			}
			subj, _ := dig(crb, "subjects", 0).(map[string]any)
			if subj["kind"] != "ServiceAccount" || subj["name"] != sa || subj["namespace"] != ns {
				t.Errorf("the ClusterRoleBinding grants %v, want ServiceAccount %s/%s (the DaemonSet's)", subj, ns, sa)
			}
		})
	}
}

// dig returns the value at path in m (string keys, int indexes), or nil.
func dig(m any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			o, _ := m.(map[string]any)
			m = o[k]
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
