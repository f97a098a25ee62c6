// Package sockdiag asks the kernel's socket diagnostics
// (NETLINK_SOCK_DIAG, what ss uses) who holds a socket: the netlink
// sockets of a namespace with their inodes, the listening unix sockets with
// their names and owners, the owner of one TCP connection. It needs no
// privilege.
//
// # Concurrency
//
// A Conn serves one request at a time: use it from one goroutine, or dial
// one per goroutine.
//
// # Network namespaces
//
// The kernel answers for the network namespace the socket was opened in:
// Dial's netns names it (0: the calling thread's).
package sockdiag
