//go:build linux

package program

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/marksplit/marksplit/netwatch"
	"github.com/marksplit/marksplit/netwatch/netwatchtest"
	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// newNetNS is netwatchtest.NewNetNS under this project's policy for
// real-kernel tests: they skip where they cannot run, and fail instead with
// MARKSPLIT_KERNEL_TESTS=1, which its CI sets. It returns the namespace
// opened as a *netwatch.NetNS too.
func newNetNS(t *testing.T) (*netwatchtest.NetNS, *netwatch.NetNS) {
	t.Helper()
	if os.Getenv("MARKSPLIT_KERNEL_TESTS") == "1" {
		netwatchtest.RequireKernel(t)
	}
	ns := netwatchtest.NewNetNS(t)
	h, err := netwatch.OpenNetNS(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return ns, h
}

// oldAgent is the lock as the agent of the release before takes it, by
// its naming and protocol alone: it binds
// "@marksplit/agent/table=T/priority=P/NONCE", answers "marksplit lock
// since=N", and looks for holders among the sockets under "@marksplit/"
// only, keeping the lock unless one answered with an earlier time. It
// runs in the calling thread's network namespace.
type oldAgent struct {
	ln    *net.UnixListener
	since int64
}

func claimOld(t, p uint32) (*oldAgent, error) {
	var nonce [8]byte
	rand.Read(nonce[:])
	name := fmt.Sprintf("@marksplit/agent/table=%d/priority=%d/%s", t, p, hex.EncodeToString(nonce[:]))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, err
	}
	a := &oldAgent{ln: ln, since: monotonicNow()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "marksplit lock since=%d\n", a.since)
			c.Close()
		}
	}()
	socks, err := listLockSockets()
	if err != nil {
		ln.Close()
		return nil, err
	}
	for _, s := range socks {
		rest, ok := strings.CutPrefix(s.name, "@marksplit/agent/table=")
		if !ok || s.name == name {
			continue
		}
		ts, rest, _ := strings.Cut(rest, "/priority=")
		ps, _, _ := strings.Cut(rest, "/")
		if ts != strconv.FormatUint(uint64(t), 10) && ps != strconv.FormatUint(uint64(p), 10) {
			continue
		}
		c, err := net.Dial("unix", s.name)
		if err != nil {
			continue
		}
		c.SetReadDeadline(time.Now().Add(time.Minute))
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		since, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "marksplit lock since=")), 10, 64)
		if !strings.HasPrefix(line, "marksplit lock since=") || err != nil || since < a.since {
			ln.Close()
			return nil, fmt.Errorf("held by %s (%q)", s.name, line)
		}
	}
	return a, nil
}

// TestKernelLockRename: across the lock's rename, an old agent and a new
// program never both own a table, in either order of a rolling upgrade: a
// new claim sees an old agent's socket, and an old agent (which looks only
// under "@marksplit/") sees a new claim's.
func TestKernelLockRename(t *testing.T) {
	t.Run("old holds, new claims", func(t *testing.T) {
		ns, h := newNetNS(t)
		var old *oldAgent
		if err := ns.Do(func() (err error) { old, err = claimOld(900, 900); return err }); err != nil {
			t.Fatal(err)
		}
		defer old.ln.Close()
		for _, c := range []struct {
			table reconcile.OwnTable
			prio  reconcile.OwnPriority
			want  string
		}{
			{900, 900, "table 900 and priority 900 in this network namespace are kept by another marksplit"},
			{900, 901, "table 900 in this network namespace is kept (with priority 900) by another marksplit"},
			{901, 900, "priority 900 in this network namespace is kept (with table 900) by another marksplit"},
		} {
			l, err := Claim(h, "marksplit", c.table, c.prio)
			var held *HeldError
			if err == nil {
				l.Release()
			}
			if !errors.As(err, &held) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Claim(%d, %d) beside an old agent: %v; want a HeldError saying %q", c.table, c.prio, err, c.want)
			}
		}
		if l, err := Claim(h, "marksplit", 902, 902); err != nil {
			t.Errorf("Claim(902, 902) beside an old agent of 900: %v", err)
		} else {
			l.Release()
		}
	})
	t.Run("new holds, old claims", func(t *testing.T) {
		ns, h := newNetNS(t)
		l, err := Claim(h, "uplinkpin", 920, 920)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range [][2]uint32{{920, 920}, {920, 921}, {921, 920}} {
			err := ns.Do(func() error {
				old, err := claimOld(c[0], c[1])
				if err == nil {
					old.ln.Close()
				}
				return err
			})
			if err == nil || !strings.Contains(err.Error(), "held by @marksplit/agent/table=920/priority=920/") {
				t.Errorf("old agent's claim of %v beside a new holder: %v; want it held by the new holder's old name", c, err)
			}
		}
		l.Release()
		if err := ns.Do(func() error {
			old, err := claimOld(920, 920)
			if err == nil {
				old.ln.Close()
			}
			return err
		}); err != nil {
			t.Errorf("old agent's claim after the new holder released: %v", err)
		}
	})
	t.Run("namespaces apart", func(t *testing.T) {
		_, h1 := newNetNS(t)
		_, h2 := newNetNS(t)
		l1, err := Claim(h1, "p", 930, 930)
		if err != nil {
			t.Fatal(err)
		}
		defer l1.Release()
		l2, err := Claim(h2, "p", 930, 930)
		if err != nil {
			t.Fatalf("claim in another namespace: %v", err)
		}
		l2.Release()
	})
}

// TestKernelTwoPrograms: two programs built on Program that own one table,
// or one priority, in a namespace cannot both run; the second exits 1 with
// one line naming the first, and runs once the first has stopped. cleanup
// beside the first removes nothing: a note and exit 0 while the first owns
// nothing, a refusal once it owns a rule (which the first would put back).
func TestKernelTwoPrograms(t *testing.T) {
	ns, _ := newNetNS(t)
	build := func() (func(netwatch.View) (reconcile.Desired, bool), error) {
		return func(netwatch.View) (reconcile.Desired, bool) {
			return reconcile.Desired{Own: reconcile.Own(940, 940)}, true
		}, nil
	}
	var wantRule atomic.Bool
	rule := netwatch.Rule{Family: netwatch.IPv4, Priority: 940, Action: netwatch.ActionToTable, Table: 940}
	buildFirst := func() (func(netwatch.View) (reconcile.Desired, bool), error) {
		return func(netwatch.View) (reconcile.Desired, bool) {
			d := reconcile.Desired{Own: reconcile.Own(940, 940)}
			if wantRule.Load() {
				d.Rules = []netwatch.Rule{rule}
			}
			return d, true
		}, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := &Program{Name: "pin", Table: 940, Priority: 940, Reconciler: &reconcile.Reconciler{}}
	var logs netwatchtest.SyncBuffer
	done := make(chan int, 1)
	go func() { done <- first.Run(ctx, []string{"--netns", ns.Path()}, &logs, &logs, buildFirst) }()
	netwatchtest.WaitLog(t, &logs, "pin: started", 1)
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"pin", []string{"--table=940", "--priority=941"}, 1, "pin: table 940 in this network namespace is kept (with priority 940) by another pin (pid "},
		{"bypass", []string{"--table=941", "--priority=940"}, 1, "bypass: priority 940 in this network namespace is kept (with table 940) by pin (pid "},
		{"pin", []string{"once"}, 1, "pin: table 940 and priority 940 in this network namespace are kept by another pin"},
		{"pin", []string{"cleanup"}, 0, "; it has nothing left that cleanup would remove"},
	} {
		second := &Program{Name: c.name, Table: 940, Priority: 940}
		var out strings.Builder
		rc := second.Run(context.Background(), append(c.args, "--netns", ns.Path()), &out, &out, build)
		if rc != c.code || !strings.Contains(out.String(), c.want) || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("%s %v beside a running pin: exit %d, %q; want %d and one line containing %q", c.name, c.args, rc, out.String(), c.code, c.want)
		}
	}
	wantRule.Store(true)
	first.Reconciler.Trigger()
	netwatchtest.WaitLog(t, &logs, "lookup 940", 1)
	var out strings.Builder
	rc := (&Program{Name: "pin", Table: 940, Priority: 940}).Run(context.Background(), []string{"cleanup", "--netns", ns.Path()}, &out, &out, build)
	if want := "it would put back at once the route or rule cleanup would remove, so nothing was removed: stop it first"; rc != 1 || !strings.Contains(out.String(), want) || strings.Count(out.String(), "\n") != 1 {
		t.Errorf("cleanup beside a pin that owns a rule: exit %d, %q; want 1 and one line containing %q", rc, out.String(), want)
	}
	cancel()
	if rc := <-done; rc != 0 {
		t.Fatalf("first: exit %d\n%s", rc, &logs)
	}
	if !strings.Contains(logs.String(), "pin: stopped; routes and rules stay in place") {
		t.Errorf("first's log lacks its stop:\n%s", &logs)
	}
	out.Reset()
	second := &Program{Name: "pin", Table: 940, Priority: 941}
	if rc := second.Run(context.Background(), []string{"once", "--netns", ns.Path()}, &out, &out, build); rc != 0 {
		t.Errorf("once after the first stopped: exit %d, %q", rc, out.String())
	}
}
