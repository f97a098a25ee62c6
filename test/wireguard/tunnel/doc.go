// Package tunnel drives traffic through a WireGuard tunnel between two
// network namespaces and reads what the kernel did with it: the test kit
// that the end-to-end test (../) and `make demo` (through ../cmd/wgtunnel)
// share.
//
// It sends full-size datagrams through the tunnel and counts the answers
// and the sending node's IPv4 fragmentation counters (FullSize), times a
// bulk TCP transfer bounded in bytes and time (Bulk), and builds the
// userspace wireguard-go once from its pinned module (BuildWireGuardGo).
//
// # Network namespaces
//
// Every function that touches the network takes the names of the
// namespaces (as `ip netns` names them, /run/netns/NAME) and opens its
// sockets on an OS thread switched into them (In): the test process and
// the host's own namespace are never used, and no process is left behind.
//
// # Debugging
//
// Counters are read from /proc/thread-self/net/snmp inside the namespace,
// the same file `ip netns exec NAME cat /proc/net/snmp` shows.
package tunnel
