//go:build linux

package main

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/mtupolicy"
	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/reconcile"
	"golang.org/x/sys/unix"
)

func peersConfig() mtupolicy.Config {
	cfg := mtupolicy.DefaultConfig()
	cfg.Peers = true
	return cfg
}

func peers(addrs ...string) *peerSet {
	s := &peerSet{nodes: len(addrs) + 1, encrypting: len(addrs)}
	for _, a := range addrs {
		s.addrs = append(s.addrs, netip.MustParseAddr(a))
	}
	return s
}

// With --peers=auto the loop edits nothing before the first list, even
// with the mode known; then each peer gets a host route, a peer that goes
// loses it, and the mode turning off empties the table.
func TestLoopPeers(t *testing.T) {
	k, _, _ := seedKernel(t)
	h := newHarnessCfg(t, k, peersConfig())
	h.start()
	h.l.setMode(mtupolicy.ModeOn)
	res := h.waitPass("with the mode known", func(p reconcile.Pass) bool { return h.w.Stats().Synced })
	if res.Planned {
		t.Fatalf("pass without a list of the peers planned: %+v", res)
	}
	for _, req := range k.Requests() {
		switch req.Type {
		case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWRULE, unix.RTM_DELRULE:
			t.Errorf("request %d sent before the first list", req.Type)
		}
	}
	if h.l.r.Converged() {
		t.Error("ready before the first list")
	}

	h.l.setPeers(peers("10.0.0.9", "10.0.0.11"))
	h.waitPass("that splits the peers", applied(4))
	want := []string{
		"table 900: 10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
		"table 900: 10.0.0.11 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
		"rule 900: not fwmark 0xe00/0xf00 lookup 900",
		"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	h.waitConverged()
	if got := metricValue(t, h.met, "marksplit_split_active", ""); got != 1 {
		t.Errorf("marksplit_split_active = %v, want 1", got)
	}

	// The same addresses again (a status update of a node) changes nothing.
	h.l.setPeers(peers("10.0.0.9", "10.0.0.11"))
	// One leaves, one joins.
	h.l.setPeers(peers("10.0.0.9", "10.0.0.12"))
	h.waitPass("that follows the peers", applied(2))
	want = []string{
		"table 900: 10.0.0.12 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
		"table 900: removed 10.0.0.11 via 10.0.0.1 dev enp7s0 proto 109 src 10.0.0.5 mtu 1355",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}

	// No peers left: the table and the rule go.
	h.l.setPeers(peers())
	h.waitPass("that removes the last peer", applied(3))
	if n := h.rules900(); n != 0 {
		t.Errorf("%d rules at 900 without peers", n)
	}
	h.l.setPeers(peers("10.0.0.9"))
	h.waitPass("that splits again", applied(2))
	h.l.setMode(mtupolicy.ModeOff)
	h.waitPass("that removes the split", applied(2))
	for _, r := range k.Snapshot().Routes {
		if r.Table == 900 {
			t.Errorf("route left in table 900: %v", r)
		}
	}
}

// The mode off needs no list of the peers: --encryption=off removes the
// split without the API.
func TestLoopPeersOffWithoutList(t *testing.T) {
	k, enp, _ := seedKernel(t)
	// Left by an agent that ran before.
	must(t, k.AddRoute(netwatch.Route{Table: 900, Dst: netip.MustParsePrefix("10.0.0.9/32"), Gateway: netip.MustParseAddr("10.0.0.1"),
		Index: enp, MTU: 1355, Protocol: 109}))
	h := newHarnessCfg(t, k, peersConfig())
	h.start()
	h.l.setMode(mtupolicy.ModeOff)
	h.waitPass("that removes the table's route", applied(1))
	h.waitConverged()
	for _, r := range k.Snapshot().Routes {
		if r.Table == 900 {
			t.Errorf("route left in table 900: %v", r)
		}
	}
}

// peerSourceHarness serves nodes from the stand-in API server, in the
// environment of a pod that reaches it, and makes the sources of `run
// --peers=auto --encryption=auto --node-name=node-self` with a loop on the
// fake kernel, logging to the harness.
func peerSourceHarness(t *testing.T, nodes ...apitest.Node) (*apitest.Server, *harness, *sources) {
	t.Helper()
	srv := apitest.New(t, apitest.Options{})
	dir := t.TempDir()
	must(t, srv.WriteServiceAccount(dir))
	host, port := srv.HostPort()
	t.Setenv("KUBERNETES_SERVICE_HOST", host)
	t.Setenv("KUBERNETES_SERVICE_PORT", port)
	t.Setenv(serviceAccountDirEnv, dir)
	srv.MustPut(t, nodes...)
	k, _, _ := seedKernel(t)
	h := newHarnessCfg(t, k, peersConfig())
	o := options{cmd: cmdRun, policy: peersConfig(), encryption: encAuto, nodeName: "node-self", ciliumNamespace: defaultCiliumNamespace, ciliumConfigMap: defaultCiliumConfigMap}
	srcs, err := newSources(o, slog.New(slog.NewTextHandler(lockedWriter{&h.mu, &h.logs}, nil)))
	must(t, err)
	return srv, h, srcs
}

// The peer source against the stand-in API server, with the node's mode
// from the same list: nothing before this node's CiliumNode is in it, then
// exactly the encrypting peers, then off when this node opts out.
func TestPeerSourceFeedsTheLoop(t *testing.T) {
	srv, h, srcs := peerSourceHarness(t,
		apitest.Node{Name: "peer-1", InternalIPs: []string{"10.0.0.9"}, Key: 255},
		apitest.Node{Name: "peer-2", InternalIPs: []string{"10.0.0.7"}}, // opted out
	)
	if srcs.mode != nil || srcs.peers == nil || !srcs.peers.deriveMode {
		t.Fatalf("sources %+v: want the peer list alone, giving the mode too", srcs)
	}
	h.met.addPeers(h.l, srcs.peers)
	h.start()
	ctx, cancel := context.WithCancel(context.Background())
	var g group
	known := srcs.start(ctx, &g, h.l)
	t.Cleanup(func() { cancel(); g.wg.Wait() })

	eventually(t, 5*time.Second, "the first list", func() error {
		if !h.l.peersKnown() {
			return errors.New("no peers")
		}
		return nil
	})
	eventually(t, 5*time.Second, "the warning", func() error {
		if !strings.Contains(h.log(), "CiliumNode node-self is not among the CiliumNodes") {
			return errors.New("not logged")
		}
		return nil
	})
	select {
	case <-known:
		t.Fatal("known without this node's mode")
	default:
	}
	if h.l.Mode() != mtupolicy.ModeUnknown || h.l.r.Converged() {
		t.Errorf("mode %v, converged %v without this node's CiliumNode", h.l.Mode(), h.l.r.Converged())
	}

	srv.MustPut(t, apitest.Node{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255})
	<-known
	h.waitPass("that splits the peer", applied(3))
	want := []string{
		"table 900: 10.0.0.9 via 10.0.0.1 dev enp7s0 src 10.0.0.5 mtu 1355",
		"rule 900: not fwmark 0xe00/0xf00 lookup 900",
		"dhcp route 10.0.0.0/16 mtu 1450 (was 1355)",
	}
	if diff := cmp.Diff(want, h.takeLines()); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
	for name, want := range map[string]float64{"marksplit_peer_nodes": 3, "marksplit_peer_nodes_encrypting": 1, "marksplit_peer_addresses": 1} {
		if got := metricValue(t, h.met, name, ""); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := srcs.requests()["ok"]; got != 1 {
		t.Errorf("requests: %d ok, want 1 (one page of a list)", got)
	}

	srv.SetKey("node-self", 0)
	h.waitPass("that removes the split", applied(2))
	if got := h.takeLines(); len(got) == 0 || got[0] != "node encryption: no" {
		t.Errorf("lines %q, want node encryption: no first", got)
	}
}

// A CiliumNode that does not decode (a key that is a string) leaves the
// others in use; the peer set says it is incomplete: a warning, the
// metrics, and /readyz's check. Fixed, it is complete again.
func TestPeerSourceIncomplete(t *testing.T) {
	badKey := func(o map[string]any) { o["spec"].(map[string]any)["encryption"] = map[string]any{"key": "abc"} }
	srv, h, srcs := peerSourceHarness(t,
		apitest.Node{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255},
		apitest.Node{Name: "peer-1", InternalIPs: []string{"10.0.0.9"}, Key: 255},
		apitest.Node{Name: "peer-bad", InternalIPs: []string{"10.0.0.7"}, Key: 255, Patch: badKey},
	)
	h.met.addPeers(h.l, srcs.peers)
	h.start()
	ctx, cancel := context.WithCancel(context.Background())
	var g group
	<-srcs.start(ctx, &g, h.l)
	t.Cleanup(func() { cancel(); g.wg.Wait() })

	h.waitPass("that splits the good peer", applied(3))
	if got := h.l.peersIncomplete(); !strings.Contains(got, "the peer set is incomplete: CiliumNode peer-bad: skipped: ") {
		t.Errorf("peersIncomplete %q, want peer-bad named", got)
	}
	if !strings.Contains(h.log(), "the peer set is incomplete: CiliumNode peer-bad") || !strings.Contains(h.log(), "/readyz answers 503") {
		t.Errorf("no warning about the incomplete peer set in:\n%s", h.log())
	}
	for name, want := range map[string]float64{"marksplit_peers_incomplete": 1, "marksplit_peer_nodes_problem": 1, "marksplit_peer_addresses": 1} {
		if got := metricValue(t, h.met, name, ""); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}

	srv.MustPut(t, apitest.Node{Name: "peer-bad", InternalIPs: []string{"10.0.0.7"}, Key: 255})
	h.waitPass("that splits the fixed peer", applied(1))
	eventually(t, 5*time.Second, "complete again", func() error {
		if got := h.l.peersIncomplete(); got != "" {
			return errors.New(got)
		}
		return nil
	})
	if got := metricValue(t, h.met, "marksplit_peers_incomplete", ""); got != 0 {
		t.Errorf("marksplit_peers_incomplete = %v, want 0", got)
	}
	if !strings.Contains(h.log(), "the peer set is complete again") {
		t.Errorf("no line saying the peer set is complete again in:\n%s", h.log())
	}
}
