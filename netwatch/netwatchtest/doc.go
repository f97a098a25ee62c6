// Package netwatchtest is what netwatch programs are tested with, as this
// project tests its own: a fake rtnetlink kernel with fault injection, and
// helpers that run real-kernel tests in throwaway network namespaces.
//
// A policy's pure part needs neither: build a netwatch.Snapshot and call
// reconcile.Plan. A program's loop runs on the fake kernel (fast, and able
// to overflow, refuse or interrupt on demand), and its effect is proven on
// the real kernel.
//
// Both hand out a *netwatch.NetNS the same way, Kernel.NetNS and
// NetNS.NetNS, and every question a test asks takes one, so that one test
// runs on either: RouteGet (where a packet goes, as a Hop), OwnedText
// (the routes of a table and the rules at a priority, as ip(8) prints
// them), and WaitRoute and WaitOwned, which poll them until the namespace
// agrees or a deadline passes. The fake kernel answers from its state; a
// real namespace with ip(8), an oracle independent of netwatch.
//
// # The fake kernel
//
// New returns a Kernel that looks like a fresh network namespace, in
// netwatch's own types. Kernel.NetNS is a netwatch.NetNS: given to
// netwatch.Options.NetNS or netwatch.DialApplier, it runs a watcher or an
// applier on the fake, over real rtnetlink messages (encoded with
// github.com/jsimonetti/rtnetlink/v2) through a real *netlink.Conn, so the
// library's own sequence checks and error decoding apply. Tests build state
// and make "foreign" changes with the Kernel's methods (AddLink, SetLinkUp,
// AddRoute, DelRule, …; Program for another program's requests, whose
// events carry its port), read it back as a netwatch.Snapshot, inject
// faults (Overflow, SetDumpIntr, FailNext, FailAll) and inspect what was
// asked (Requests).
//
// The answers were taken from a 6.18 kernel, and the fake's own tests
// check them against the running kernel by sending both the same requests.
// The fake kernel models Linux and builds only there; the package builds
// everywhere.
//
// # Concurrency
//
// A Kernel is safe for concurrent use: one mutex serializes every change,
// so events reach all subscribers in the same order. Nothing starts
// goroutines; closing the Kernel leaves nothing behind. NetNS pins one
// locked OS thread per namespace until the test ends.
//
// # What is modelled
//
//   - Links: index, name, kind, MTU, admin state with the flags and
//     operational state the kernel reports; RTM_NEWLINK (create with a kind,
//     set up/down, MTU), RTM_DELLINK, RTM_GETLINK (single and dump).
//   - Addresses of both families, IPv4 primaries and secondaries, with the
//     kernel's answers (EEXIST, EADDRNOTAVAIL, ENODEV and their messages).
//   - Routes of every table and both families, keyed by (family, table,
//     destination, TOS, metric), IPv6 metric 1024 by default; tables that
//     exist once something created them (IPv4 none at first, IPv6 main and
//     local); create, exclusive create (EEXIST), replace; deletes as the
//     kernel's: the IPv4 wildcards (scope RT_SCOPE_NOWHERE, metric 0), an
//     IPv6 metric 0 that means 1024, a gateway or link given that must
//     match, and on IPv4 every metric given; every route metric
//     (RTA_METRICS), "mtu lock" included, kept, clamped and refused as
//     the kernel does; ENODEV, ENETDOWN,
//     ESRCH, ENOENT and the validation errors with their messages; strict
//     dumps filtered by table, protocol, type and output link (ENOENT
//     for a missing table; every strict route dump carries
//     NLM_F_DUMP_FILTERED, as the kernel's do); route lookups
//     (RTM_GETROUTE without a dump) through the rules, with marks, "not",
//     RTM_F_LOOKUP_TABLE and RTM_F_FIB_MATCH.
//   - Rules of both families in kernel order, plus the fixed rules of the
//     multicast-routing families 128 and 129 in dumps, as the distributions'
//     kernels have them (the fake's own tests follow the kernel they run on,
//     which may lack them); NLM_F_REPLACE adds
//     a duplicate, NLM_F_EXCL is EEXIST on an identical rule (the kernel
//     does not compare "not"), a delete removes the first rule matching
//     what it names, a mark without a mask means mask 0xffffffff.
//   - Side effects with their events, as the kernel: a link going down
//     loses its IPv4 routes silently and its IPv6 routes and addresses with
//     RTM_DELROUTE/RTM_DELADDR; removing an IPv4 address removes its
//     secondaries and the main-table routes using it as prefsrc (with
//     events), and when it was the link's last, every IPv4 route through
//     the link (silently); deleting a link does all of that.
//   - Multicast to the conns that joined the groups, carrying the
//     requester's port and sequence (link and IPv6 address events carry 0,
//     as the kernel's do; the kernel sends a new IPv6 address's event
//     later, after duplicate address detection, the fake at once),
//     NLM_F_ECHO; a bounded receive queue sized like
//     the kernel's (twice the requested buffer, a per-datagram overhead):
//     an event that does not fit is lost and the next receive fails with
//     ENOBUFS; from then on every event for that conn is dropped without
//     another error until its queue has been read empty (the kernel's
//     NETLINK_S_CONGESTED, checked on the kernel).
//   - Replies as the kernel sends them: multi-part dumps in several
//     datagrams, DONE on its own, errors of dumps in DONE, NLMSG_ERROR
//     echoing the request with the extended-ack message.
//
// # What is not
//
// Routes the kernel derives from addresses and link state (prefix, local
// and broadcast routes, IPv6 link-local addresses, multicast routes),
// gateway reachability, multipath and nexthop objects, several routes per
// key (append, prepend), source-specific routes, congestion control
// algorithms other than reno and cubic, IPv6 duplicate address detection
// and address lifetimes, link
// carrier (an up link has carrier), veth peers and link renames, rule
// actions other than lookup, blackhole, unreachable and prohibit, rule
// selectors beyond from, to, tos, fwmark, iif and oif. A request that uses
// something not modelled fails with EOPNOTSUPP and an extended-ack
// message starting with "netwatchtest:", so a test cannot pass by accident.
//
// # Real-kernel tests
//
// NewNetNS gives a test a fresh namespace, and skips a test that cannot
// run here (not root, no network namespaces, no ip(8)); RequireKernel,
// called first, fails it instead, for a CI that must not skip (this
// project's tests call it when MARKSPLIT_KERNEL_TESTS=1). Dial into the
// namespace with netlink.Config{NetNS: ns.FD()}, inspect it with ns.IP and
// ns.IPJSON; it is removed when the test ends. Named gives it a name in
// /run/netns for tools that want one. For programs built on netwatch,
// StartProgram runs one for the length of a test, on either face (its
// program.Program's NetNS set to ns.NetNS() or Kernel.NetNS()),
// WaitRoute and WaitOwned on that NetNS wait for the kernel to show what
// the test expects, and BuildProgram with ns.StartBinary runs the built
// binary to check its signal handling.
package netwatchtest
