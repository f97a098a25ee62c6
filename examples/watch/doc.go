// Command watch is a typed `ip monitor`: it prints a network namespace's
// links, addresses, routes of every table and rules, one object per line,
// after the initial sync; then, unless -once, one line per change, saying
// whether the object is new or gone and who changed it.
//
// With -json the lines are the state dump docs/design.md defines: JSON
// objects that equal what `ip -j -d link`, `ip -j addr`, `ip -j -d route
// show table all` and `ip -j -d rule` report for the same namespace, every
// attribute included, which makes watch the way to check the netwatch cache
// against the kernel. Without -json they are ip(8)'s words.
//
// A receive buffer overflow, after which the cache is read again, is
// reported on standard error.
package main
