package nodecondition

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// NC8 of issue 38, in the red team's shape: a CiliumNode whose key flips 20
// times a second for a minute flips the state as often (each Set is a pass
// that says something). The Writer, woken by every Set, writes at most once
// per MinInterval: 1 + 60 s / 10 s = 7 writes, the last one the latest
// state, and one log line.
func TestWriterFlipsBounded(t *testing.T) {
	c, ch := server(t, nil)
	log := make(lines, 10000)
	clk := newClock()
	w := newWriter(t, Config{Client: c, NodeName: "node-1", Logger: slog.New(log), Clock: clk})
	ctx := context.Background()
	states := []State{{true, "SplitInPlace", "in place"}, {true, "NothingToSplit", "no peer"}}
	const flips = 20 * 60
	for i := range flips {
		w.Set(states[i%2])
		w.writeDue(ctx)
		clk.Advance(time.Second / 20)
	}
	w.writeDue(ctx) // the timer's wake-up at the end of the minute
	writes := pending(ch)
	const most = 1 + int(time.Minute/DefaultMinInterval)
	t.Logf("%d flips in a minute: %d writes (at most %d)", flips, len(writes), most)
	if len(writes) > most || len(writes) < most-1 {
		t.Errorf("%d writes, want at most %d (and not fewer than %d: the latest state is written each interval)", len(writes), most, most-1)
	}
	clk.Advance(DefaultMinInterval)
	w.writeDue(ctx)
	last := append(writes, pending(ch)...)
	if got, want := last[len(last)-1].cond.Reason, states[(flips-1)%2].Reason; got != want {
		t.Errorf("the last write says %s, want the latest state %s", got, want)
	}
	var warned []string
	for _, m := range drain(log) {
		if m != "node condition written" {
			warned = append(warned, m)
		}
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "changes faster than it may be written") {
		t.Errorf("log %q, want one line about the changes", warned)
	}
	if st := w.Stats(); st.Changes != flips || st.Written != uint64(len(last)) {
		t.Errorf("stats %+v, want %d changes and %d written", st, flips, len(last))
	}
}

// NC11 of issue 38: an unchanged state is written again every Heartbeat
// (lastHeartbeatTime moves, lastTransitionTime does not) while Set confirms
// it; an agent whose passes stop (stuck) writes nothing, so its
// lastHeartbeatTime goes stale.
func TestWriterHeartbeat(t *testing.T) {
	c, ch := server(t, nil)
	clk := newClock()
	w := newWriter(t, Config{Client: c, NodeName: "node-1", Clock: clk})
	ctx := context.Background()
	s := State{true, "SplitInPlace", "in place"}
	w.Set(s)
	w.writeDue(ctx)
	first := next(t, ch)
	// Passes confirm the state every minute: one write per heartbeat.
	for range 10 {
		clk.Advance(time.Minute)
		w.Set(s)
		w.writeDue(ctx)
	}
	beats := pending(ch)
	if len(beats) != 2 {
		t.Fatalf("%d writes in 10 minutes of an unchanged state, want 2 (one per %v)", len(beats), DefaultHeartbeat)
	}
	for _, b := range beats {
		if b.cond.LastTransitionTime != first.cond.LastTransitionTime || b.cond.LastHeartbeatTime == first.cond.LastHeartbeatTime {
			t.Errorf("heartbeat %+v: want a new lastHeartbeatTime and the first lastTransitionTime", b.cond)
		}
	}
	// Stuck: no pass confirms the state any more; nothing is written.
	for range 30 {
		clk.Advance(time.Minute)
		if wait := w.writeDue(ctx); wait >= 0 && wait < time.Minute {
			t.Fatalf("stuck: writeDue asks to be woken in %v", wait)
		}
	}
	if got := pending(ch); len(got) != 0 {
		t.Errorf("%d writes of a state no pass confirmed", len(got))
	}
	if st := w.Stats(); st.Heartbeats != 2 || st.Written != 1 {
		t.Errorf("stats %+v, want 1 written and 2 heartbeats", st)
	}
}

// NC3 of issue 38: writes answered 500 are retried with back-off (10 s,
// 20 s, … up to 5 min), warned about at the first and then at most once
// per 10 minutes, and counted.
func TestWriterFailuresBounded(t *testing.T) {
	c, ch := server(t, func(int) int { return 500 })
	log := make(lines, 1000)
	clk := newClock()
	w := newWriter(t, Config{Client: c, NodeName: "node-1", Logger: slog.New(log), Clock: clk})
	ctx := context.Background()
	w.Set(State{true, "SplitInPlace", "in place"})
	start := clk.Now()
	var inMinute int
	for clk.Now().Sub(start) < 20*time.Minute {
		w.writeDue(ctx)
		if clk.Now().Sub(start) < time.Minute {
			inMinute += len(pending(ch))
		}
		clk.Advance(time.Second)
	}
	total := inMinute + len(pending(ch))
	// Attempts at 0, 10, 30, 70, 150, 310, 610, 910, 1210 s: 3 in the
	// first minute, 8 in 20 minutes.
	if inMinute != 3 || total != 8 {
		t.Errorf("attempts: %d in the first minute, %d in 20 minutes; want 3 and 8", inMinute, total)
	}
	warns := drain(log)
	if len(warns) != 2 || !strings.Contains(warns[0], "cannot set it on node node-1 (1 failed writes in a row") || !strings.Contains(warns[1], "500") {
		t.Errorf("log %q, want 2 warnings (the first failure, then 10 minutes later)", warns)
	}
	if st := w.Stats(); st.Failed != uint64(total) {
		t.Errorf("stats %+v, want %d failed", st, total)
	}
}

// NC9 of issue 38: the kubelet's and the node controllers' condition
// types are refused.
func TestKubeletOwned(t *testing.T) {
	for _, bad := range []string{"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable", "ready", "OutOfDisk",
		"node.kubernetes.io/Split", "kubernetes.io/Split", "example.k8s.io/Split"} {
		if err := KubeletOwned(bad); err == nil {
			t.Errorf("KubeletOwned(%q) = nil", bad)
		}
		if _, err := New(Config{Type: bad, NodeName: "n", Client: nil}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("New with type %q: %v", bad, err)
		}
	}
	for _, ok := range []string{"MarkSplitReady", "example.com/Ready", "NetworkReady"} {
		if err := KubeletOwned(ok); err != nil {
			t.Errorf("KubeletOwned(%q) = %v", ok, err)
		}
	}
}
