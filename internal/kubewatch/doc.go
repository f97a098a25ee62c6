// Package kubewatch tells whether one named object of the Kubernetes API exists, and
// follows it as it is created, changed and deleted, with net/http only (internal/kubeapi).
//
// The agent uses it for its uninstall switch: a ConfigMap that the operator creates by
// hand and that no manifest ships, so that no re-apply (kubectl apply -k, helm upgrade,
// a GitOps reconcile) can remove it. Only the object's existence matters; its data is
// never kept. The agent also follows Cilium's cilium-config for one key, encrypt-node
// (Config.Key, RunKey): of the data, that key's value alone is kept.
//
// # The protocol
//
// A Watcher LISTs the collection with fieldSelector=metadata.name=NAME (one request that
// answers "absent" as well as "present", with a resourceVersion either way; a GET would
// answer 404 with none to watch from), then watches the same selection from the list's
// resourceVersion with bookmarks. Kubernetes authorizes a list or watch narrowed to one
// name by metadata.name against an RBAC rule's resourceNames, so a Role limited to the one
// name suffices (test/k8s proves it on kube-apiserver 1.37).
//
// A watch that ends is resumed from the last resourceVersion seen; 410 (Gone) and an
// event that cannot be trusted (another object's name, no resourceVersion, a wrong kind)
// start over with a list; the list is also read again every Config.Resync while the watch
// is healthy. A watch that completes no event, not even a bookmark, for
// Config.WatchTimeout is restarted. Failures back off (Config.Backoff), and a watch that
// keeps failing right after a list is not retried hot. This is the list-watch loop of
// package kubeapi (kubeapi.ListWatch), which the CiliumNode sources share.
//
// # Bounds
//
// A list answer or one watch event larger than MaxBody fails the request; a list with
// more than one item, or an item of another name, is an error. Objects are decoded into
// their kind and metadata alone. Whatever the server sends, a Watcher holds at most a
// few times MaxBody.
//
// # States
//
// Run reports Present or Absent after the first good list and after every change;
// RunKey reports the same with Config.Key's value, and again whenever the value changes. When
// the first list fails it reports Unknown once, so that its user can decide not to wait
// any longer; after a good list no failure changes the reported state: the last one
// stands until the API answers again.
//
// # Concurrency
//
// Run calls report from its own goroutine only; at most one Run at a time.
//
// # Debugging
//
// Failures are logged at warn level with the server's status and message (a 403 names
// the missing permission); at debug level every list, resync and watch resumption.
package kubewatch
