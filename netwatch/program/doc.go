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
// # Network namespaces
//
// A Program works in the namespace --netns names, else in its NetNS
// field, else in the process's own. NetNS may be netwatchtest's fake
// kernel (Kernel.NetNS): a program's test runs main's own command line
// there, without a kernel.
package program
