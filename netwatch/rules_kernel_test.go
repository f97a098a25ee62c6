//go:build linux

package netwatch

import (
	"bufio"
	"os/exec"
	"testing"
	"time"
)

// TestKernelHotRuleDeleter: one program deletes a rule as fast as it can
// while this process adds it back whenever the cache lacks it. Since Linux
// 6.14 the kernel announces a rule after releasing the lock it changed the
// rule under, so the deletion of a rule can be announced before its
// addition; the cache must still end equal to the kernel.
func TestKernelHotRuleDeleter(t *testing.T) {
	ns := newTestNS(t)
	w := startWatcher(t, Options{NetNS: fakeNetNS(ns.dialer())})
	waitSynced(t, w, 2*time.Minute)
	ap, err := DialApplier(fakeNetNS(ns.dialer()))
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()
	rule := Rule{Family: IPv4, Priority: 900, Table: 900, Action: ActionToTable, Invert: true, Mark: 0xe00, Mask: 0xf00, Protocol: 109}
	cmd := exec.Command("ip", "-n", ns.name, "-force", "-batch", "-")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		bw := bufio.NewWriter(in)
		for {
			if _, err := bw.WriteString("rule del pref 900\n"); err != nil {
				return
			}
		}
	}()
	// 50 adds against the deleting ip, however long a busy machine takes
	// for them; two minutes is only a hang's.
	end := time.Now().Add(2 * time.Minute)
	adds := 0
	for adds < 50 && time.Now().Before(end) {
		ch := w.nextChange()
		has := false
		w.Read(func(v View) {
			for r := range v.Rules(IPv4) {
				has = has || r.Priority == 900
			}
		})
		if has {
			select {
			case <-ch:
			case <-time.After(100 * time.Millisecond): // the cache may be wrong: look again
			}
			continue
		}
		if _, err := ap.Apply([]Op{{Kind: RuleAdd, Rule: rule}}); err != nil {
			t.Fatal(err)
		}
		adds++
	}
	in.Close()
	cmd.Process.Kill()
	cmd.Wait()
	if adds < 50 {
		t.Errorf("only %d adds in 2 min: the cache stopped following the rule", adds)
	}
	waitConverged(t, w, ns, 5*time.Second, "after the fight")
}
