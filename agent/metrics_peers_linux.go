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
		"Other nodes that encrypt (a non-zero .spec.encryption.key): the peers whose InternalIPs get host routes.", nil, nil)
	descPeerAddrs = prometheus.NewDesc("marksplit_peer_addresses",
		"InternalIPs of the encrypting peers: the host routes the policy wants, before the main table's paths to them are looked up.", nil, nil)
	descPeersLastRead = prometheus.NewDesc("marksplit_peers_last_good_read_timestamp_seconds",
		"When the list-watch of the CiliumNodes last read a complete list or an event (Unix time); 0 before the first.", nil, nil)
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
	for _, d := range []*prometheus.Desc{descPeerNodes, descPeersEncrypting, descPeerAddrs, descPeersLastRead} {
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
	if ps == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descPeerNodes, prometheus.GaugeValue, float64(ps.nodes))
	ch <- prometheus.MustNewConstMetric(descPeersEncrypting, prometheus.GaugeValue, float64(ps.encrypting))
	ch <- prometheus.MustNewConstMetric(descPeerAddrs, prometheus.GaugeValue, float64(len(ps.addrs)))
}
