// Package nodecondition keeps one condition of the agent's own Node in the
// Kubernetes API (the agent's --node-condition, MarkSplitReady): True when
// the split is in place or not needed on the node, False with a reason
// otherwise, so that a controller such as node-readiness-controller can keep
// workloads off a node until its split is in place.
//
// The Writer PATCHes /api/v1/nodes/NODE/status with a strategic-merge patch
// of that one condition (merged by type: the kubelet's conditions are left
// as they are), only when the condition's status, reason or message
// changes, and once at start. lastTransitionTime moves only when the status
// does. A failed write is retried with back-off; a refusal (403: no RBAC,
// or the ValidatingAdmissionPolicy of deploy/node-condition denying a write
// to another Node) is logged once until a write succeeds again.
//
// # Concurrency
//
// Set is safe from any goroutine and never blocks or does I/O: it keeps the
// latest state and wakes Run, which is called once and writes until its
// context ends.
//
// # Debugging
//
//	kubectl get node NODE -o jsonpath='{.status.conditions[?(@.type=="MarkSplitReady")]}'
package nodecondition
