package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/mtupolicy"
)

// The Node condition after each kind of pass: True when the split is in
// place or not needed, False with a reason when it may be missing, and no
// write at all for a pass that could not plan or waits for a repair.
func TestConditionState(t *testing.T) {
	cfg := mtupolicy.DefaultConfig()
	cfg.Table, cfg.Priority, cfg.Mark, cfg.Mask = 900, 900, 0xe00, 0xf00
	on := passFacts{planned: true, converged: true, mode: mtupolicy.ModeOn, tunnel: true, rule: true, cfg: cfg}
	with := func(edit func(*passFacts)) passFacts { f := on; edit(&f); return f }
	for _, tt := range []struct {
		name   string
		f      passFacts
		write  bool
		status bool
		reason string
	}{
		{"split in place", on, true, true, condSplitInPlace},
		{"not planned (starting, mode or peers unknown)", with(func(f *passFacts) { f.planned, f.converged = false, false }), false, false, ""},
		{"waits for a rate-limited repair", with(func(f *passFacts) { f.converged = false }), false, false, ""},
		{"failed", with(func(f *passFacts) { f.converged, f.err = false, errors.New("operation not permitted") }), true, false, condPassFailing},
		{"opted out", with(func(f *passFacts) { f.mode, f.rule = mtupolicy.ModeOff, false }), true, true, condNotEncrypting},
		{"uninstall switch", with(func(f *passFacts) {
			f.mode, f.rule, f.switchWhat = mtupolicy.ModeOff, false, "kube-system/marksplit-uninstall"
		}), true, true, condUninstall},
		{"tunnel link missing", with(func(f *passFacts) { f.tunnel, f.rule = false, false }), true, false, condTunnelMissing},
		{"peers incomplete", with(func(f *passFacts) { f.incomplete = "the peer set is incomplete: CiliumNode n9: skipped" }), true, false, condPeersIncomplete},
		{"no peer yet", with(func(f *passFacts) { f.rule = false }), true, true, condNothingToSplit},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, write := conditionState(tt.f)
			if write != tt.write || s.Status != tt.status || s.Reason != tt.reason {
				t.Errorf("conditionState = %+v, %v; want status %v reason %q, write %v", s, write, tt.status, tt.reason, tt.write)
			}
			if write && (s.Message == "" || strings.ContainsAny(s.Message, "\n")) {
				t.Errorf("message %q: want one line", s.Message)
			}
		})
	}
}

func TestNodeConditionFlag(t *testing.T) {
	if err := checkNodeCondition(options{nodeCondition: "MarkSplitReady"}); err != nil {
		t.Errorf("MarkSplitReady: %v", err)
	}
	err := checkNodeCondition(options{nodeCondition: "Mark Split"})
	var ue *usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--node-condition") {
		t.Errorf("a bad type: %v, want a usage error naming --node-condition", err)
	}
}

// NC9 of issue 38: the kubelet's own condition types are a usage error
// (exit 2, one line naming the flag).
func TestNodeConditionFlagKubeletTypes(t *testing.T) {
	for _, typ := range []string{"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "node.kubernetes.io/Ready"} {
		err := checkNodeCondition(options{nodeCondition: typ})
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--node-condition") || strings.Contains(err.Error(), "\n") {
			t.Errorf("--node-condition=%s: %v, want a one-line usage error naming the flag", typ, err)
		}
	}
}
