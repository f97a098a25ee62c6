// Package netwatch keeps a typed, exact cache of a Linux network namespace's
// links, addresses, routes (every table, IPv4 and IPv6) and policy rules,
// fed by rtnetlink multicast, and applies a desired state limited to what
// its caller owns.
//
// # Reading
//
// A Watcher subscribes to the rtnetlink groups before it dumps, applies the
// events queued during the dump after it, and from then on applies every
// event. Read gives a consistent View for a reconcile pass without copying
// the cache; Changed returns a channel closed at the next change, which any
// number of goroutines may wait on; Subscribe delivers every change as an
// Event, for tools that print them. Barrier waits until the cache holds
// every change the kernel made before the call, such as the caller's own.
//
// # Who changed what
//
// Every Event carries its Origin: the kernel itself (a notification with
// port 0, which is also what link and IPv6 address notifications carry
// whoever asked), this process's own sockets, another program (the netlink
// port of its socket and, where /proc shows the socket's owner, its PID and
// command name), or a re-dump (a difference a resync found: a change the
// kernel makes without an event, such as the IPv4 routes it flushes when a
// link goes down, or one whose event an overflow lost). The journal behind
// View.Changes keeps the latest changes with their origins.
//
// The cache never silently diverges from the kernel: a receive buffer
// overflow (ENOBUFS) or an undecodable message causes a full re-dump that is
// swapped in at once; a dump the kernel marks interrupted is repeated; the
// routes the kernel removes or changes without an event (IPv4 routes of a
// link that goes down or away, or of an address that is removed; linkdown
// flags) are re-dumped after the event that implies them; a socket failure
// reconnects with backoff and resyncs. View.Synced tells a caller whether
// the view is complete: nothing may be removed on the strength of a view that
// is not.
//
// # Full tables
//
// A dump is read a datagram at a time and cached on a second goroutine
// while the kernel fills the next. Ordinary routes are decoded straight
// into pointer-free keys and values that the kernel dumps in order, so a
// table fills by appending to a sorted array: about 40 bytes a route,
// nothing for the garbage collector to scan, and a sync of a million
// routes that takes less than mdlayher/netlink needs to read the dump
// (BenchmarkKernelInitialSync). Options.RouteTables leaves out the tables
// a caller does not need.
//
// # Changing
//
// A policy is a pure function from a View to a Desired state: the routes
// and rules it wants, the tables and rule priorities it owns, and any foreign
// routes it explicitly repairs. Plan turns a View and a Desired into ordered
// operations (make before break), touching nothing outside the owned scope;
// an Applier executes them idempotently (adding what exists and deleting
// what is gone succeed; rules are added with NLM_F_EXCL and deleted with
// their full key, because the kernel ignores NLM_F_REPLACE for rules).
// A Reconciler runs the whole loop for a policy, the one loop every program
// runs: plan on every change or Trigger (a burst coalesced into one pass),
// apply, log each change with Op.Describe, wait (Barrier) until the cache
// holds its own changes before planning again, retry with backoff, resync
// periodically. It tells another program undoing what it made from the
// kernel's own flushes: every object is changed at most a burst of times at
// once and then ten times a second, and a fight is one warning naming the
// program. The package Example shows a policy in a few lines.
//
// # Concurrency
//
// A Watcher's methods are safe for concurrent use. Read holds a read lock
// while its callback runs, so events wait: compute in the callback, do I/O
// after it. An Applier is for one goroutine at a time.
//
// # Network namespaces
//
// KernelDialer{NetNS: fd} opens every socket in the namespace fd refers to;
// the zero value uses the calling thread's. Nothing in the package changes
// a thread's namespace.
//
// # Debugging
//
// examples/watch prints the cache as JSON lines (go run ./examples/watch
// -json -once); they equal what `ip -j` reports for the same namespace, so
// a divergence is a diff away. Watcher.Stats counts events by kind, resyncs
// by cause and the duration of the last full sync.
package netwatch
