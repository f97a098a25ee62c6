// Command marksplit keeps host traffic to a Kubernetes node's private
// network at the WireGuard tunnel MTU while WireGuard's own marked packets
// keep the interface MTU: it copies the selected main-table routes into a
// table of its own at the tunnel link's live MTU and installs one rule,
// "not fwmark 0xe00/0xf00 lookup 900", reacting to rtnetlink events within
// milliseconds.
//
// Usage:
//
//	marksplit [run]   [flags]   reconcile until SIGTERM/SIGINT (exit 0, routes left in place)
//	marksplit once    [flags]   one pass: apply, print each change, exit 0 when converged
//	marksplit plan    [flags]   print the operations a pass would make; change nothing
//	marksplit cleanup [flags]   remove every route and rule the agent owns
//	marksplit verify --peer ADDR [flags]
//	                            ask the kernel for ADDR without and with the mark
//	marksplit health [--ready]  ask the running agent over its health socket
//	                            (the kubelet's exec probes)
//
// Every subcommand takes the policy flags (--tunnel-link, --mark, --table,
// --priority, --peers, --prefix, --underlay-link, --protocol); `marksplit -h`
// lists them all. A bad command line exits 2 with one line. The command
// line, the lock, the loop and the signals are netwatch/program's, as for
// every program built on the library: the agent is a program.Program with
// verify and health as its own Commands, and its sources and servers in
// its Start (commands_linux.go). --netns works for once, plan, cleanup and
// verify; run works in the namespace it runs in.
//
// # What is split
//
// --peers=auto list-watches every CiliumNode and gives each InternalIP of
// every other node that encrypts a host route in the table, through the
// path the main table uses for it (see mtupolicy.DesiredPeers); it needs
// the API (the pod's service account, as --encryption=auto) and excludes
// --prefix and --underlay-link. Before the first complete list nothing is
// edited; when the API goes away the last peer set stands. With
// --encryption=auto the node's own mode comes from the same list, so one
// watch serves both. --prefix and --underlay-link split main-table routes
// instead, without the API.
//
// # The loop
//
// run keeps a netwatch cache of the main table and its own table (plus
// every link, address and rule) and makes a pass after each change to it,
// each change of the encryption mode, and every five minutes after a full
// resync: view → mtupolicy.Desired → reconcile.Plan → apply. Bursts of
// events are coalesced (a pass runs 1 ms after the last trigger, at most
// 10 ms after the first). Each kernel change is logged in one line naming
// the object and what it was before; a pass that changes nothing logs
// nothing.
//
// Fights: another program undoing what the agent made three times in a
// row, each within a minute of the last, is a fight (reconcile.Reconciler
// tells it from the kernel's own flushes by the origin of each change). One
// warning per episode names the object and the program; every object is
// repaired at once up to 20 times, then at most every 100 ms, so a fight
// never becomes a hot loop and no repair waits longer. marksplit_fights_total
// counts the episodes and marksplit_fight_in_progress is 1 during one.
//
// # Encryption mode
//
// --encryption=on or off is static. auto reads the node's CiliumNode from
// the in-cluster API with the pod's service account, whose token and CA
// are read from $MARKSPLIT_SERVICEACCOUNT_DIR (default
// /var/run/secrets/kubernetes.io/serviceaccount). Before the first good
// read nothing is edited.
//
// # Network namespaces
//
// marksplit works in the network namespace it runs in (hostNetwork in the
// DaemonSet; `ip netns exec NS marksplit …` for tests and the demo). The
// fragmentation counters it exports come from that namespace's
// /proc/net/snmp. One run (or once, or cleanup) per table and per priority
// in a namespace: each claims an abstract unix socket of its own, and a
// privileged one already there for the same table or priority keeps them
// (program.Claim); cleanup beside a running agent removes nothing.
//
// # Debugging
//
// `marksplit plan` shows what a pass would do. /metrics has passes,
// changes and failures by kind, fights, resyncs and events; /healthz says
// whether the cache is synced, /readyz whether a pass has converged; so do
// `marksplit health` and `marksplit health --ready`, over the health socket
// (health_linux.go), which no other local user can take or flood.
package main

import "os"

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)
