package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The names other programs rely on (the Kubernetes end-to-end test applies
// rbac.yaml as shipped; operators' commands name the DaemonSet).
const (
	name      = "marksplit"
	namespace = "kube-system"
	appLabel  = "app.kubernetes.io/name"
	// metricsReader is the ClusterRole a scraper of the secure listener needs.
	metricsReader = "marksplit-metrics-reader"
)

// strictDecoder decodes the API types the manifests may use, strictly:
// unknown fields, fields in the wrong case and duplicated keys are errors, and
// so is a kind outside the scheme.
func strictDecoder() runtime.Decoder {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme, admissionv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			panic(err) // static registrations; cannot fail
		}
	}
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer()
}

// decodeStream splits a multi-document YAML stream and decodes every
// non-empty document strictly.
func decodeStream(data []byte) ([]runtime.Object, error) {
	return decodeStreamWith(strictDecoder(), data)
}

// decodeStreamWith is decodeStream with another decoder.
func decodeStreamWith(dec runtime.Decoder, data []byte) ([]runtime.Object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []runtime.Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if isBlank(doc) {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		objs = append(objs, obj)
	}
}

// isBlank reports whether a YAML document holds only comments and whitespace.
func isBlank(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && line != "---" && !strings.HasPrefix(line, "#") {
			return false
		}
	}
	return true
}

func decodeFile(t *testing.T, path string) []runtime.Object {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStream(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s: no objects", path)
	}
	return objs
}

// readKustomization decodes kustomization.yaml strictly (case-sensitive, no
// unknown or duplicate fields) into kustomize's own type.
func readKustomization(t *testing.T) kusttypes.Kustomization {
	t.Helper()
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	var k kusttypes.Kustomization
	strict, err := kjson.UnmarshalStrict(j, &k)
	if err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if err := errors.Join(strict...); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	return k
}

// manifestFiles lists every YAML file under deploy/ except the kustomization.
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || isKustomization(path)) {
			return filepath.SkipDir // a component or overlay of its own (monitoring/) has its own test
		}
		ext := filepath.Ext(path)
		if !d.IsDir() && (ext == ".yaml" || ext == ".yml") && path != "kustomization.yaml" {
			files = append(files, filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	return files
}

// isKustomization reports whether dir holds a kustomization.yaml.
func isKustomization(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "kustomization.yaml"))
	return err == nil
}

func TestStrictDecoderRejects(t *testing.T) {
	// The decoder must be as strict as this file claims, or the other tests
	// prove nothing.
	const head = "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\n"
	tests := []struct {
		name, doc string
	}{
		{"unknown field", head + "automountServiceAccountTokens: true\n"},
		{"field in the wrong case", head + "AutomountServiceAccountToken: true\n"},
		{"duplicate key", head + "metadata:\n  name: y\n"},
		{"unknown kind", "apiVersion: v1\nkind: Nonsense\nmetadata:\n  name: x\n"},
		{"nested unknown field", "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      hostNetwrok: true\n"},
		{"wrong type", head + "automountServiceAccountToken: \"yes\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := decodeStream([]byte(tt.doc)); err == nil {
				t.Errorf("decoded without error:\n%s", tt.doc)
			}
		})
	}
	if _, err := decodeStream([]byte(head)); err != nil {
		t.Errorf("a valid document failed: %v", err)
	}
}

func TestManifestsDecodeStrictly(t *testing.T) {
	files := manifestFiles(t)
	if len(files) == 0 {
		t.Fatal("no manifests found")
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) { decodeFile(t, f) })
	}

	// Every manifest is applied by `kubectl apply -k deploy/`, and the
	// kustomization names nothing else.
	k := readKustomization(t)
	if diff := cmp.Diff(files, slices.Sorted(slices.Values(k.Resources))); diff != "" {
		t.Errorf("kustomization.yaml resources vs manifests in deploy/ (-files +resources):\n%s", diff)
	}
}

// TestKustomizeBuild renders deploy/ the way `kubectl apply -k deploy/` does
// and checks that exactly the four objects come out, strictly valid, with the
// image the kustomization names.
func TestKustomizeBuild(t *testing.T) {
	abs, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStream(out)
	if err != nil {
		t.Fatalf("rendered output: %v\n%s", err, out)
	}

	type id struct{ Kind, Namespace, Name string }
	var got []id
	var ds *appsv1.DaemonSet
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			got = append(got, id{"ServiceAccount", o.Namespace, o.Name})
		case *rbacv1.ClusterRole:
			got = append(got, id{"ClusterRole", o.Namespace, o.Name})
		case *rbacv1.ClusterRoleBinding:
			got = append(got, id{"ClusterRoleBinding", o.Namespace, o.Name})
		case *rbacv1.Role:
			got = append(got, id{"Role", o.Namespace, o.Name})
		case *rbacv1.RoleBinding:
			got = append(got, id{"RoleBinding", o.Namespace, o.Name})
		case *appsv1.DaemonSet:
			got = append(got, id{"DaemonSet", o.Namespace, o.Name})
			ds = o
		default:
			t.Errorf("unexpected object %T", o)
		}
	}
	want := []id{
		{"ClusterRole", "", name},
		{"ClusterRole", "", metricsReader},
		{"ClusterRoleBinding", "", name},
		{"DaemonSet", namespace, name},
		{"Role", eventsNamespace, name},
		{"Role", namespace, name},
		{"Role", namespace, ciliumConfigRole},
		{"RoleBinding", eventsNamespace, name},
		{"RoleBinding", namespace, name},
		{"RoleBinding", namespace, ciliumConfigRole},
		{"ServiceAccount", namespace, name},
	}
	sortIDs := func(a, b id) int { return strings.Compare(a.Kind+"/"+a.Name, b.Kind+"/"+b.Name) }
	slices.SortFunc(got, sortIDs)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rendered objects (-want +got):\n%s", diff)
	}
	if ds == nil {
		t.Fatal("no DaemonSet rendered")
	}

	k := readKustomization(t)
	if len(k.Images) != 1 {
		t.Fatalf("kustomization.yaml: want one images entry, got %d", len(k.Images))
	}
	img := k.Images[0]
	if img.Name != name || img.NewName == "" || img.NewTag == "" {
		t.Errorf("kustomization.yaml images entry = %+v; want name %q with newName and newTag", img, name)
	}
	wantImage := img.NewName + ":" + img.NewTag
	if got := ds.Spec.Template.Spec.Containers[0].Image; got != wantImage {
		t.Errorf("rendered image = %q, want %q", got, wantImage)
	}
}

// eventsNamespace holds the agent's Events about its Node, as the kubelet's.
const eventsNamespace = "default"

func TestRBAC(t *testing.T) {
	objs := decodeFile(t, "rbac.yaml")
	if len(objs) != 10 {
		t.Fatalf("rbac.yaml: %d objects, want ServiceAccount, ClusterRole, ClusterRoleBinding, Role, RoleBinding (Events), Role, RoleBinding (uninstall switch), Role, RoleBinding (cilium-config), ClusterRole", len(objs))
	}
	testEventsRole(t, objs[3], objs[4])
	testUninstallRole(t, objs[5], objs[6])
	testCiliumConfigRole(t, objs[7], objs[8], "kube-system", "cilium-config")
	sa, ok1 := objs[0].(*corev1.ServiceAccount)
	role, ok2 := objs[1].(*rbacv1.ClusterRole)
	binding, ok3 := objs[2].(*rbacv1.ClusterRoleBinding)
	if !ok1 || !ok2 || !ok3 {
		t.Fatalf("rbac.yaml: got %T, %T, %T; want ServiceAccount, ClusterRole, ClusterRoleBinding", objs[0], objs[1], objs[2])
	}

	if sa.Name != name || sa.Namespace != namespace {
		t.Errorf("ServiceAccount = %s/%s, want %s/%s", sa.Namespace, sa.Name, namespace, name)
	}
	if sa.AutomountServiceAccountToken != nil && !*sa.AutomountServiceAccountToken {
		t.Error("ServiceAccount disables token automount; auto mode needs the token")
	}

	if role.Name != name || role.Namespace != "" {
		t.Errorf("ClusterRole = %q/%q, want cluster-scoped %q", role.Namespace, role.Name, name)
	}
	// Exactly get, list, watch on ciliumnodes in cilium.io, and the reviews
	// of the secure metrics listener: nothing else.
	wantRules := []rbacv1.PolicyRule{{
		APIGroups: []string{"cilium.io"},
		Resources: []string{"ciliumnodes"},
		Verbs:     []string{"get", "list", "watch"},
	}, {
		APIGroups: []string{"authentication.k8s.io"},
		Resources: []string{"tokenreviews"},
		Verbs:     []string{"create"},
	}, {
		APIGroups: []string{"authorization.k8s.io"},
		Resources: []string{"subjectaccessreviews"},
		Verbs:     []string{"create"},
	}}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("ClusterRole rules (-want +got):\n%s", diff)
	}
	if role.AggregationRule != nil {
		t.Error("ClusterRole aggregates other roles")
	}

	if binding.Name != name {
		t.Errorf("ClusterRoleBinding name = %q, want %q", binding.Name, name)
	}
	wantRef := rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name}
	if diff := cmp.Diff(wantRef, binding.RoleRef); diff != "" {
		t.Errorf("ClusterRoleBinding roleRef (-want +got):\n%s", diff)
	}
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: namespace}}
	if diff := cmp.Diff(wantSubjects, binding.Subjects); diff != "" {
		t.Errorf("ClusterRoleBinding subjects (-want +got):\n%s", diff)
	}

	// The scraper's role: get on /metrics, the one URL the secure listener
	// serves, and nothing else.
	reader, ok := objs[9].(*rbacv1.ClusterRole)
	if !ok || reader.Name != metricsReader {
		t.Fatalf("rbac.yaml: last object %T %v, want the ClusterRole %s", objs[9], objs[9], metricsReader)
	}
	wantReader := []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}
	if diff := cmp.Diff(wantReader, reader.Rules); diff != "" {
		t.Errorf("ClusterRole %s rules (-want +got):\n%s", metricsReader, diff)
	}
}

// testEventsRole checks the Role and RoleBinding of the agent's Events:
// create and patch on events.k8s.io events in default, nothing else, for
// the agent's ServiceAccount.
func testEventsRole(t *testing.T, r, b runtime.Object) {
	t.Helper()
	role, ok1 := r.(*rbacv1.Role)
	binding, ok2 := b.(*rbacv1.RoleBinding)
	if !ok1 || !ok2 {
		t.Fatalf("rbac.yaml: got %T, %T; want Role, RoleBinding", r, b)
	}
	if role.Name != name || role.Namespace != eventsNamespace || binding.Name != name || binding.Namespace != eventsNamespace {
		t.Errorf("Role %s/%s, RoleBinding %s/%s; want both %s/%s", role.Namespace, role.Name, binding.Namespace, binding.Name, eventsNamespace, name)
	}
	wantRules := []rbacv1.PolicyRule{{
		APIGroups: []string{"events.k8s.io"},
		Resources: []string{"events"},
		Verbs:     []string{"create", "patch"},
	}}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("Role rules (-want +got):\n%s", diff)
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

// loadDaemonSet returns the one DaemonSet in daemonset.yaml.
func loadDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	objs := decodeFile(t, "daemonset.yaml")
	if len(objs) != 1 {
		t.Fatalf("daemonset.yaml: %d objects, want 1", len(objs))
	}
	ds, ok := objs[0].(*appsv1.DaemonSet)
	if !ok {
		t.Fatalf("daemonset.yaml: %T, want *v1.DaemonSet", objs[0])
	}
	return ds
}

// agentFlags are the agent's flags (docs/design.md); a flag in the manifest that
// is not here is a typo the agent would refuse with exit 2.
var agentFlags = map[string]bool{
	"tunnel-link": true, "mark": true, "table": true, "priority": true,
	"peers": true, "prefix": true, "underlay-link": true, "encryption": true, "node-name": true,
	"protocol": true, "metrics-addr": true, "log-format": true, "allow-shared": true,
	"secure-metrics-addr": true, "tls-cert-file": true, "tls-key-file": true,
	"uninstall-configmap": true, "events": true, "node-condition": true,
	"path-mtu": true, "path-mtu-probe": true, "path-mtu-learn": true, "path-mtu-probe-port": true,
	"cilium-namespace": true, "cilium-configmap": true,
}

// parseArgs checks the container's args — a subcommand, then --flag=value —
// and returns the values by flag name.
func parseArgs(t *testing.T, args []string) map[string][]string {
	t.Helper()
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("args = %q: want the run subcommand first", args)
	}
	flags := map[string][]string{}
	for _, a := range args[1:] {
		nameVal, ok := strings.CutPrefix(a, "--")
		if !ok {
			t.Errorf("arg %q: want --flag=value", a)
			continue
		}
		n, v, ok := strings.Cut(nameVal, "=")
		if !ok {
			t.Errorf("arg %q: want --flag=value (the docs' commands read that form)", a)
			continue
		}
		if !agentFlags[n] {
			t.Errorf("arg %q: the agent has no flag %q", a, n)
		}
		if len(flags[n]) > 0 && n != "prefix" {
			t.Errorf("flag --%s given twice", n)
		}
		flags[n] = append(flags[n], v)
	}
	return flags
}

func TestDaemonSet(t *testing.T) {
	ds := loadDaemonSet(t)
	spec := ds.Spec.Template.Spec

	if ds.Name != name || ds.Namespace != namespace {
		t.Errorf("DaemonSet = %s/%s, want %s/%s", ds.Namespace, ds.Name, namespace, name)
	}
	if ds.Spec.Selector == nil || ds.Spec.Selector.MatchLabels[appLabel] != name {
		t.Errorf("selector = %v, want %s=%s", ds.Spec.Selector, appLabel, name)
	} else {
		for k, v := range ds.Spec.Selector.MatchLabels {
			if ds.Spec.Template.Labels[k] != v {
				t.Errorf("template labels %v do not match selector %s=%s", ds.Spec.Template.Labels, k, v)
			}
		}
	}

	t.Run("pod", func(t *testing.T) {
		if !spec.HostNetwork {
			t.Error("hostNetwork is not set: the routes live in the host's namespace")
		}
		if spec.HostPID || spec.HostIPC {
			t.Error("hostPID/hostIPC set; the agent needs neither")
		}
		if spec.ServiceAccountName != name {
			t.Errorf("serviceAccountName = %q, want %q", spec.ServiceAccountName, name)
		}
		if spec.AutomountServiceAccountToken != nil && !*spec.AutomountServiceAccountToken {
			t.Error("token automount disabled; auto mode needs it")
		}
		if spec.PriorityClassName != "system-node-critical" {
			t.Errorf("priorityClassName = %q, want system-node-critical", spec.PriorityClassName)
		}
		// Tolerate every taint: one toleration, operator Exists, no key, no effect.
		wantTol := []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
		if diff := cmp.Diff(wantTol, spec.Tolerations); diff != "" {
			t.Errorf("tolerations (-want +got):\n%s", diff)
		}
		if g := spec.TerminationGracePeriodSeconds; g == nil || *g <= 5 {
			t.Errorf("terminationGracePeriodSeconds = %v, want > 5 (the agent takes up to 5 s)", g)
		}
		if len(spec.InitContainers) != 0 || len(spec.Containers) != 1 {
			t.Fatalf("want exactly one container and no init containers, got %d and %d",
				len(spec.Containers), len(spec.InitContainers))
		}
		if spec.SecurityContext != nil && len(spec.SecurityContext.Sysctls) > 0 {
			t.Error("pod sets sysctls")
		}
	})

	t.Run("rolling update", func(t *testing.T) {
		// The pace is kustomization.yaml's patch: 10% of the nodes at
		// once, never two agents on one node.
		pace, zero := intstr.FromString("10%"), intstr.FromInt32(0)
		want := appsv1.DaemonSetUpdateStrategy{
			Type: appsv1.RollingUpdateDaemonSetStrategyType,
			RollingUpdate: &appsv1.RollingUpdateDaemonSet{
				MaxUnavailable: &pace,
				MaxSurge:       &zero,
			},
		}
		if diff := cmp.Diff(want, kustomizedDaemonSet(t, kustomizeOpts{}).Spec.UpdateStrategy); diff != "" {
			t.Errorf("updateStrategy (-want +got):\n%s", diff)
		}
		if ds.Spec.MinReadySeconds <= 0 {
			t.Error("minReadySeconds not set: a pod is counted available the moment it is Ready")
		}
	})

	c := spec.Containers[0]

	t.Run("security context", func(t *testing.T) {
		root, no, yes := int64(0), false, true
		want := &corev1.SecurityContext{
			RunAsUser:                &root,
			RunAsGroup:               &root,
			RunAsNonRoot:             &no,
			Privileged:               &no,
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			Capabilities: &corev1.Capabilities{
				Drop: []corev1.Capability{"ALL"},
				Add:  []corev1.Capability{"NET_ADMIN"},
			},
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
		if diff := cmp.Diff(want, c.SecurityContext); diff != "" {
			t.Errorf("container securityContext (-want +got):\n%s", diff)
		}
		// A pod-level setting must not contradict the container's.
		if psc := spec.SecurityContext; psc != nil {
			if psc.RunAsNonRoot != nil && *psc.RunAsNonRoot {
				t.Error("pod runAsNonRoot contradicts the container running as root")
			}
			if psc.SeccompProfile != nil && psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("pod seccompProfile = %v", psc.SeccompProfile.Type)
			}
		}
	})

	t.Run("env", func(t *testing.T) {
		var nodeName *corev1.EnvVar
		for i, e := range c.Env {
			if e.Name == "NODE_NAME" {
				nodeName = &c.Env[i]
			}
		}
		want := &corev1.EnvVar{
			Name: "NODE_NAME",
			ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "spec.nodeName"},
			},
		}
		if diff := cmp.Diff(want, nodeName); diff != "" {
			t.Errorf("NODE_NAME (-want +got):\n%s", diff)
		}
		if len(c.EnvFrom) != 0 {
			t.Error("envFrom set: the environment should be visible in the manifest")
		}
	})

	flags := parseArgs(t, c.Args)

	t.Run("policy flags", func(t *testing.T) {
		if len(c.Command) != 0 {
			t.Errorf("command = %q: the image's entrypoint is the binary; set args only", c.Command)
		}
		want := map[string][]string{
			"tunnel-link":         {"cilium_wg0"},
			"mark":                {"0xe00/0xf00"},
			"table":               {"900"},
			"priority":            {"900"},
			"peers":               {"auto"},
			"path-mtu-probe":      {"true"},
			"encryption":          {"auto"},
			"metrics-addr":        {"127.0.0.1:9184"},
			"secure-metrics-addr": {":9185"},
			"log-format":          {"text"},
			"uninstall-configmap": {uninstallConfigMap},
			"cilium-namespace":    {"kube-system"},
			"cilium-configmap":    {"cilium-config"},
		}
		if diff := cmp.Diff(want, flags); diff != "" {
			t.Errorf("args (-want +got):\n%s", diff)
		}
		testUninstallEnv(t, c.Env)
	})

	t.Run("probes", func(t *testing.T) {
		addrs := flags["metrics-addr"]
		if len(addrs) != 1 || addrs[0] == "" {
			t.Fatalf("--metrics-addr = %q: the probes need the metrics listener", addrs)
		}
		host, _, err := net.SplitHostPort(addrs[0])
		if err != nil {
			t.Fatalf("--metrics-addr=%s: %v", addrs[0], err)
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			t.Errorf("--metrics-addr host %q: want a loopback address (metrics stay off the network)", host)
		}
		// The probes are exec probes over the health socket (issue 38: a
		// TCP port can be taken or flooded by another user), whose
		// directory is a volume: the root filesystem is read-only.
		health := []string{"/usr/local/bin/marksplit", "health"}
		for _, p := range []struct {
			name    string
			probe   *corev1.Probe
			command []string
		}{
			{"livenessProbe", c.LivenessProbe, health},
			{"readinessProbe", c.ReadinessProbe, append(slices.Clone(health), "--ready")},
			{"startupProbe", c.StartupProbe, health},
		} {
			if p.probe == nil {
				t.Errorf("%s missing", p.name)
				continue
			}
			if p.probe.Exec == nil || p.probe.HTTPGet != nil || p.probe.TCPSocket != nil || p.probe.GRPC != nil {
				t.Errorf("%s: %+v, want an exec probe alone", p.name, p.probe.ProbeHandler)
			} else if diff := cmp.Diff(p.command, p.probe.Exec.Command); diff != "" {
				t.Errorf("%s exec (-want +got):\n%s", p.name, diff)
			}
			if p.probe.TimeoutSeconds <= 0 || p.probe.PeriodSeconds <= 0 || p.probe.FailureThreshold <= 0 {
				t.Errorf("%s: timeout, period and failure threshold should be explicit", p.name)
			}
		}
		// The health socket's directory, /run/marksplit: a volume of the
		// pod's own.
		if i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/run/marksplit" }); i < 0 {
			t.Errorf("volumeMounts %+v: none at /run/marksplit, the health socket's directory", c.VolumeMounts)
		} else if j := slices.IndexFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name }); j < 0 || ds.Spec.Template.Spec.Volumes[j].EmptyDir == nil {
			t.Errorf("volume %q of /run/marksplit: want an emptyDir", c.VolumeMounts[i].Name)
		}
		// One port, the secure listener's, named for the PodMonitor; the
		// loopback listener has none (with hostNetwork a containerPort becomes
		// a hostPort).
		_, securePort, err := net.SplitHostPort(flags["secure-metrics-addr"][0])
		if err != nil {
			t.Fatal(err)
		}
		sp, err := strconv.Atoi(securePort)
		if err != nil {
			t.Fatal(err)
		}
		wantPorts := []corev1.ContainerPort{{Name: "https-metrics", ContainerPort: int32(sp), Protocol: corev1.ProtocolTCP}}
		if diff := cmp.Diff(wantPorts, c.Ports); diff != "" {
			t.Errorf("ports (-want +got):\n%s", diff)
		}
	})

	t.Run("resources", func(t *testing.T) {
		// The agent's expected footprint: ~20-40 MiB RSS, near-zero idle CPU.
		const rss = 40 << 20
		req, lim := c.Resources.Requests, c.Resources.Limits
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			q, ok := req[r]
			if !ok || q.Sign() <= 0 {
				t.Errorf("requests.%s not set", r)
			}
			l, ok := lim[r]
			if !ok || l.Sign() <= 0 {
				t.Errorf("limits.%s not set", r)
			}
			if q.Cmp(l) > 0 {
				t.Errorf("requests.%s %s above limits.%s %s", r, q.String(), r, l.String())
			}
		}
		between := func(what string, q resource.Quantity, lo, hi int64) {
			if v := q.Value(); v < lo || v > hi {
				t.Errorf("%s = %s, want between %d and %d MiB", what, q.String(), lo>>20, hi>>20)
			}
		}
		between("requests.memory", req[corev1.ResourceMemory], rss, 2*rss)
		between("limits.memory", lim[corev1.ResourceMemory], 2*rss, 512<<20)
		if cpu := req[corev1.ResourceCPU]; cpu.MilliValue() > 50 {
			t.Errorf("requests.cpu = %s: an idle agent uses next to nothing", cpu.String())
		}
		if cpu := lim[corev1.ResourceCPU]; cpu.MilliValue() < 100 {
			t.Errorf("limits.cpu = %s: leave room for a resync of a large table", cpu.String())
		}
	})

	t.Run("image", func(t *testing.T) {
		k := readKustomization(t)
		if len(k.Images) == 0 || c.Image != k.Images[0].Name {
			t.Errorf("image = %q: want the symbolic name that kustomization.yaml's images: entry rewrites", c.Image)
		}
		if c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("imagePullPolicy = %q, want IfNotPresent", c.ImagePullPolicy)
		}
	})
}

// dockerInstr is one Dockerfile instruction with continuation lines joined.
type dockerInstr struct{ cmd, rest string }

func parseDockerfile(t *testing.T) []dockerInstr {
	t.Helper()
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var out []dockerInstr
	var cur strings.Builder
	for line := range strings.SplitSeq(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasPrefix(trimmed, "#") { // a comment inside a continued instruction
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, rest, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstr{strings.ToUpper(cmd), strings.TrimSpace(rest)})
		cur.Reset()
	}
	if cur.Len() > 0 {
		t.Fatal("Dockerfile ends inside a continued line")
	}
	return out
}

func TestDockerfile(t *testing.T) {
	instrs := parseDockerfile(t)
	var stages [][]dockerInstr
	for _, in := range instrs {
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("%s before the first FROM", in.cmd)
			}
			continue
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a multi-stage build", len(stages))
	}

	// The build: static, trimmed, version stamped, the agent package.
	var build string
	for _, in := range stages[0] {
		if in.cmd == "RUN" && strings.Contains(in.rest, "go build") {
			build = in.rest
		}
	}
	for _, want := range []string{
		"CGO_ENABLED=0", "go build", "-trimpath", `-ldflags "-s -w -X main.version=${VERSION}"`, "./agent",
	} {
		if !strings.Contains(build, want) {
			t.Errorf("build stage's go build lacks %q: %q", want, build)
		}
	}
	if !slices.ContainsFunc(stages[0], func(in dockerInstr) bool {
		return in.cmd == "ARG" && strings.HasPrefix(in.rest, "VERSION")
	}) {
		t.Error("build stage has no ARG VERSION")
	}

	// The final stage: distroless static or scratch, root, the binary as entrypoint.
	final := stages[len(stages)-1]
	base := strings.Fields(final[0].rest)[0]
	if !strings.HasPrefix(base, "gcr.io/distroless/static") && base != "scratch" {
		t.Errorf("final stage FROM %s, want distroless static or scratch", base)
	}
	var user, entrypoint, copied string
	for _, in := range final {
		switch in.cmd {
		case "USER":
			user = in.rest
		case "ENTRYPOINT":
			entrypoint = in.rest
		case "COPY":
			if f := strings.Fields(in.rest); len(f) >= 3 && strings.HasPrefix(f[0], "--from=") {
				copied = f[len(f)-1]
			}
		}
	}
	if user != "0:0" && user != "0" && user != "root" {
		t.Errorf("final stage USER %q: the agent must run as root (no ambient capabilities)", user)
	}
	if copied == "" {
		t.Fatal("final stage copies no binary from the build stage")
	}
	if want := `["` + copied + `"]`; entrypoint != want {
		t.Errorf("ENTRYPOINT %s, want %s (exec form, the copied binary)", entrypoint, want)
	}
}

// TestOperationsDoc keeps docs/operations.md in step with the manifests: the
// names, label, env var and lines its commands rely on.
func TestOperationsDoc(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	ds := loadDaemonSet(t)
	for _, want := range []string{
		"kubectl apply -k deploy/",
		"kubectl -n kube-system rollout status daemonset/" + ds.Name,
		appLabel + "=" + ds.Spec.Selector.MatchLabels[appLabel],
		"kubectl -n kube-system create configmap " + uninstallConfigMap,
		"kubectl -n kube-system delete configmap " + uninstallConfigMap,
		"marksplit cleanup",
		"marksplit verify --peer",
		"not from all fwmark 0xe00/0xf00 lookup 900",
		"marksplit_host_ip_frag_oks_total",
		"marksplit_host_ip_frag_creates_total",
		"ManageForeignRoutingPolicyRules=no",
		"--protocol=kernel",
		"helm install marksplit charts/marksplit -n kube-system",
		"helm upgrade marksplit charts/marksplit -n kube-system --reset-then-reuse-values",
		"helm uninstall marksplit -n kube-system",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/operations.md does not contain %q", want)
		}
	}
}
