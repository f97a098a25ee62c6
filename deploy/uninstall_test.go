package deploy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// uninstallConfigMap is the uninstall switch: the DaemonSet names it, the
// Role reads it and nothing else, and no manifest ships it.
const uninstallConfigMap = "marksplit-uninstall"

// testUninstallRole checks the Role and RoleBinding of rbac.yaml: get, list
// and watch on the one ConfigMap, in the agent's namespace, for its
// ServiceAccount.
func testUninstallRole(t *testing.T, r, b runtime.Object) {
	t.Helper()
	role, ok1 := r.(*rbacv1.Role)
	binding, ok2 := b.(*rbacv1.RoleBinding)
	if !ok1 || !ok2 {
		t.Fatalf("rbac.yaml: objects 4 and 5 are %T and %T, want Role and RoleBinding", r, b)
	}
	if role.Name != name || role.Namespace != namespace {
		t.Errorf("Role = %s/%s, want %s/%s", role.Namespace, role.Name, namespace, name)
	}
	wantRules := []rbacv1.PolicyRule{{
		APIGroups:     []string{""},
		Resources:     []string{"configmaps"},
		ResourceNames: []string{uninstallConfigMap},
		Verbs:         []string{"get", "list", "watch"},
	}}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("Role rules (-want +got):\n%s", diff)
	}
	if binding.Name != name || binding.Namespace != namespace {
		t.Errorf("RoleBinding = %s/%s, want %s/%s", binding.Namespace, binding.Name, namespace, name)
	}
	wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name}
	if diff := cmp.Diff(wantRef, binding.RoleRef); diff != "" {
		t.Errorf("RoleBinding roleRef (-want +got):\n%s", diff)
	}
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: namespace}}
	if diff := cmp.Diff(wantSubjects, binding.Subjects); diff != "" {
		t.Errorf("RoleBinding subjects (-want +got):\n%s", diff)
	}
}

// testUninstallEnv checks the container's environment for the switch: its
// namespace from the downward API, and no variable that a manifest owns and
// an uninstall would have to change (the old MARKSPLIT_ENCRYPTION).
func testUninstallEnv(t *testing.T, env []corev1.EnvVar) {
	t.Helper()
	var ns *corev1.EnvVar
	for i, e := range env {
		switch e.Name {
		case "POD_NAMESPACE":
			ns = &env[i]
		case "MARKSPLIT_ENCRYPTION":
			t.Error("MARKSPLIT_ENCRYPTION is set: the uninstall switch is the ConfigMap, which no re-apply undoes")
		}
	}
	want := &corev1.EnvVar{
		Name:      "POD_NAMESPACE",
		ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}},
	}
	if diff := cmp.Diff(want, ns); diff != "" {
		t.Errorf("POD_NAMESPACE (-want +got):\n%s", diff)
	}
}
