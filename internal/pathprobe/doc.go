// Package pathprobe measures the path MTU to each peer node with probes of
// its own — separate packets, bounded in rate and count — and answers other
// nodes' probes: the "probed" source of per-peer path MTUs, for paths that
// drop large packets without a word (no ICMP).
//
// # Probes
//
// A Prober sends UDP probes with DF set in probe mode (IP_PMTUDISC_PROBE,
// IPV6_PMTUDISC_PROBE: a path-MTU exception the kernel learned a moment
// earlier neither cuts a search short nor lets a probe be fragmented) and
// the tunnel's mark (Config.Mark, SO_MARK: probes take the route WireGuard's
// own packets take, the main route, not the split table's). Each size goes
// out from Config.Sources source ports at once, so that ECMP legs hashed on
// ports are sampled: a size passes only when it was answered on every one,
// so the path's value is its smallest leg's.
//
// A search probes max first (the caller's largest size worth trying: the
// MTU of the main route to the peer), then Config.Ladder's rungs above the
// base, smallest first, up to the first that fails, then binary-searches
// between the largest size that passed and the smallest that failed on a
// grid of Config.Step (16) bytes, placed where
// WireGuard's inner MTU changes: floor16(PathMTU − 60) on IPv4 (− 80 on
// IPv6) equals that of the path's true size. Every round also carries one
// base-size probe (1200 bytes on IPv4, 1280 on IPv6). A size fails only
// when its probes were lost while the base-size probe of the same round
// was answered, in each of Config.Tries rounds; any round whose base-size
// probe was lost too ends the search "unreachable" (Result.Unreachable),
// which must change nothing. A full path costs one round (Sources+1
// packets); a reduced one 6 to 10 rounds (TestSearchEveryPathSize).
//
// With Config.ICMPEcho, a peer whose responder does not answer is searched
// again with ICMP echo (ping sockets, DF, the mark). The echo reply is as
// large as the request, so the reverse path must carry the size too.
//
// # Usage
//
//	p, err := pathprobe.NewProber(pathprobe.Config{Mark: 0xe00}) // in the node's network namespace
//	...
//	defer p.Close()
//	s, err := pathprobe.NewScheduler(pathprobe.SchedulerConfig{
//		Searcher: p,
//		Deliver: func(r pathprobe.Result, err error) {
//			// not under the scheduler's locks; one call at a time
//			if err != nil || r.Unreachable { return } // change nothing
//			store(r.Peer, r.PathMTU) // a path size P: inner MTU floor16(P − 60) (IPv4)
//		},
//	})
//	go s.Run(ctx)
//	s.Sync(map[netip.Addr]int{peer: mainRouteMTU}) // every pass: new peers and changed max are searched at once
//	s.Trigger(peer)                                  // the main path to it changed, an ICMP signal fired
//
//	r := &pathprobe.Responder{Allow: isClusterNode}   // on every node
//	go r.Serve(ctx)
//
// The Scheduler searches each peer when it appears, when its max changes,
// when triggered (triggers coalesce), and otherwise about every
// SchedulerConfig.Interval (10 minutes, with jitter). All searches share
// the Prober's rate limit (Config.Rate, 20 packets/s node-wide): with
// thousands of peers the rate holds and the cycle stretches.
//
// # Responder
//
// A Responder answers probes on UDP port Config.Port (DefaultPort, 9186)
// from the addresses Allow accepts (the cluster's nodes), at a bounded
// rate, with a short answer (20 bytes) that states the size it received:
// never more than the probe (no amplification), and the reverse path's MTU
// does not matter. It reads only a probe's header (MSG_TRUNC tells the
// size), so garbage, floods and spoofed sources cost one read each.
//
// # Network namespaces
//
// NewProber opens its sockets, and Responder.Serve its socket, in the
// network namespace of the calling thread; they stay there whichever
// goroutine uses them later.
//
// # Concurrency
//
// A Prober's Search is safe from many goroutines; all share one rate
// limit. Scheduler methods are safe from any goroutine; Run is called once.
//
// # Debugging
//
//	ip route get PEER mark 0xe00           # the route probes take, and its MTU
//	ss -uampn 'sport = :9186'              # the responder's socket
//	ping -M do -s $((SIZE-28)) -m 0xe00 PEER  # one DF probe of SIZE bytes by hand
//
// Config.Logger (debug level) logs one line per search; Responder.Stats
// counts answers, refusals and drops.
package pathprobe
