package image

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// manifestPath is the DaemonSet the test runs the image as.
var manifestPath = filepath.Join("..", "..", "deploy", "daemonset.yaml")

// pod is what the test takes from the DaemonSet: its one container and the
// pod settings that decide how the container runs.
type pod struct {
	hostNetwork bool
	namespace   string // the DaemonSet's, the pod's
	grace       int64  // terminationGracePeriodSeconds
	container   corev1.Container
	volumes     []corev1.Volume
}

func readPod(t testing.TB) pod {
	t.Helper()
	b, err := os.ReadFile(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		t.Fatalf("%s: %v", manifestPath, err)
	}
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", manifestPath, len(spec.Containers))
	}
	p := pod{hostNetwork: spec.HostNetwork, namespace: ds.Namespace, grace: 30, container: spec.Containers[0], volumes: spec.Volumes}
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		p.grace = *g
	}
	return p
}

// expand replaces each $(NAME) in s by env's NAME, as the kubelet expands
// a container's command, args and env values: $$ is a literal $, and a
// reference to an undefined name is left as it is.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// containerEnv is the environment of p's container as the kubelet sets it
// on node nodeName, in order: values may refer to variables defined before
// them.
func (p pod) containerEnv(nodeName string) (map[string]string, []string, error) {
	c := p.container
	env := map[string]string{}
	var list []string
	for _, e := range c.Env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = expand(e.Value, env)
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			v = nodeName
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			v = p.namespace
		default:
			return nil, nil, fmt.Errorf("env %s: only values, spec.nodeName and metadata.namespace are modelled here", e.Name)
		}
		env[e.Name] = v
		list = append(list, e.Name+"="+v)
	}
	return env, list, nil
}

// policyFlags are the agent flags that need a cluster or a real node's
// network; clusterless replaces them.
var policyFlags = []string{"prefix", "peers", "underlay-link", "encryption", "node-name", "secure-metrics-addr"}

// clusterlessPolicy is the policy of a cluster-less run on the seed
// topology: its private network, on an encrypting node.
var clusterlessPolicy = []string{"--prefix=10.0.0.0/16", "--encryption=on"}

// clusterless returns args without the policy flags, then
// clusterlessPolicy. Every other arg stays as the manifest has it.
func clusterless(args []string) []string {
	var out []string
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && slices.Contains(policyFlags, name) {
			continue
		}
		out = append(out, a)
	}
	return append(out, clusterlessPolicy...)
}

// flagValue returns the value of --name=value in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func TestExpand(t *testing.T) {
	env := map[string]string{"MODE": "auto", "EMPTY": ""}
	for in, want := range map[string]string{
		"--encryption=$(MODE)": "--encryption=auto",
		"$(MODE)$(MODE)":       "autoauto",
		"$(EMPTY)x":            "x",
		"$(UNSET)":             "$(UNSET)",
		"$$(MODE)":             "$(MODE)",
		"a$b":                  "a$b",
		"$(MODE":               "$(MODE",
		"x$":                   "x$",
	} {
		if got := expand(in, env); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestClusterless(t *testing.T) {
	got := clusterless([]string{
		"run", "--tunnel-link=cilium_wg0", "--peers=auto", "--prefix=10.1.0.0/16", "--prefix=10.2.0.0/16",
		"--encryption=auto", "--metrics-addr=127.0.0.1:9184", "--underlay-link=eth1",
	})
	want := []string{"run", "--tunnel-link=cilium_wg0", "--metrics-addr=127.0.0.1:9184", "--prefix=10.0.0.0/16", "--encryption=on"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("clusterless (-want +got):\n%s", diff)
	}
}

// TestManifestArgs checks what the image test takes from the manifest,
// without running anything: the args expand and keep their non-policy flags.
func TestManifestArgs(t *testing.T) {
	p := readPod(t)
	env, _, err := p.containerEnv("node-a")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, a := range p.container.Args {
		args = append(args, expand(a, env))
	}
	for _, a := range args {
		if strings.Contains(a, "$(") {
			t.Errorf("arg %q still refers to a variable after expansion", a)
		}
	}
	run := clusterless(args)
	if _, ok := flagValue(run, "metrics-addr"); !ok {
		t.Errorf("args %q: no --metrics-addr (the loopback listener)", run)
	}
	if len(run) == 0 || run[0] != "run" {
		t.Errorf("args %q: want the run subcommand first", run)
	}
}
