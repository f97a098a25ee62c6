//go:build linux

package main

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/internal/wgpeers"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// defaultResync is the period of the safety resync.
const defaultResync = 5 * time.Minute

// loop is the agent's side of the one reconcile loop: the encryption mode
// the policy reads, the policy, and the hooks that print and count what
// the reconcile.Reconciler does. The Reconciler is the loop itself.
type loop struct {
	r    *reconcile.Reconciler
	cfg  mtupolicy.Config
	mode atomic.Int32 // mtupolicy.Mode
	// peers is the peer set with --peers=auto; nil until the first list
	// of the CiliumNodes (peers_linux.go).
	peers atomic.Pointer[peerSet]
	// mesh is the --wireguard-link device; nil until its first read
	// (mesh_linux.go).
	mesh atomic.Pointer[wgpeers.Device]
	// uninstall is the uninstall switch's switchState (uninstall_linux.go).
	uninstall atomic.Int32
	// nodeEncryption is what cilium-config says of node encryption with
	// --encryption=auto; nil when it is not followed (nodeencryption_linux.go).
	nodeEncryption atomic.Pointer[nodeEncFacts]
	// peerIndex keeps the peer policy's index of the main table between
	// passes; only the Reconciler's goroutine uses it.
	peerIndex mtupolicy.PeerCache
	// pmtu keeps each peer's path MTU (pathmtu_linux.go): never nil;
	// runAgent gives it the declared values.
	pmtu *pathmtu.Store
	// probe searches the peers' path MTUs; nil without --path-mtu-probe.
	probe *prober
	met   *metrics
	// ev records Events on the Node (events_linux.go); nil for none. Set
	// before the loop and the sources run.
	ev *nodeEvents
	// emit receives each change's line: the log in run, stdout in once.
	emit func(line string)
	// repairs sums up the repairs of a fight before they reach emit.
	repairs *repairLog
	// onPass, when set, is told of every pass (for tests).
	onPass func(reconcile.Pass)
	log    *slog.Logger
}

// newLoop returns the loop for cfg. cleanup's policy is not the loop's:
// program.Program's cleanup wants the owned scope alone, whatever the mode.
func newLoop(w *netwatch.Watcher, ap *netwatch.Applier, cfg mtupolicy.Config, log *slog.Logger, emit func(string), met *metrics) *loop {
	l := &loop{cfg: cfg, met: met, emit: emit, repairs: newRepairLog(emit), log: log, pmtu: pathmtu.NewStore(nil)}
	l.r = &reconcile.Reconciler{
		Watcher:  w,
		Applier:  ap,
		Policy:   l.policy,
		Resync:   defaultResync,
		Logger:   log,
		OnChange: l.change,
		OnPass:   l.pass,
		OnFight:  l.fight,
		// A repaired route another program re-asserts is given up, once.
		OnStepBack: l.stepBack,
	}
	return l
}

func (l *loop) Mode() mtupolicy.Mode { return mtupolicy.Mode(l.mode.Load()) }

// setMode records a new encryption mode and, when it changed, asks for a
// pass.
func (l *loop) setMode(m mtupolicy.Mode) {
	prev := mtupolicy.Mode(l.mode.Swap(int32(m)))
	if prev == m {
		return
	}
	l.met.setMode(m)
	l.ev.setMode(prev, m)
	if m == mtupolicy.ModeOff {
		l.emit("node encryption: no")
	}
	l.r.Trigger()
}

// policy is what run, once and plan want. It runs inside the watcher's
// Read.
func (l *loop) policy(v netwatch.View) (d reconcile.Desired, ok bool) {
	mode, known := l.effectiveMode()
	if !known {
		return reconcile.Desired{}, false
	}
	switch {
	case l.cfg.Mesh:
		d, ok = l.meshPolicy(v, mode)
	case l.cfg.Peers:
		d, ok = l.peerPolicy(v, mode)
	default:
		d, ok = mtupolicy.Desired(v, l.cfg, mode)
	}
	l.ev.policy(v, mode, ok)
	return d, ok
}

func (l *loop) fight(f reconcile.Fight) {
	l.met.fight(f)
	l.repairs.fight(f.Over)
	l.ev.fight(f)
}

// stepBack is told of a repaired route the Reconciler gives up (its log
// has the line): the metric and one Event.
func (l *loop) stepBack(f reconcile.Fight) {
	l.met.stepBack()
	l.ev.stepBack(f)
}

func (l *loop) change(op netwatch.Op, line string) {
	l.met.change(op)
	l.repairs.change(opKindLabel(op), line)
}

func (l *loop) pass(p reconcile.Pass) {
	l.met.pass(p, l.r.Converged())
	l.repairs.pass()
	mode, _ := l.effectiveMode()
	l.ev.pass(p, l.r.Converged(), mode, time.Now())
	if l.onPass != nil {
		l.onPass(p)
	}
}
