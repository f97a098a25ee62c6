package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"sigs.k8s.io/yaml"
)

// The PodMonitor and the PrometheusRule, as kustomize and the chart render
// them, checked against the Prometheus operator's own CRDs, taken from its Go
// module at the oldest version docs/operations.md supports: the OpenAPI
// schema the API server enforces (enums, patterns, types) and, as
// `kubectl apply` with strict field validation does, no field the schema
// does not know. A `scheme: HTTPS` passed the Go types (their decoder takes
// any string) and was refused by the operator's CRD (issue 30).

// promOperator is the module whose example/prometheus-operator-crd holds the
// CRDs; its version is the minimum docs/operations.md states.
const (
	promOperator        = "github.com/prometheus-operator/prometheus-operator"
	promOperatorVersion = "v0.85.0"
)

// operatorCRDs downloads the module (into the Go module cache, verified
// against go.sum's checksum database) and returns its CRDs by kind.
func operatorCRDs(t *testing.T) map[string]*apiextv1.CustomResourceDefinition {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", promOperator+"@"+promOperatorVersion).Output()
	if err != nil {
		if strict := strictEnv(); strict {
			t.Fatalf("go mod download %s@%s: %v", promOperator, promOperatorVersion, err)
		}
		t.Skipf("go mod download %s@%s: %v (no module proxy?)", promOperator, promOperatorVersion, err)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download: %v %s", err, mod.Error)
	}
	crds := map[string]*apiextv1.CustomResourceDefinition{}
	for _, f := range []string{"monitoring.coreos.com_podmonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml"} {
		data, err := os.ReadFile(filepath.Join(mod.Dir, "example", "prometheus-operator-crd", f))
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(data, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crds[crd.Spec.Names.Kind] = &crd
	}
	return crds
}

// crdValidator checks objects of one version of a CRD as the API server
// does: the schema, then the fields pruning would drop.
type crdValidator struct {
	schema     validation.SchemaValidator
	structural *structuralschema.Structural
}

func newCRDValidator(t *testing.T, crd *apiextv1.CustomResourceDefinition, version string) crdValidator {
	t.Helper()
	for _, v := range crd.Spec.Versions {
		if v.Name != version || v.Schema == nil {
			continue
		}
		var internal apiext.JSONSchemaProps
		if err := apiextv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
			t.Fatal(err)
		}
		sv, _, err := validation.NewSchemaValidator(&internal)
		if err != nil {
			t.Fatal(err)
		}
		st, err := structuralschema.NewStructural(&internal)
		if err != nil {
			t.Fatal(err)
		}
		return crdValidator{sv, st}
	}
	t.Fatalf("CRD %s has no version %s with a schema", crd.Name, version)
	return crdValidator{}
}

// problems lists what the API server would refuse in o.
func (v crdValidator) problems(o object) []string {
	var out []string
	for _, e := range validation.ValidateCustomResource(nil, o, v.schema) {
		out = append(out, e.Error())
	}
	b, _ := json.Marshal(o)
	var cp map[string]any
	_ = json.Unmarshal(b, &cp)
	for _, f := range pruning.PruneWithOptions(cp, v.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		out = append(out, "unknown field "+f)
	}
	return out
}

func TestMonitoringAgainstCRDs(t *testing.T) {
	crds := operatorCRDs(t)
	validators := map[string]crdValidator{}
	for kind, crd := range crds {
		validators[kind] = newCRDValidator(t, crd, "v1")
	}
	for _, tt := range []struct {
		name string
		objs func(t *testing.T) []object
	}{
		{"kustomize", func(t *testing.T) []object { return kustomizeObjects(t, kustomizeOpts{monitoring: true}) }},
		{"chart", func(t *testing.T) []object {
			return mustRenderChart(t, map[string]any{"monitoring": map[string]any{"enabled": true}})
		}},
		{"chart with a verified certificate", func(t *testing.T) []object {
			return mustRenderChart(t, map[string]any{
				"metrics": map[string]any{"tls": map[string]any{"secretName": "marksplit-metrics-tls"}},
				"monitoring": map[string]any{"enabled": true, "podMonitorLabels": map[string]any{"release": "kube-prometheus-stack"},
					"tlsConfig": map[string]any{"serverName": "marksplit.kube-system", "ca": map[string]any{"secret": map[string]any{"name": "marksplit-metrics-ca", "key": "ca.crt"}}}},
			})
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			checked := 0
			for _, o := range tt.objs(t) {
				kind, _ := o["kind"].(string)
				v, ok := validators[kind]
				if !ok {
					continue
				}
				checked++
				if p := v.problems(o); len(p) > 0 {
					t.Errorf("%s: the Prometheus operator's CRD (%s) refuses it:\n%s", kind, promOperatorVersion, strings.Join(p, "\n"))
				}
			}
			if checked != 2 {
				t.Errorf("checked %d objects, want the PodMonitor and the PrometheusRule", checked)
			}
		})
	}
}

// The validator refuses what the issue found (and an unknown field): the
// check can fail.
func TestCRDValidatorRefuses(t *testing.T) {
	crds := operatorCRDs(t)
	v := newCRDValidator(t, crds["PodMonitor"], "v1")
	pm := func(ep map[string]any) object {
		return object{"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
			"metadata": map[string]any{"name": "marksplit", "namespace": "kube-system"},
			"spec":     map[string]any{"selector": map[string]any{}, "podMetricsEndpoints": []any{ep}}}
	}
	if p := v.problems(pm(map[string]any{"port": "https-metrics", "scheme": "https"})); len(p) > 0 {
		t.Errorf("scheme https refused: %q", p)
	}
	for _, bad := range []map[string]any{
		{"port": "https-metrics", "scheme": "HTTPS"},
		{"port": "https-metrics", "schema": "https"},
	} {
		if p := v.problems(pm(bad)); len(p) == 0 {
			t.Errorf("endpoint %v: accepted", bad)
		} else {
			t.Logf("endpoint %v: %q", bad, p)
		}
	}
}
