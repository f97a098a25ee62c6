//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/marksplit/marksplit/internal/ciliumnode"
	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// peerSet is what the loop knows of the peers: an immutable summary of a
// ciliumnode.Peers snapshot.
type peerSet struct {
	nodes      int          // CiliumNodes, this node included
	encrypting int          // other nodes that encrypt
	addrs      []netip.Addr // their InternalIPs, sorted: DesiredPeers' input
	// What the set leaves out (ciliumnode's bounds): CiliumNodes skipped or cut, nodes
	// beyond ciliumnode.MaxPeerBytes, addresses beyond ciliumnode.MaxPeerAddrs.
	problems, dropped, leftOut int
	incomplete                 string // why the set is incomplete, "" when it is not
}

func newPeerSet(ps ciliumnode.Peers, self string) *peerSet {
	s := &peerSet{nodes: ps.Len(), encrypting: ps.EncryptingCount(), dropped: ps.Dropped()}
	s.addrs, s.leftOut = ps.Encrypting(self)
	if p, ok := ps.Get(self); ok && p.Encrypting {
		s.encrypting--
	}
	problems := ps.Problems()
	s.problems = len(problems)
	var why []string
	for i, p := range problems {
		if i == 3 {
			why = append(why, fmt.Sprintf("%d more", len(problems)-i))
			break
		}
		why = append(why, "CiliumNode "+p.Name+": "+p.Problem)
	}
	if s.dropped > 0 {
		why = append(why, fmt.Sprintf("%d CiliumNodes beyond %d MiB left out", s.dropped, ciliumnode.MaxPeerBytes>>20))
	}
	if s.leftOut > 0 {
		why = append(why, fmt.Sprintf("%d peer addresses beyond %d left out", s.leftOut, ciliumnode.MaxPeerAddrs))
	}
	if len(why) > 0 {
		s.incomplete = "the peer set is incomplete: " + strings.Join(why, "; ")
	}
	return s
}

// has reports whether a is an encrypting peer's address.
func (s *peerSet) has(a netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(s.addrs, a, netip.Addr.Compare)
	return ok
}

// setPeers records a new peer set and, when its addresses changed, asks
// for a pass. The first set is logged.
func (l *loop) setPeers(next *peerSet) {
	// The store learns the new peers (and their declared values) before
	// the set is published: a pass that sees a peer also sees its value.
	old := l.peers.Load()
	changed := old == nil || !slices.Equal(old.addrs, next.addrs)
	var cs []pathmtu.Change
	if changed {
		cs = l.pmtu.SetPeers(next.addrs)
	}
	prev := l.peers.Swap(next)
	if prev == nil {
		l.log.Info("CiliumNodes listed", "nodes", next.nodes, "encrypting_peers", next.encrypting, "peer_addresses", len(next.addrs))
	}
	switch {
	case next.incomplete != "" && (prev == nil || prev.incomplete != next.incomplete):
		l.log.Warn(next.incomplete + " (/readyz answers 503 until it is complete)")
	case next.incomplete == "" && prev != nil && prev.incomplete != "":
		l.log.Info("the peer set is complete again")
	}
	if changed {
		l.pathChanged(cs)
		l.r.Trigger()
	}
}

// peersKnown reports whether a list of the CiliumNodes has been read.
func (l *loop) peersKnown() bool { return l.peers.Load() != nil }

// peersIncomplete says why the peer set leaves peers out, or "" when it
// does not (or is not known yet).
func (l *loop) peersIncomplete() string {
	if ps := l.peers.Load(); ps != nil {
		return ps.incomplete
	}
	return ""
}

// peerPolicy is the policy with --peers=auto: nothing before the first
// list of the CiliumNodes, unless the mode is off, which needs no peers.
func (l *loop) peerPolicy(v netwatch.View, mode mtupolicy.Mode) (reconcile.Desired, bool) {
	ps := l.peers.Load()
	if mode == mtupolicy.ModeOff || ps == nil {
		if mode != mtupolicy.ModeOff {
			return reconcile.Desired{}, false
		}
		return l.peerIndex.DesiredPeers(v, l.cfg, mode, nil, nil)
	}
	if tun, ok := v.LinkByName(l.cfg.TunnelLink); ok {
		l.pmtu.SetTunnelMTU(int(tun.MTU))
		l.probe.sync(v, ps.addrs, int(tun.MTU))
	}
	return l.peerIndex.DesiredPeers(v, l.cfg, mode, ps.addrs, l.pmtu.Inner())
}

// inClusterConfig is the ciliumnode.Config of the pod's service account:
// the API server from $KUBERNETES_SERVICE_HOST and _PORT, the token and CA
// from $MARKSPLIT_SERVICEACCOUNT_DIR or the kubelet's mount.
func inClusterConfig(node string, log *slog.Logger) (ciliumnode.Config, error) {
	cfg, err := ciliumnode.InClusterConfig(node)
	if err != nil {
		return cfg, err
	}
	dir := os.Getenv(serviceAccountDirEnv)
	if dir == "" {
		dir = defaultServiceAccountDir
	}
	cfg.TokenFile = filepath.Join(dir, "token")
	cfg.CAFile = filepath.Join(dir, "ca.crt")
	cfg.Logger = log
	return cfg, nil
}

// peerSource list-watches every CiliumNode for the loop: the peer set, and
// with --encryption=auto the node's own mode from its entry, so that one
// watch serves both.
type peerSource struct {
	src        *ciliumnode.PeerSource
	self       string
	deriveMode bool
	log        *slog.Logger
}

func newPeerSource(o options, log *slog.Logger) (*peerSource, error) {
	cfg, err := inClusterConfig(o.nodeName, log)
	if err != nil {
		return nil, usageErrorf("--peers=auto reads every CiliumNode from inside a pod: %v (or use --prefix or --underlay-link)", err)
	}
	src, err := ciliumnode.NewPeers(cfg)
	if err != nil {
		return nil, err
	}
	return &peerSource{src: src, self: o.nodeName, deriveMode: o.usesMode() && o.encryption == encAuto, log: log}, nil
}

// run feeds l until ctx ends, calling reported after each report.
func (p *peerSource) run(ctx context.Context, l *loop, reported func()) {
	missing := false // this node's CiliumNode is not in the list; said once
	p.src.Run(ctx, func(ps ciliumnode.Peers) {
		l.setPeers(newPeerSet(ps, p.self))
		if p.deriveMode {
			self, ok := ps.Get(p.self)
			switch {
			case !ok && !missing:
				p.log.Warn("ciliumnode: CiliumNode " + p.self + " is not among the CiliumNodes: Cilium has not registered the node yet (or --node-name is wrong); the encryption mode stands as it was")
			case ok && self.Encrypting:
				l.setMode(mtupolicy.ModeOn)
			case ok:
				l.setMode(mtupolicy.ModeOff)
			}
			missing = !ok
		}
		reported()
	})
}

// sources are the agent's inputs from outside the kernel: the encryption
// mode and, with --peers=auto, the peer set. Either may be nil.
type sources struct {
	mode  *modeSource // nil when the command needs no mode, or the peer list gives it
	peers *peerSource // nil unless o.readsPeers()
	// uninstall is the uninstall switch; nil without one.
	uninstall *uninstallSwitch
	// nodeEnc follows cilium-config's encrypt-node; nil unless
	// --encryption=auto.
	nodeEnc *nodeEncryption
	// mesh reads the --wireguard-link device; nil without it.
	mesh *meshSource
	// notes are what the log says of the sources once they start (after
	// the lock: a second agent says only who holds it).
	notes []string
}

func newSources(o options, log *slog.Logger) (*sources, error) {
	s := &sources{}
	if o.readsPeers() {
		var err error
		if s.peers, err = newPeerSource(o, log); err != nil {
			return nil, err
		}
	}
	if o.usesMode() && (s.peers == nil || !s.peers.deriveMode) {
		var err error
		if s.mode, err = newModeSource(o, log); err != nil {
			return nil, err
		}
	}
	var err error
	if s.uninstall, err = newUninstallSwitch(o, log, func(n string) { s.notes = append(s.notes, n) }); err != nil {
		return nil, err
	}
	if s.nodeEnc, err = newNodeEncryption(o, log); err != nil {
		return nil, err
	}
	s.mesh = newMeshSource(o, log)
	return s, nil
}

// start runs the sources in g, feeding l, until ctx ends. The channel is
// closed once every input the command needs is known: the mode (from its
// source or the peer list) and, with peers, the first list.
func (s *sources) start(ctx context.Context, g goer, l *loop) <-chan struct{} {
	for _, n := range s.notes {
		l.log.Info(n)
	}
	known := make(chan struct{})
	var once sync.Once
	needMode := s.mode != nil || s.peers != nil && s.peers.deriveMode
	check := func() {
		switch sw := l.switchState(); {
		case sw == switchWaiting:
			return
		case sw == switchPresent: // off: neither the mode nor the peers matter
		case s.nodeEnc != nil && !l.nodeEncKnown():
			return
		case l.standingDown() != "": // off too
		case needMode && l.Mode() == mtupolicy.ModeUnknown || s.peers != nil && !l.peersKnown():
			return
		case s.mesh != nil && !l.meshKnown():
			return
		}
		once.Do(func() { close(known) })
	}
	if s.uninstall != nil {
		l.uninstall.Store(int32(switchWaiting))
		g.Go(func() { s.uninstall.run(ctx, l, check) })
	}
	if s.nodeEnc != nil {
		l.nodeEncryption.Store(&nodeEncFacts{state: nodeEncWaiting})
		g.Go(func() { s.nodeEnc.run(ctx, l, check) })
	}
	check()
	if s.mode != nil {
		g.Go(func() {
			s.mode.run(ctx, func(m mtupolicy.Mode) {
				l.setMode(m)
				check()
			})
		})
	}
	if s.peers != nil {
		g.Go(func() { s.peers.run(ctx, l, check) })
	}
	if s.mesh != nil {
		g.Go(func() { s.mesh.run(ctx, l, check) })
	}
	return known
}

// waiting says what start's channel waits for, for an error message.
func (s *sources) waiting() string {
	switch {
	case s.nodeEnc != nil:
		return "node encryption (" + s.nodeEnc.what + ") or the uninstall switch not read, or no encryption mode or list of the CiliumNodes"
	case s.uninstall != nil:
		return "the uninstall switch not read, or no encryption mode or list of the CiliumNodes"
	case s.mesh != nil:
		return "no read of the WireGuard device " + s.mesh.src.Link
	case s.peers != nil && s.peers.deriveMode:
		return "no list of the CiliumNodes with this node in it"
	case s.peers != nil && s.mode != nil:
		return "no encryption mode or no list of the CiliumNodes"
	case s.peers != nil:
		return "no list of the CiliumNodes"
	}
	return "no encryption mode (the CiliumNode was not read)"
}

// requests returns the API request counters by outcome, or nil without a
// reader of the API.
func (s *sources) requests() map[string]uint64 {
	switch {
	case s.peers != nil:
		return s.peers.src.Stats().Requests()
	case s.mode != nil && s.mode.src != nil:
		return s.mode.src.Stats().Requests()
	}
	return nil
}
