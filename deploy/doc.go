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
// ../charts/marksplit is the same agent as a Helm chart. Its tests (chart_test.go)
// render it with helm's Go packages and compare it object by object with the
// kustomization, with and without the monitoring component; check that each
// value reaches its flag, that bad values fail with their name and that the
// chart accepts exactly the tables, priorities, protocols, marks and link
// names the agent's own checks (../netwatch/reconcile) accept; run helm lint;
// and keep the chart's copies of the monitoring files equal to the originals
// (`go test -run TestChartFiles -update` copies them). release_test.go checks
// that the image the kustomization and the chart name is one a release tag
// publishes.
//
// It is a Go module of its own so that the library's go.mod does not carry
// the Kubernetes API types, kustomize and helm. Run its tests with
// `cd deploy && go test ./...`.
package deploy
