//go:build linux

package main

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
)

// onFake runs uplinkpin's own command line, as main runs it, on the fake
// kernel k, and returns its exit code, its standard output and its log.
func onFake(ctx context.Context, k *netwatchtest.Kernel, args ...string) (int, string, string) {
	var c Config
	p, build := command(&c)
	p.NetNS = k.NetNS()
	var stdout, stderr netwatchtest.SyncBuffer
	code := p.Run(ctx, args, &stdout, &stderr, build)
	return code, stdout.String(), stderr.String()
}

// TestFakeSubcommands runs main's command line with each subcommand on the
// fake kernel, without a network namespace: plan changes nothing, once
// installs the pin, run keeps it when the gateway changes, and cleanup
// removes it.
func TestFakeSubcommands(t *testing.T) {
	k := netwatchtest.New()
	defer k.Close()
	eth1 := k.AddLink("eth1", "veth", 1500, true)
	if err := k.AddAddr(eth1, netip.MustParsePrefix("192.0.2.2/24")); err != nil {
		t.Fatal(err)
	}
	if err := k.AddRoute(netwatch.Route{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("192.0.2.1"), Index: eth1, Metric: 200}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--uplink", "eth1", "--mark", "0x100/0xff00"}
	const pinned = "-4 route default via 192.0.2.1 dev eth1 table 920 proto 242\n" +
		"-4 rule 920:\tfrom all fwmark 0x100/0xff00 lookup 920 proto 242"
	ctx := context.Background()

	code, out, logs := onFake(ctx, k, append([]string{"plan"}, args...)...)
	if code != 0 || !strings.Contains(out, "route-replace") || !strings.Contains(out, "rule-add") {
		t.Fatalf("plan: exit %d, output %q; want 0 and a route and a rule to add\nlog:\n%s", code, out, logs)
	}
	if got := ownedOn(t, k); got != "" {
		t.Fatalf("plan changed the kernel: %q", got)
	}

	code, out, logs = onFake(ctx, k, append([]string{"once"}, args...)...)
	if code != 0 || strings.Count(out, "\n") != 2 {
		t.Fatalf("once: exit %d, output %q; want 0 and two changes\nlog:\n%s", code, out, logs)
	}
	if got := ownedOn(t, k); got != pinned {
		t.Fatalf("after once: kernel has %q, want %q", got, pinned)
	}

	code, out, _ = onFake(ctx, k, append([]string{"plan"}, args...)...)
	if code != 0 || out != "" {
		t.Fatalf("plan after once: exit %d, output %q; want 0 and nothing to do", code, out)
	}

	t.Run("run", func(t *testing.T) {
		// The same start as the real-kernel tests', on the fake; it
		// stops at the end of this subtest and must exit 0.
		logs := start(t, k.NetNS(), args...)
		netwatchtest.WaitLog(t, logs, "uplinkpin: started", 1)
		if err := k.ReplaceRoute(netwatch.Route{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("192.0.2.254"), Index: eth1, Metric: 200}); err != nil {
			t.Fatal(err)
		}
		netwatchtest.WaitOwned(t, k.NetNS(), logs, 920, 920, strings.Replace(pinned, "192.0.2.1", "192.0.2.254", 1))
	})

	code, out, logs = onFake(ctx, k, append([]string{"cleanup"}, args...)...)
	if code != 0 || strings.Count(out, "\n") != 2 {
		t.Fatalf("cleanup: exit %d, output %q; want 0 and two changes\nlog:\n%s", code, out, logs)
	}
	if got := ownedOn(t, k); got != "" {
		t.Fatalf("after cleanup: kernel has %q, want nothing", got)
	}
}

// ownedOn is what the fake kernel k has in table 920 and at priority 920.
func ownedOn(t *testing.T, k *netwatchtest.Kernel) string {
	t.Helper()
	s, err := netwatchtest.OwnedText(k.NetNS(), 920, 920)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
