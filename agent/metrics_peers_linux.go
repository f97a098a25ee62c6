//go:build linux

package main

import (
	"github.com/marksplit/marksplit/internal/ciliumnode"
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descPeerNodes = prometheus.NewDesc("marksplit_peer_nodes",
		"CiliumNodes the agent knows with --peers=auto, this node included; absent before the first list.", nil, nil)
	descPeersEncrypting = prometheus.NewDesc("marksplit_peer_nodes_encrypting",
		"Other nodes that encrypt (a non-zero .spec.encryption.key, while node encryption is on: 0 while the agent stands down for cilium-config's encrypt-node): the peers whose InternalIPs get host routes.", nil, nil)
	descPeerAddrs = prometheus.NewDesc("marksplit_peer_addresses",
		"InternalIPs of the encrypting peers: the host routes the policy wants, before the main table's paths to them are looked up (0 while the agent stands down).", nil, nil)
	descPeersLastRead = prometheus.NewDesc("marksplit_peers_last_good_read_timestamp_seconds",
		"When the list-watch of the CiliumNodes last read a complete list or an event (Unix time); 0 before the first.", nil, nil)
	descPeersIncomplete = prometheus.NewDesc("marksplit_peers_incomplete",
		"1 while the peer set leaves something out (a CiliumNode skipped or cut, or a bound hit: the log says what), as /readyz answers 503 for; else 0.", nil, nil)
	descPeerProblems = prometheus.NewDesc("marksplit_peer_nodes_problem",
		"CiliumNodes skipped (they did not decode, or are larger than 4 MiB: their last good entry stands, if any) or cut (more InternalIPs than ciliumnode.MaxNodeAddrs).", nil, nil)
	descPeerNodesLeftOut = prometheus.NewDesc("marksplit_peer_nodes_left_out",
		"CiliumNodes added beyond ciliumnode.MaxPeerBytes (16 MiB of names and addresses, some 80,000 nodes), left out until a list succeeds.", nil, nil)
	descPeerAddrsLeftOut = prometheus.NewDesc("marksplit_peer_addresses_left_out",
		"Encrypting peers' InternalIPs beyond ciliumnode.MaxPeerAddrs (60,000), left out: they get no host route.", nil, nil)
)

// peerCollector reads the loop's peer set and the list-watch's stats at
// scrape time.
type peerCollector struct {
	l   *loop
	src *ciliumnode.PeerSource
}

// addPeers registers the peer metrics when p is not nil.
func (m *metrics) addPeers(l *loop, p *peerSource) {
	if m == nil || p == nil {
		return
	}
	m.reg.MustRegister(&peerCollector{l: l, src: p.src})
}

func (c *peerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPeerNodes, descPeersEncrypting, descPeerAddrs, descPeersLastRead,
		descPeersIncomplete, descPeerProblems, descPeerNodesLeftOut, descPeerAddrsLeftOut} {
		ch <- d
	}
}

func (c *peerCollector) Collect(ch chan<- prometheus.Metric) {
	last := 0.0
	if t := c.src.Stats().LastGoodRead; !t.IsZero() {
		last = float64(t.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(descPeersLastRead, prometheus.GaugeValue, last)
	ps := c.l.peers.Load()
	// A key counts only while node encryption is on: standing down, no peer
	// encrypts, whether or not the first list has come.
	down := c.l.standingDown() != ""
	if down {
		ch <- prometheus.MustNewConstMetric(descPeersEncrypting, prometheus.GaugeValue, 0)
		ch <- prometheus.MustNewConstMetric(descPeerAddrs, prometheus.GaugeValue, 0)
	}
	if ps == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descPeerNodes, prometheus.GaugeValue, float64(ps.nodes))
	if !down {
		ch <- prometheus.MustNewConstMetric(descPeersEncrypting, prometheus.GaugeValue, float64(ps.encrypting))
		ch <- prometheus.MustNewConstMetric(descPeerAddrs, prometheus.GaugeValue, float64(len(ps.addrs)))
	}
	ch <- prometheus.MustNewConstMetric(descPeersIncomplete, prometheus.GaugeValue, bool01(ps.incomplete != ""))
	ch <- prometheus.MustNewConstMetric(descPeerProblems, prometheus.GaugeValue, float64(ps.problems))
	ch <- prometheus.MustNewConstMetric(descPeerNodesLeftOut, prometheus.GaugeValue, float64(ps.dropped))
	ch <- prometheus.MustNewConstMetric(descPeerAddrsLeftOut, prometheus.GaugeValue, float64(ps.leftOut))
}
