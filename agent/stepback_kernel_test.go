//go:build linux

package main

import (
	"bufio"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A fake route reconciler, as Cilium's is becoming: one long-lived `ip -batch` process
// that re-asserts the private network's route at the tunnel MTU every 500 ms for a
// minute. The agent repairs the route, sees it undone again and again, and steps back
// once: one warning naming the route, the program and the count, and at most one
// change of the route by the agent after it. The split itself stays. Counts only: the
// minute is the writer's, never a bound on the agent.
func TestKernelStepsBackFromReconciler(t *testing.T) {
	s := newSeed(t, true)
	a := s.start(t, append(seedArgs, "--metrics-addr=")...)
	eventually(t, 5*time.Second, "split", func() error { return s.splitAt(t, 1355) })

	cmd := exec.Command("nsenter", "--net="+s.ns.Path(), "ip", "-force", "-batch", "-")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	w := bufio.NewWriter(in)
	tick := time.NewTicker(500 * time.Millisecond)
	const asserts = 120 // a minute
	for range asserts {
		fmt.Fprintln(w, "route replace 10.0.0.0/16 via 10.0.0.1 dev enp7s0 proto dhcp src 10.0.0.5 mtu 1355")
		if err := w.Flush(); err != nil {
			t.Fatalf("the reconciler: %v", err)
		}
		<-tick.C
	}
	tick.Stop()
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("the reconciler's ip -batch: %v", err)
	}
	if code, _ := a.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("agent: exit %d", code)
	}

	msgs := a.messages(t)
	const repairLine = "dhcp route 10.0.0.0/16 mtu 1450 (was 1355)"
	steps, at, repairs, after := 0, -1, 0, 0
	for i, m := range msgs {
		switch {
		case strings.HasPrefix(m, "fight: dhcp route 10.0.0.0/16") && strings.Contains(m, "stepping back"):
			steps++
			at = i
			if !strings.Contains(m, fmt.Sprintf("by ip[%d]", pid)) || !strings.Contains(m, "undone 3 times") {
				t.Errorf("step-back line %q: want the program ip[%d] and the count", m, pid)
			}
		case strings.HasPrefix(m, "fight: ") && strings.Contains(m, "10.0.0.0/16"):
			t.Errorf("a fight over the re-asserted route: %q", m)
		case m == repairLine:
			repairs++
			if at >= 0 {
				after++
			}
		}
	}
	if steps != 1 {
		t.Fatalf("%d step-back lines, want 1; log:\n%s", steps, strings.Join(msgs, "\n"))
	}
	if after > 1 {
		t.Errorf("%d repairs after stepping back, want at most 1", after)
	}
	if repairs >= asserts/2 {
		t.Errorf("%d repairs in all against %d re-asserts: the agent fought", repairs, asserts)
	}
	t.Logf("%d re-asserts; the agent repaired %d times, stepped back once, then repaired %d times", asserts, repairs, after)
	if table, mtu := s.path(t, true); table != "main" || mtu != 1355 {
		t.Errorf("marked path after the agent stepped back: table %s mtu %d, want the reconciler's main route at 1355", table, mtu)
	}
	if table, mtu := s.path(t, false); table != "900" || mtu != 1355 {
		t.Errorf("unmarked path after the agent stepped back: table %s mtu %d, want the split's table 900 at 1355", table, mtu)
	}
}
