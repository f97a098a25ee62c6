// Package lock keeps one marksplit per routing table and per rule priority in
// a network namespace: Claim takes both, and a claim another agent holds fails
// with a HeldError that names the holder.
//
// Each agent (and each once or cleanup) binds an abstract unix socket of
// its own, "@marksplit/agent/table=T/priority=P/NONCE", with a random
// NONCE, and then lists the namespace's listening unix sockets
// (NETLINK_SOCK_DIAG, which names each socket's owner): another one under
// "@marksplit/" with the same table or the same priority, whose owner is
// root or our own user, holds them. Abstract sockets belong to the network
// namespace, which is exactly the lock's scope, and the kernel releases
// one when its holder dies, so a crash leaves no stale lock; no file is
// needed (the DaemonSet's root filesystem is read-only).
//
// Anyone may bind any abstract name, so a name alone proves nothing: a
// socket an unprivileged user owns is ignored (Lock.Warning names it), and
// the random NONCE means no one can bind an agent's name before it. Of two
// privileged claimants the one that bound first keeps the lock: each
// answers a connection with the CLOCK_MONOTONIC time it took after
// binding, and a claimant that finds an earlier holder gives up. Two
// agents starting at once may thus both see the other; the later one
// yields, whichever order their scans ran in.
//
// # Network namespaces
//
// Claim works in the network namespace of the calling thread's process: run
// it on the thread (or in the process) that lives there.
package lock
