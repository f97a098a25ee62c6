//go:build linux

package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/marksplit/marksplit/internal/pathmtu"
)

// verify with a peer whose route carries its inner MTU: from the flags
// (--path-mtu) when no agent answers, from the running agent's health
// socket when one does (source probed, which only the agent knows); the
// verdict is judged against that inner MTU, and --json carries the same.
// Without the value verify fails: the MTU is not the tunnel's.
func TestKernelVerifyPathMTU(t *testing.T) {
	s, api := newPeerSeed(t)
	declared := "--path-mtu=10.0.0.9/32=1368" // floor16(1368 − 60) = 1296
	if stdout, stderr, code := s.commandEnv(t, api.env, append([]string{"once", declared}, peerArgs...)...); code != 0 {
		t.Fatalf("once: exit %d\n%s%s", code, stdout, stderr)
	}
	sock := filepath.Join(t.TempDir(), "run", "health.sock")
	verify := []string{"verify", "--peers=auto", "--node-name=node-self", "--metrics-addr=", "--peer=10.0.0.9", "--health-socket=" + sock}

	// No agent: the flags' value, and why.
	stdout, stderr, code := s.commandEnv(t, api.env, append(verify, declared)...)
	line := regexp.MustCompile(`(?m)^path MTU:  1368 bytes \(inner MTU 1296, reduced\), declared, age \d+s \(from the flags: the running agent did not answer: .*\)$`)
	if code != 0 || !line.MatchString(stdout) ||
		!strings.Contains(stdout, "ok: unmarked traffic to 10.0.0.9 uses table 900 at the peer's inner MTU 1296 (its path MTU, below cilium_wg0's 1355)") {
		t.Errorf("verify with --path-mtu: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = s.commandEnv(t, api.env, verify...)
	if code != 1 || !strings.Contains(stdout, "path MTU:  not known (the tunnel MTU) (from the flags: ") ||
		!strings.Contains(stdout, "FAIL: unmarked traffic has MTU 1296, not cilium_wg0's 1355") {
		t.Errorf("verify without the value: exit %d, want 1\n%s%s", code, stdout, stderr)
	}

	// An agent that probed the path.
	st := pathmtu.NewStore(nil)
	st.SetTunnelMTU(1355)
	st.SetPeers([]netip.Addr{netip.MustParseAddr("10.0.0.9")})
	st.Observe(netip.MustParseAddr("10.0.0.9"), 1368, pathmtu.SourceProbed)
	ln, err := listenHealth(sock)
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	ok := func() error { return nil }
	wg.Go(func() { serveHealth(ctx, ln, ok, ok, (&loop{pmtu: st}).pathAnswer, slog.New(slog.DiscardHandler)) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	stdout, stderr, code = s.commandEnv(t, api.env, verify...)
	line = regexp.MustCompile(`(?m)^path MTU:  1368 bytes \(inner MTU 1296, reduced\), probed, age \d+s \(the running agent's\)$`)
	if code != 0 || !line.MatchString(stdout) || !strings.Contains(stdout, "ok: unmarked traffic to 10.0.0.9 uses table 900 at the peer's inner MTU 1296") {
		t.Errorf("verify beside the agent: exit %d\n%s%s", code, stdout, stderr)
	}
	stdout, stderr, code = s.commandEnv(t, api.env, append(verify, "--json")...)
	var rep verifyReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != 0 || strings.Count(stdout, "\n") != 1 {
		t.Fatalf("verify --json: exit %d, %v\n%s%s", code, err, stdout, stderr)
	}
	pm := rep.PathMTU
	if !rep.OK || rep.Table != 900 || rep.MTU != 1296 || rep.WantMTU != 1296 || rep.TunnelMTU != 1355 || len(rep.Problems) != 0 ||
		pm == nil || pm.Path != 1368 || pm.Inner != 1296 || pm.State != "reduced" || pm.Source != "probed" || pm.From != "agent" {
		t.Errorf("verify --json: %s", stdout)
	}
}
