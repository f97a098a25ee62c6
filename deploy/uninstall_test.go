package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
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

// uninstallCheck is one of the `kubectl get` commands of the last step of
// docs/operations.md's uninstall: the resources each lists, in which
// namespace ("" for cluster-scoped ones), and its label selector.
type uninstallCheck struct {
	namespace string
	resources []string
	selector  labels.Selector
}

// readUninstallChecks parses the last numbered step of the uninstall block
// of docs/operations.md: each `kubectl [-n NS] get RESOURCES -l SELECTOR`
// command, its continuation lines joined.
func readUninstallChecks(t *testing.T) []uninstallCheck {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(data), "\n```\n# 1. Switch every agent off")
	if !ok {
		t.Fatal("docs/operations.md: no uninstall block (# 1. Switch every agent off)")
	}
	block, _, _ = strings.Cut(block, "\n```\n")
	steps := regexp.MustCompile(`(?m)^# [0-9]+\. `).FindAllStringIndex(block, -1)
	if len(steps) == 0 {
		t.Fatal("docs/operations.md: the uninstall block has no numbered steps")
	}
	last := strings.ReplaceAll(block[steps[len(steps)-1][0]:], "\\\n", " ")
	cmd := regexp.MustCompile(`^kubectl +(?:-n +(\S+) +)?get +(\S+) +-l +('[^']*'|\S+)`)
	var checks []uninstallCheck
	for _, l := range strings.Split(last, "\n") {
		m := cmd.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			continue
		}
		sel, err := labels.Parse(strings.Trim(m[3], "'"))
		if err != nil {
			t.Fatalf("docs/operations.md: uninstall check %q: %v", l, err)
		}
		checks = append(checks, uninstallCheck{namespace: m[1], resources: strings.Split(m[2], ","), selector: sel})
	}
	if len(checks) == 0 {
		t.Fatal("docs/operations.md: the uninstall's last step has no `kubectl get … -l` check")
	}
	return checks
}

// resourceOf is the kubectl resource name of a kind, and the other names
// that list it (`all` lists pods and DaemonSets).
var resourceOf = map[string][]string{
	"ServiceAccount": {"serviceaccount"}, "Secret": {"secret"}, "ConfigMap": {"configmap"},
	"Pod": {"pod", "all"}, "DaemonSet": {"daemonset", "all"},
	"Role": {"role"}, "RoleBinding": {"rolebinding"}, "ClusterRole": {"clusterrole"}, "ClusterRoleBinding": {"clusterrolebinding"},
	"ValidatingAdmissionPolicy": {"validatingadmissionpolicy"}, "ValidatingAdmissionPolicyBinding": {"validatingadmissionpolicybinding"},
}

// TestUninstallChecksFindEverything: every object the chart makes with
// every component on, helm test's pod included, and every object of deploy/
// with its components, is listed by one of the uninstall's last `kubectl
// get` checks: its kind, its namespace, a selector its labels match. An
// object none lists would be left behind while the check says "No
// resources found". The Prometheus operator's kinds are left out, as the
// doc says (their CRDs may be missing).
func TestUninstallChecksFindEverything(t *testing.T) {
	checks := readUninstallChecks(t)
	objs := mustRenderChart(t, map[string]any{
		"monitoring": map[string]any{"enabled": true}, "nodeCondition": map[string]any{"enabled": true},
		"tests": map[string]any{"node": "worker-1", "peer": "10.0.0.9"},
	})
	objs = append(objs, kustomizeObjects(t, kustomizeOpts{monitoring: true, nodeCondition: true})...)
	hooks := 0
	for _, o := range objs {
		kind, _ := o["kind"].(string)
		if strings.HasPrefix(fmt.Sprint(o["apiVersion"]), "monitoring.coreos.com/") {
			continue
		}
		if isHook(o) {
			hooks++
		}
		md, _ := o["metadata"].(map[string]any)
		ns, _ := md["namespace"].(string)
		set := labels.Set{}
		if l, ok := md["labels"].(map[string]any); ok {
			for k, v := range l {
				set[k] = fmt.Sprint(v)
			}
		}
		names, ok := resourceOf[kind]
		if !ok {
			t.Errorf("%s: a kind the test does not know: add it to resourceOf", objectKey(o))
			continue
		}
		found := slices.ContainsFunc(checks, func(c uninstallCheck) bool {
			return c.namespace == ns && c.selector.Matches(set) && slices.ContainsFunc(names, func(n string) bool { return slices.Contains(c.resources, n) })
		})
		if !found {
			t.Errorf("%s (labels %v): no check of the uninstall's last step lists it", objectKey(o), set)
		}
	}
	if hooks == 0 {
		t.Error("the chart rendered no helm test pod: the test lost it")
	}
}
