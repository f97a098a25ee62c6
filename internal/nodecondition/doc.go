// Package nodecondition keeps one condition of the agent's own Node in the
// Kubernetes API (the agent's --node-condition, MarkSplitReady): True when
// the split is in place or not needed on the node, False with a reason
// otherwise, so that a controller such as node-readiness-controller can keep
// workloads off a node until its split is in place.
//
// The Writer PATCHes /api/v1/nodes/NODE/status with a strategic-merge patch
// of that one condition (merged by type: the kubelet's conditions are left
// as they are), when the condition's status, reason or message changes, at
// start, and every Heartbeat (5 min) while the caller keeps confirming the
// state with Set, so that a dead or stuck agent's lastHeartbeatTime goes
// stale. lastTransitionTime moves only when the status does. Writes are
// spaced by MinInterval (10 s), retries included: a state that flaps costs
// at most one write per 10 s, the latest state winning, and one log line
// per 10 minutes. A failed write is retried with back-off (10 s doubling
// to 5 min) and warned about at the first failure and then at most once
// per 10 minutes; a refusal (403: no RBAC, or the ValidatingAdmissionPolicy
// of deploy/node-condition denying a write to another Node) is logged once
// until a write succeeds again. Stats counts the writes, the changes and
// the failures. The kubelet's and the node controllers' own condition
// types (Ready, NetworkUnavailable, …) are refused: see KubeletOwned.
//
// # Concurrency
//
// Set and Stats are safe from any goroutine and never block or do I/O: Set
// keeps the latest state and wakes Run, which is called once and writes
// until its context ends.
//
// # Debugging
//
//	kubectl get node NODE -o jsonpath='{.status.conditions[?(@.type=="MarkSplitReady")]}'
package nodecondition
