// Package netwatch keeps a typed, exact cache of a Linux network namespace's
// links, addresses, routes (every table, IPv4 and IPv6) and policy rules,
// fed by rtnetlink multicast, and makes kernel changes (Applier).
//
// It has two companions. Package reconcile turns a policy (a pure function
// from a View to the routes and rules it wants, limited to what it owns)
// into kernel changes, in the one loop every netwatch program runs:
//
//	w := netwatch.New(netwatch.Options{})   // the cache
//	go w.Run(ctx)                           // the caller runs it
//	a, _ := netwatch.DialApplier(nil)       // nil: this thread's namespace
//	r := &reconcile.Reconciler{Watcher: w, Applier: a, Policy: policy, Logger: log}
//	return r.Run(ctx)                       // the one loop
//
// Package netwatchtest is the test kit: a fake rtnetlink kernel with fault
// injection (its NetNS puts a Watcher or an Applier on it) and helpers for
// real-kernel tests in throwaway network namespaces.
//
// # Reading
//
// A Watcher subscribes to the rtnetlink groups before it dumps, applies the
// events queued during the dump after it, and from then on applies every
// event. WaitSynced waits for the first sync. Read gives a consistent View
// without copying the cache. There are three ways to be told about changes,
// one per need: View.Changed returns a channel closed at the first change
// after that view, which any number of goroutines may wait on (to re-derive
// state, as the reconcile loop does); View.Changes lists the changes since
// an earlier view with who made them (to tell an undo from a flush);
// Subscribe delivers every change as an Event, in order (for tools that
// print them). Barrier waits until
// the cache holds every change the kernel made before the call, such as the
// caller's own.
//
// A View answers what policies ask: Link, LinkByName, Addrs, Routes, Rules, and
// the questions every policy has: SourceAddrs (a link's usable addresses of a
// family, primary first), DefaultRoutes (out of a link, lowest metric first),
// each in a documented order, RoutesWithin (the routes inside a prefix) and
// Covering (the routes of a table's longest prefix that holds an address: those
// a lookup there picks among). Link and address flags are typed and tested as net.Interface's are (l.Flags&LinkUp !=
// 0; LinkLowerUp, AddrTentative). Options.RouteTables limits
// the route cache to some tables; View.Cached says which, and reconcile.Plan
// refuses to own or repair a table outside them.
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
// reconnects with backoff (Options.RetryMin, RetryMax) and resyncs.
// View.Synced tells a caller whether the view is complete: nothing may be
// removed on the strength of a view that is not. Every attribute the kernel
// reports is kept: what netwatch has no field for is in Route.Attrs and
// Rule.Attrs, compared and written back.
//
// # Changing
//
// An Applier makes the changes an Op names, idempotently: Result.Already
// tells "already so" (an add of what exists, a delete of what the kernel had
// removed) from "done", and a refusal is an *ApplyError that errors.Is
// matches against the errno. Op.Describe renders a change as the one log
// line that says what it was before. Applier.RouteGet asks which route the
// kernel would choose, like `ip route get`. Route.Matches compares a wanted
// route with the kernel's, ignoring the flags the kernel sets itself
// (see Route.Clean).
//
// # Network namespaces
//
// Options.NetNS (from OpenNetNS, given a path such as /run/netns/NAME)
// puts a Watcher in that namespace, and DialApplier's argument an Applier;
// nil is the calling thread's. The namespace must stay open while they run: a Watcher
// opens new sockets when it reconnects. Nothing in the package changes a
// thread's namespace.
//
// # Concurrency
//
// A Watcher's methods are safe for concurrent use. Read holds a read lock
// while its callback runs, so events wait: compute in the callback, do I/O
// after it. An Applier is for one goroutine at a time.
//
// # Full tables
//
// A dump is read a datagram at a time and cached on a second goroutine
// while the kernel fills the next. Ordinary routes are decoded straight
// into pointer-free keys and values that the kernel dumps in order, so a
// table fills by appending to a sorted array: about 40 bytes a route,
// nothing for the garbage collector to scan. Past its first 4,096 routes a
// table's array is mapped outside the Go heap, so that a large table
// neither paces the collector nor shows in runtime.MemStats:
// Stats.MappedBytes reports it (BenchmarkKernelInitialSync).
//
// # Reading the source
//
// The files are named for the stage of the data flow they hold, in this
// order: model (the types and their text forms), kernel_ (sockets,
// namespaces, the owners of ports), wire_ (rtnetlink bytes to values and
// back), cache_ (the Watcher, its dumps, the sorted route store, the
// journal, Subscribe, Barrier), view (View and its questions) and apply
// (Op and the Applier).
//
// # Debugging
//
// examples/watch prints the cache as JSON lines (go run ./examples/watch
// -json -once); they equal what `ip -j` reports for the same namespace, so
// a divergence is a diff away. Watcher.Stats counts events by kind, resyncs
// by cause and the duration of the last full sync, and the memory the
// routes hold outside the heap.
package netwatch
