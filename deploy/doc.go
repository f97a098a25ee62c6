// Package deploy holds how the marksplit agent reaches a cluster: the
// Kubernetes manifests (rbac.yaml, daemonset.yaml, applied with
// `kubectl apply -k deploy/`) and the container image (Dockerfile).
//
// It has no code of its own. Its tests decode every manifest strictly into the
// Kubernetes API types (an unknown, misspelled or duplicated field fails),
// render the kustomization as kubectl would, and assert the settings the
// agent depends on: the minimal RBAC, host networking, the capability set,
// probes that reach the agent's loopback listener, tolerations, the node name
// from the downward API, resource bounds and a gentle rolling update.
//
// monitoring/ is an optional kustomize component: a PrometheusRule with the
// agent's alerts, and a Grafana dashboard in a ConfigMap for Grafana's sidecar.
// Its tests decode the rule strictly into the Prometheus operator's types,
// render the component on top of deploy/, and run `promtool check rules` and
// `promtool test rules` (monitoring/testdata/alerts_test.yaml); the
// dashboard's queries go through `promtool check rules` too, and may name only
// the metrics of ../agent/testdata/metrics.txt (the agent's list). promtool comes
// from PATH, or is unpacked from Debian's prometheus package into
// $MARKSPLIT_CACHE (never installed: its init script would start a server).
//
// It is a Go module of its own so that the library's go.mod does not carry
// the Kubernetes API types. Run its tests with `cd deploy && go test ./...`.
package deploy
