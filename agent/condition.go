package main

import (
	"fmt"

	"github.com/marksplit/marksplit/internal/nodecondition"
	"github.com/marksplit/marksplit/mtupolicy"
)

// The reasons of the Node condition (--node-condition): True when the split
// is in place or not needed, False when it may be missing.
const (
	condSplitInPlace    = "SplitInPlace"        // True: the rule and the table are as the policy wants
	condNothingToSplit  = "NothingToSplit"      // True: the node encrypts, but no peer or route to split
	condNotEncrypting   = "NotEncrypting"       // True: the node does not encrypt; nothing is split
	condUninstall       = "UninstallSwitch"     // True: the uninstall switch is present; the split is off on purpose
	condTunnelMissing   = "TunnelLinkMissing"   // False: the node encrypts but the tunnel link does not exist
	condPassFailing     = "PassFailing"         // False: the kernel refused a change; retried
	condPeersIncomplete = "PeersIncomplete"     // False: some peers are left out of the peer set
	condPathBelowMin    = "PathMTUBelowMinimum" // False: a peer's path is below its family's minimum MTU
	// With --encryption=auto, from cilium-config's encrypt-node
	// (nodeencryption_linux.go): True, the agent stands down; False, not
	// known.
	condNodeEncOff        = "NodeEncryptionOff"        // encrypt-node is false
	condNodeEncNotSet     = "NodeEncryptionNotSet"     // cilium-config has no encrypt-node
	condCiliumConfigGone  = "CiliumConfigMissing"      // cilium-config does not exist
	condNodeEncInvalid    = "NodeEncryptionInvalid"    // encrypt-node is not a boolean
	condNodeEncUnreadable = "NodeEncryptionUnreadable" // False: cilium-config could not be read yet (403, unreachable)
)

// nodeEncReasons are the condition's reasons of a stand-down.
var nodeEncReasons = map[nodeEncState]string{
	nodeEncOff:         condNodeEncOff,
	nodeEncKeyMissing:  condNodeEncNotSet,
	nodeEncNoConfigMap: condCiliumConfigGone,
	nodeEncInvalid:     condNodeEncInvalid,
}

// passFacts is what a pass tells the Node condition.
type passFacts struct {
	planned, converged bool
	err                error
	mode               mtupolicy.Mode // the mode the policy planned with
	switchWhat         string         // the uninstall switch, when present
	tunnel             bool           // the tunnel link exists
	rule               bool           // the kernel has a rule at the priority
	incomplete         string         // why the peer set is incomplete
	pathBelow          string         // which peers' paths are below the minimum MTU
	nodeEnc            nodeEncFacts   // cilium-config's encrypt-node, with --encryption=auto
	cfg                mtupolicy.Config
}

// conditionState is the Node condition after a pass, and whether the pass
// says anything: a pass that planned nothing (not synced, mode or peers not
// known yet) or that waits for a rate-limited repair leaves the condition
// as it was, so that a restarted agent does not flap it while the split
// stays in place.
func conditionState(f passFacts) (nodecondition.State, bool) {
	switch {
	case !f.planned && f.nodeEnc.state == nodeEncUnreadable && f.switchWhat == "":
		return nodecondition.State{Reason: condNodeEncUnreadable, Message: f.nodeEnc.why}, true
	case !f.planned:
		return nodecondition.State{}, false
	case f.err != nil:
		return nodecondition.State{Reason: condPassFailing,
			Message: "the last reconcile pass failed (the split may be incomplete; see the agent's log): " + f.err.Error()}, true
	case !f.converged:
		return nodecondition.State{}, false
	case f.switchWhat != "":
		return nodecondition.State{Status: true, Reason: condUninstall,
			Message: "uninstall switch " + f.switchWhat + " present: the split is removed on purpose"}, true
	case f.nodeEnc.state.standsDown():
		return nodecondition.State{Status: true, Reason: nodeEncReasons[f.nodeEnc.state],
			Message: f.nodeEnc.why + ": the agent stands down: no split, no repair, the main table left alone"}, true
	case f.mode == mtupolicy.ModeOff:
		return nodecondition.State{Status: true, Reason: condNotEncrypting,
			Message: "the node does not encrypt: nothing to split"}, true
	case !f.tunnel:
		return nodecondition.State{Reason: condTunnelMissing,
			Message: fmt.Sprintf("the node encrypts but tunnel link %s does not exist: nothing is split", f.cfg.TunnelLink)}, true
	case f.incomplete != "":
		return nodecondition.State{Reason: condPeersIncomplete, Message: f.incomplete}, true
	case f.pathBelow != "":
		return nodecondition.State{Reason: condPathBelowMin, Message: f.pathBelow}, true
	case !f.rule:
		return nodecondition.State{Status: true, Reason: condNothingToSplit,
			Message: "the node encrypts, and there is nothing to split yet (no encrypting peer)"}, true
	}
	return nodecondition.State{Status: true, Reason: condSplitInPlace,
		Message: fmt.Sprintf("rule %d (not fwmark %v/%v lookup %d) and table %d are in place: host traffic to the peers takes %s's MTU",
			f.cfg.Priority, f.cfg.Mark, f.cfg.Mask, f.cfg.Table, f.cfg.Table, f.cfg.TunnelLink)}, true
}

// checkNodeCondition is the flag's check: a condition type the API takes,
// and not one the kubelet or a node controller writes.
func checkNodeCondition(o options) error {
	if o.nodeCondition == "" {
		return nil
	}
	if err := nodecondition.ValidType(o.nodeCondition); err != nil {
		return usageErrorf("--node-condition: %v (or empty for none)", err)
	}
	if err := nodecondition.KubeletOwned(o.nodeCondition); err != nil {
		return usageErrorf("--node-condition: %v", err)
	}
	return nil
}
