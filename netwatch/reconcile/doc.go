// Package reconcile keeps the kernel at a policy's desired state: the
// routes and rules a policy wants, limited to the tables and rule
// priorities it owns, planned against a netwatch cache and applied with a
// netwatch.Applier, in the one loop every netwatch program runs.
//
// A program is a policy and a few lines around it:
//
//	w := netwatch.New(netwatch.Options{})
//	go w.Run(ctx)
//	a, _ := netwatch.DialApplier(nil)
//	r := &reconcile.Reconciler{Watcher: w, Applier: a, Policy: policy, Logger: log}
//	return r.Run(ctx)
//
// where policy is a pure function from a netwatch.View to a Desired state.
// The package Example is a whole one, for both families.
//
// # Desired state and plans
//
// A Desired state names the routes and rules a policy wants, the scope it
// owns (Own(table, priority) for both families), any foreign routes it
// repairs, and Notes: why it wants less than it could ("link wg0 not
// found"), which the Reconciler logs once. Plan turns a View and a Desired
// into ordered operations (make before break), touching nothing outside the
// owned scope; it takes an IPv6 metric 0 as the kernel's 1024, and rejects a
// Desired it cannot plan with a *PlanError naming links by name. Plan is
// pure: a policy is tested with a netwatch.Snapshot and no kernel.
//
// # The loop
//
// A Reconciler runs a pass on every change of the cache and every Trigger
// (a burst coalesced into one pass), once the cache is synced; ok false
// from the policy means "cannot tell yet" and changes nothing, an empty
// Desired means "remove everything owned". It logs each change with
// Op.Describe, waits (Barrier) until the cache holds its own changes before
// planning again, retries a failed pass with backoff (never a PlanError: it
// is logged once and waits for a change), and resyncs periodically. It
// tells another program undoing what it made from the kernel's own flushes
// (see Reconciler).
//
// # Memory
//
// A pass costs memory for a chunk of operations, not for all of them: the
// planner yields Plan's order a thousand operations at a time, and the
// Reconciler describes, applies and settles each chunk before planning the
// next from a fresh view. What it remembers of the objects it changed is
// about 50 bytes for one changed once and never undone. The desired routes
// are the one cost that grows with the pass: 44 bytes each (IPv4) or 96
// (IPv6) in Desired.Routes, a netwatch.RouteSet, which the planner reads
// in place, whatever routes the policy put in it.
//
// # Owned values
//
// OwnTable, OwnPriority, MarkMask, OwnProtocol and LinkName are the values
// a program names what it owns with: flag.Values whose Check is the one
// validation that the agent, its policy and the examples share.
//
// # Concurrency
//
// Plan is safe for concurrent use. A Reconciler's Run is called once; its
// Trigger and Converged are safe from any goroutine. Its hooks are called
// from Run's goroutine: Policy inside Watcher.Read, holding the cache's
// read lock (compute, do no I/O, as a pure policy does), the others
// (OnPass, OnFight, Describe) outside it.
package reconcile
