package pathprobe

import (
	"net/netip"
	"testing"
)

// TestResponderAnswer feeds the responder's decision garbage, strangers,
// floods and good probes at one instant (no time passes, so the rate's
// burst is all it may answer).
func TestResponderAnswer(t *testing.T) {
	friend := peer4
	r := &Responder{Allow: func(a netip.Addr) bool { return a == friend }, Burst: 5}
	r.init()
	probe := make([]byte, 1400)
	message{typ: typeProbe, nonce: 42, length: 1400}.put(probe)
	var out [headerLen]byte

	if r.answer(t0, addr(99), probe[:64], 1400, &out) {
		t.Error("answered a stranger")
	}
	for _, garbage := range [][]byte{nil, []byte("MSPP"), make([]byte, 64), probe[:19]} {
		if r.answer(t0, friend, garbage, 1400, &out) {
			t.Errorf("answered garbage %q", garbage)
		}
	}
	if r.answer(t0, friend, probe[:64], 1399, &out) {
		t.Error("answered a probe whose length is not its size")
	}
	answer := make([]byte, headerLen)
	message{typ: typeAnswer, nonce: 42, length: 1400}.put(answer)
	if r.answer(t0, friend, answer, headerLen, &out) {
		t.Error("answered an answer (a loop between two responders)")
	}
	answered := 0
	for range 10000 {
		if r.answer(t0, friend, probe[:64], 1400, &out) {
			answered++
			m, ok := parse(out[:])
			if !ok || m.typ != typeAnswer || m.nonce != 42 || m.length != 1400 {
				t.Fatalf("answer %+v", m)
			}
		}
	}
	if answered != 5 {
		t.Errorf("a flood of 10,000 at one instant: %d answered, want the burst (5)", answered)
	}
	want := ResponderStats{Answered: 5, Refused: 1, Malformed: 6, Limited: 10000 - 5}
	if got := r.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
	if len(out) > minSize4-ip4Header-l4Header {
		t.Errorf("an answer (%d bytes) is larger than the smallest probe", len(out))
	}
}
