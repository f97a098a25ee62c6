// Package mtupolicy decides which routes and rules give host traffic the
// tunnel MTU while the encrypting link's own packets keep the interface MTU:
// a pure function from a netwatch.View, a Config and the node's encryption
// Mode to a reconcile.Desired, which reconcile.Plan turns into operations.
//
// # The split
//
// Cilium sends host traffic to other nodes through its WireGuard link, whose
// MTU is smaller than the underlay's, and marks WireGuard's own UDP with
// 0xe00/0xf00. The policy copies each selected main-table route into its
// own table with the tunnel MTU, and adds one rule per family,
// "not fwmark 0xe00/0xf00 lookup 900": every unmarked packet finds the copy
// (tunnel MTU), and the marked WireGuard packets fall through to the main
// table (interface MTU). Routes lowered to the tunnel MTU by the older
// approach of editing the main route are put back (a repair).
//
// # Peers
//
// With Config.Peers the table holds host routes instead of copies: one per
// address of each encrypting peer node, through the path the main table
// uses for it (longest-prefix match, the default route included), at the
// tunnel MTU. The caller learns the peers (from every CiliumNode) and
// passes them to DesiredPeers; Desired then answers only Off. Only
// encrypting peers get the tunnel MTU: other hosts on the node network,
// opted-out nodes and the node itself keep the main table. The path comes
// from an index of the main table, which a pass builds by walking it; a
// PeerCache keeps the index between passes while the main table does not
// change, so that a pass costs what the peers cost, not what the table does
// (BenchmarkPeerCache).
//
// The index is not netwatch.View.Covering, for two reasons. The path is the
// kernel's: the longest prefix with a live route that matches every packet,
// passing over dead routes and those with a TOS or a source prefix to
// shorter prefixes, and the throws need those selective routes too, which
// Covering (the routes of the longest prefix alone) does not give. And
// Covering reads, once a call, the routes that wait for the table's next
// compaction (up to a quarter of it: about 0.4 ms a lookup with 24,000,
// BenchmarkCoveringSideMap), which a pass would pay once a peer: seconds at
// 15,000 peers. The index costs a probe per prefix length in use.
//
// Each peer's host route may carry a smaller MTU than the tunnel's: the
// caller passes the inner MTU each peer's path carries (InnerMTUs, which
// internal/pathmtu measures), and the route gets the smaller of the two,
// without a lock, so that ICMP can still lower it (PeerMTU). A value below
// the family's minimum is not installed; a note names the peer.
//
// # A WireGuard mesh
//
// With Config.Mesh the table holds each peer's allowed IPs of a WireGuard
// device (the tunnel link) that the main table already sends through it,
// at that peer's inner MTU; the caller reads the device and passes its
// peers and fwmark to DesiredMesh. The rule excludes the device's own
// fwmark, so its encrypted packets never take the table (mesh.go).
//
// # Ownership
//
// The policy owns its table and its rule priority in both families: Plan
// removes whatever it finds there that the policy does not want, and never
// removes anything else. The only foreign routes it changes are its repairs.
// Off, or with the tunnel link gone, the owned scope is emptied. With the
// mode unknown (no good read yet), Desired says so and nothing is planned.
//
// # Concurrency
//
// Everything here is a pure function of its arguments: no I/O, no clock, no
// logging, no state. It builds and runs on any OS.
//
// # Debugging
//
// `marksplit plan` prints the operations a pass would make, without making
// them. Everything the policy installs carries Config.Protocol
// (DefaultProtocol, 109): `ip route show table all proto 109` lists its
// routes (throw routes included), and `ip rule` prints "proto 109" on its
// rules.
package mtupolicy
