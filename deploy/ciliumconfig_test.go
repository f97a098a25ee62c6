package deploy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// ciliumConfigRole is the Role (and RoleBinding) that lets the agent read Cilium's
// cilium-config for encrypt-node with --encryption=auto.
const ciliumConfigRole = "marksplit-cilium-config"

// testCiliumConfigRole checks the Role and RoleBinding of cilium-config: get, list and
// watch on that one ConfigMap in Cilium's namespace, bound to the agent's account alone.
func testCiliumConfigRole(t *testing.T, r, b runtime.Object, ciliumNS, configMap string) {
	t.Helper()
	role, ok1 := r.(*rbacv1.Role)
	binding, ok2 := b.(*rbacv1.RoleBinding)
	if !ok1 || !ok2 {
		t.Fatalf("got %T and %T, want the Role and RoleBinding of %s", r, b, configMap)
	}
	if role.Name != ciliumConfigRole || role.Namespace != ciliumNS {
		t.Errorf("Role = %s/%s, want %s/%s", role.Namespace, role.Name, ciliumNS, ciliumConfigRole)
	}
	wantRules := []rbacv1.PolicyRule{{
		APIGroups:     []string{""},
		Resources:     []string{"configmaps"},
		ResourceNames: []string{configMap},
		Verbs:         []string{"get", "list", "watch"},
	}}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("Role %s rules (-want +got):\n%s", ciliumConfigRole, diff)
	}
	if binding.Name != ciliumConfigRole || binding.Namespace != ciliumNS {
		t.Errorf("RoleBinding = %s/%s, want %s/%s", binding.Namespace, binding.Name, ciliumNS, ciliumConfigRole)
	}
	wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: ciliumConfigRole}
	if diff := cmp.Diff(wantRef, binding.RoleRef); diff != "" {
		t.Errorf("RoleBinding roleRef (-want +got):\n%s", diff)
	}
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: namespace}}
	if diff := cmp.Diff(wantSubjects, binding.Subjects); diff != "" {
		t.Errorf("RoleBinding subjects (-want +got):\n%s", diff)
	}
}
