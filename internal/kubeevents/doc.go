// Package kubeevents records Kubernetes Events (events.k8s.io/v1) about one
// Node for what an operator should see in `kubectl describe node` and
// `kubectl get events`: best effort, aggregated and rate-limited, as
// client-go's events broadcaster does, and never at the cost of the caller.
//
// Record never blocks and never does I/O: it adds the occurrence to a
// bounded map under a mutex and wakes Run, which writes to the API server.
// The first occurrence of an Event (same type, reason, action and note, or
// the group given to RecordGroup) creates it; repeats within SeriesWindow of the last are counted into its
// series (series.count, series.lastObservedTime) and written with a merge
// PATCH at most once per MinInterval; a global token bucket bounds all
// writes. A thousand records a minute are a handful of writes.
//
// # Failures
//
// An API server that is down or slow costs the caller nothing: the pending
// Events wait in the map (at most MaxPending of them; a new one beyond is
// dropped and counted), and Run retries with back-off. An API server that
// refuses an Event (403: no RBAC for events) drops it, counted, and logs the
// refusal once until an Event is accepted again. Answers are read to at
// most 64 KiB and each request is bounded by RequestTimeout.
//
// # Concurrency
//
// Record and Stats are safe from any goroutine, on a nil *Recorder too
// (they do nothing). Run is called once.
//
// # Debugging
//
//	kubectl events -n default --for node/NODE
//	kubectl get events -n default --field-selector involvedObject.name=NODE
//	kubectl describe node NODE
//
// Stats counts what was written, failed, refused and dropped.
package kubeevents
