//go:build linux

package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// setEncryptNode gives the stand-in's cilium-config encrypt-node v ("" for no key).
func setEncryptNode(srv *apitest.Server, v string) {
	data := apitest.CiliumConfigData()
	delete(data, "encrypt-node")
	if v != "" {
		data["encrypt-node"] = v
	}
	srv.SetConfigMap("kube-system", "cilium-config", data)
}

// wantCondition checks the Node condition the last pass p gives.
func wantCondition(t *testing.T, h *harness, p reconcile.Pass, status bool, reason string) {
	t.Helper()
	s, ok := conditionState(h.l.passFacts(p, ""))
	if !ok || s.Status != status || s.Reason != reason {
		t.Errorf("condition %+v (says something: %v), want status %v reason %s", s, ok, status, reason)
	}
}

// The agent on a stand-in cluster with WireGuard (every CiliumNode's key is 255) but
// node encryption off: it installs nothing, repairs nothing and says why; encrypt-node
// turned on installs the split, turned off removes it and leaves the main table alone.
func TestNodeEncryptionOffOnOff(t *testing.T) {
	srv, h, srcs := peerSourceHarness(t,
		apitest.Node{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255},
		apitest.Node{Name: "peer-1", InternalIPs: []string{"10.0.0.9"}, Key: 255},
	)
	setEncryptNode(srv, "false")
	if srcs.nodeEnc == nil {
		t.Fatal("no follower of cilium-config with --encryption=auto")
	}
	h.met.addPeers(h.l, srcs.peers)
	h.met.addNodeEncryption(h.l, srcs.nodeEnc)
	h.start()
	ctx, cancel := context.WithCancel(context.Background())
	var g group
	<-srcs.start(ctx, &g, h.l)
	t.Cleanup(func() { cancel(); g.wg.Wait() })

	p := h.waitPass("that stands down", converged)
	if got := h.takeLines(); len(got) != 0 {
		t.Errorf("standing down changed %q, want nothing (the lowered main route is not repaired either)", got)
	}
	wantCondition(t, h, p, true, condNodeEncOff)
	for _, m := range []struct {
		name, label string
		want        float64
	}{
		{"marksplit_node_encryption", "off", 1}, {"marksplit_node_encryption", "on", 0},
		{"marksplit_peer_nodes_encrypting", "", 0}, {"marksplit_peer_addresses", "", 0},
	} {
		if got := metricValue(t, h.met, m.name, m.label); got != m.want {
			t.Errorf("%s{%q} = %v, want %v", m.name, m.label, got, m.want)
		}
	}
	if !strings.Contains(unquote(h.log()), `encrypt-node is "false" in ConfigMap kube-system/cilium-config: node encryption is off; standing down`) {
		t.Errorf("no line says why it stands down:\n%s", h.log())
	}

	setEncryptNode(srv, "true")
	h.waitPass("that splits", applied(3))
	p = h.waitPass("after the split", converged)
	want := []string{
		"table 900: 10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
		"rule 900: not fwmark 0xe00/0xf00 lookup 900",
		"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines after encrypt-node true (-want +got):\n%s", diff)
	}
	wantCondition(t, h, p, true, condSplitInPlace)
	if got := metricValue(t, h.met, "marksplit_peer_nodes_encrypting", ""); got != 1 {
		t.Errorf("marksplit_peer_nodes_encrypting = %v with node encryption on, want 1", got)
	}
	if !strings.Contains(h.log(), "resuming") {
		t.Errorf("no line says it resumes:\n%s", h.log())
	}

	setEncryptNode(srv, "false")
	h.waitPass("that removes the split", applied(2))
	p = h.waitPass("after the removal", converged)
	lines := h.takeLines()
	if len(lines) != 2 || !strings.Contains(strings.Join(lines, "\n"), "rule 900") {
		t.Errorf("lines after encrypt-node false: %q, want the rule and the table route removed", lines)
	}
	for _, l := range lines {
		if strings.Contains(l, "dhcp route") {
			t.Errorf("the main table was touched: %q", l)
		}
	}
	wantCondition(t, h, p, true, condNodeEncOff)
	if h.rules900() != 0 {
		t.Errorf("%d rules at 900 after the stand-down, want 0", h.rules900())
	}
}

// Hostile and odd answers: each is a reason on the condition and a line in the log,
// none a crash; a ConfigMap that cannot be read at first edits nothing.
func TestNodeEncryptionHostile(t *testing.T) {
	srv, h, srcs := peerSourceHarness(t,
		apitest.Node{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255},
		apitest.Node{Name: "peer-1", InternalIPs: []string{"10.0.0.9"}, Key: 255},
	)
	forbidden := `configmaps "cilium-config" is forbidden: User "system:serviceaccount:kube-system:marksplit" cannot list resource "configmaps" in API group "" in the namespace "kube-system"`
	srv.Inject(apitest.KindHandled, apitest.Fault{Code: 403, Message: forbidden}, apitest.Fault{Code: 403, Message: forbidden})
	h.start()
	ctx, cancel := context.WithCancel(context.Background())
	var g group
	known := srcs.start(ctx, &g, h.l)
	t.Cleanup(func() { cancel(); g.wg.Wait() })

	eventually(t, time.Minute, "unreadable", func() error {
		if s := h.l.nodeEnc().state; s != nodeEncUnreadable && s != nodeEncOn {
			return fmt.Errorf("state %v", s)
		}
		return nil
	})
	if !strings.Contains(h.log(), "is forbidden") {
		t.Errorf("no line quotes the 403:\n%s", h.log())
	}
	if h.l.nodeEnc().state == nodeEncUnreadable {
		s, ok := conditionState(h.l.passFacts(reconcile.Pass{}, ""))
		if !ok || s.Status || s.Reason != condNodeEncUnreadable {
			t.Errorf("condition %+v, want False %s", s, condNodeEncUnreadable)
		}
		if m, ok := h.l.effectiveMode(); ok {
			t.Errorf("mode %v planned before cilium-config was read", m)
		}
	}
	<-known
	h.waitPass("that splits", applied(3))
	h.waitPass("after the split", converged)
	h.takeLines()

	for _, c := range []struct {
		name, reason, log string
		edit              func()
	}{
		{"not a boolean", condNodeEncInvalid, `encrypt-node is "sometimes" in ConfigMap kube-system/cilium-config, not a boolean`, func() { setEncryptNode(srv, "sometimes") }},
		{"back on", condSplitInPlace, "resuming", func() { setEncryptNode(srv, "TRUE") }},
		{"no key", condNodeEncNotSet, "has no encrypt-node", func() { setEncryptNode(srv, "") }},
		{"back on", condSplitInPlace, "resuming", func() { setEncryptNode(srv, "1") }},
		{"deleted", condCiliumConfigGone, "kube-system/cilium-config does not exist", func() { srv.DeleteConfigMap("kube-system", "cilium-config") }},
	} {
		before := len(h.log())
		c.edit()
		h.waitPass(c.name, applied(2))
		wantCondition(t, h, h.waitPass(c.name+", converged", converged), true, c.reason)
		if !strings.Contains(unquote(h.log()[before:]), c.log) {
			t.Errorf("%s: no line says %q:\n%s", c.name, c.log, h.log()[before:])
		}
		h.takeLines()
	}
	if m := h.l.Mode(); m != mtupolicy.ModeOn {
		t.Errorf("the CiliumNode's mode %v, want on throughout", m)
	}
}

// unquote undoes slog's quoting of '"', for matching.
func unquote(s string) string { return strings.ReplaceAll(s, `\"`, `"`) }
