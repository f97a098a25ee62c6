// Package program is the command around a policy: the subcommands, flags,
// signals and single-instance lock of every program that owns a routing
// table and a rule priority, the marksplit agent included, so that
// package reconcile stays the loop alone.
//
// A program is a Program with its name and defaults, its own flags added
// to Flags, and a function that checks them and returns the policy:
//
//	func main() {
//		var c Config
//		p, build := command(&c)
//		p.Main(build)
//	}
//
// Every program so built takes the same command line:
//
//	NAME [run|once|plan|cleanup] [flags]
//
// run (the default) keeps the kernel at the policy until SIGINT or
// SIGTERM; once makes passes until one finds nothing to do, printing each
// change; plan prints what a pass would change and changes nothing;
// cleanup removes every route and rule the program owns. The standard
// flags are --table, --priority and --protocol (what it owns and stamps,
// with the help text of OwnerFlags), --netns and --resync; every help
// text names a flag with two dashes (PrintFlags), and a bad command line
// exits 2 with one line naming the flag (FlagError). A second SIGINT or
// SIGTERM ends the program at once.
//
// A program with more to it than a policy (the agent) adds its own
// subcommands (Commands: the agent's verify and health), a Version, a Help
// text, and Start: what the policy reads besides the kernel (the agent's
// CiliumNodes) and, with run, the program's servers, started once the
// watcher runs and waited for on the way out. build may set the Logger
// from the program's own flags. A watcher that stops ends the subcommand
// with its error.
//
// cleanup beside a running holder of the table or the priority removes
// nothing, as the holder would put it back at once: it exits 0 with a note
// when nothing owned is left, else 1 with one line saying how many routes
// and rules it would have removed and how to stop the holder (StopHolder).
//
// # The lock
//
// run, once and cleanup first Claim the table and the priority in the
// namespace: one program per table and per priority in a network
// namespace, whichever programs they are (the agent among them). Each
// claimant binds an abstract unix socket of its own,
// "@netwatch/owner/table=T/priority=P/NONCE", with a random NONCE, and
// then lists the namespace's listening unix sockets (NETLINK_SOCK_DIAG,
// which names each socket's owner): another lock socket with the same
// table or the same priority, whose owner is root or our own user, holds
// them. Abstract sockets belong to the network namespace, which is
// exactly the lock's scope, and the kernel releases one when its holder
// dies, so a crash leaves no stale lock; no file is needed.
//
// Anyone may bind any abstract name, so a name alone proves nothing: a
// socket an unprivileged user owns is ignored (Lock.Warning names it).
// Of two privileged claimants the one that bound first keeps the lock:
// each answers a connection with the CLOCK_MONOTONIC time it took after
// binding and its program's name, and a claimant that finds an earlier
// holder gives up, whichever order their scans ran in.
//
// For one release a claim also binds the agent's old name,
// "@marksplit/agent/table=T/priority=P/NONCE", answering there as the
// agent of the release before did, and honours the sockets under
// "@marksplit/": an old and a new agent never both run in a rolling
// upgrade, in either order.
//
// # Network namespaces
//
// A Program works in the namespace --netns names, else in its NetNS
// field, else in the process's own. NetNS may be netwatchtest's fake
// kernel (Kernel.NetNS): a program's test runs main's own command line
// there, without a kernel. Claim binds its sockets in the namespace it
// is given, on a thread it moves there; a fake kernel's namespace has no
// lock to take.
package program
