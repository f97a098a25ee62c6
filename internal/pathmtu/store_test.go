package pathmtu_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/marksplit/marksplit/internal/pathmtu"
	"github.com/marksplit/marksplit/mtupolicy"
)

var (
	peer4 = netip.MustParseAddr("10.0.0.9")
	peer6 = netip.MustParseAddr("2001:db8::9")
)

// clock is a test's clock: it moves only when the test says.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newStore(c *clock, d ...string) *pathmtu.Store {
	var l pathmtu.DeclaredList
	for _, s := range d {
		if err := l.Set(s); err != nil {
			panic(err)
		}
	}
	s := pathmtu.NewStore(l)
	s.Now = c.now
	s.RaiseAfter = 5 * time.Minute
	s.SetTunnelMTU(1420)
	return s
}

// The figures: floor16(P − 60) on IPv4, floor16(P − 80) on IPv6.
func TestInnerMTU(t *testing.T) {
	for _, tt := range []struct {
		peer       netip.Addr
		path, want int
	}{
		{peer4, 1368, 1296},
		{peer6, 1368, 1280},
		{peer4, 1296, 1232},
		{peer6, 1296, 1216},
		{peer4, 1500, 1440},
		{peer6, 1500, 1408},
		{peer4, 1415, 1344}, // 1355 rounds down
		{peer4, 60, 0},
	} {
		if got := pathmtu.InnerMTU(tt.peer, tt.path); got != tt.want {
			t.Errorf("InnerMTU(%v, %d) = %d, want %d", tt.peer, tt.path, got, tt.want)
		}
	}
}

// A lower value at once; a higher one only after two measurements agree
// at least RaiseAfter apart; the same value again changes nothing (no
// churn); a path raised and lowered again.
func TestStoreRaiseOnlyAfterAgreement(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	s := newStore(c)
	s.SetPeers([]netip.Addr{peer4})
	type step struct {
		after  time.Duration
		path   int
		src    pathmtu.Source
		change string // Direction, "" for none
		want   int    // the value's Path after the step
	}
	steps := []step{
		{0, 1368, pathmtu.SourceProbed, "lower", 1368},               // the first value: at once
		{time.Minute, 1368, pathmtu.SourceProbed, "", 1368},          // the same: nothing
		{time.Minute, 1500, pathmtu.SourceProbed, "", 1368},          // higher, once: waits
		{time.Minute, 1500, pathmtu.SourceProbed, "", 1368},          // agrees, too soon
		{4 * time.Minute, 1500, pathmtu.SourceProbed, "raise", 1480}, // 5 min after the first: raised, capped at the tunnel's 1420+60
		{time.Minute, 1296, pathmtu.SourceLearned, "lower", 1296},    // lower: at once
		{time.Minute, 1400, pathmtu.SourceProbed, "", 1296},
		{10 * time.Minute, 1450, pathmtu.SourceProbed, "", 1296}, // disagrees: starts again
		{time.Minute, 1450, pathmtu.SourceProbed, "", 1296},
		{4 * time.Minute, 1450, pathmtu.SourceProbed, "raise", 1450},
	}
	changes := 0
	for i, st := range steps {
		c.advance(st.after)
		ch, ok := s.Observe(peer4, st.path, st.src)
		got := ""
		if ok {
			got = ch.Direction()
			changes++
		}
		if got != st.change {
			t.Errorf("step %d: Observe(%d, %v) changed %q, want %q", i, st.path, st.src, got, st.change)
		}
		if v := s.Get(peer4); v.Path != st.want {
			t.Errorf("step %d: path %d, want %d", i, v.Path, st.want)
		}
	}
	if changes != 4 {
		t.Errorf("%d changes, want 4", changes)
	}
	v := s.Get(peer4)
	c.advance(90 * time.Second)
	if v.Source != pathmtu.SourceProbed || v.Age(c.now()) != 90*time.Second {
		t.Errorf("value %+v: source %v age %v; want probed, 1m30s", v, v.Source, v.Age(c.now()))
	}
}

// Declared values: the longest prefix wins; nothing measured replaces
// them; they are not probed.
func TestStoreDeclared(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	s := newStore(c, "10.0.0.0/8=1500", "10.0.0.0/24=1368", "2001:db8::/32=1296")
	other := netip.MustParseAddr("10.1.0.1")
	cs := s.SetPeers([]netip.Addr{peer4, peer6, other, netip.MustParseAddr("192.0.2.1")})
	if len(cs) != 3 {
		t.Errorf("SetPeers: %d changes, want 3 (the declared peers)", len(cs))
	}
	for _, tt := range []struct {
		a    netip.Addr
		path int
	}{{peer4, 1368}, {other, 1500}, {peer6, 1296}} {
		if v := s.Get(tt.a); v.Path != tt.path || v.Source != pathmtu.SourceDeclared || !s.Declared(tt.a) {
			t.Errorf("%v: %+v, declared %v; want %d declared", tt.a, v, s.Declared(tt.a), tt.path)
		}
	}
	if _, ok := s.Observe(peer4, 1200, pathmtu.SourceLearned); ok {
		t.Error("a learned value replaced a declared one")
	}
	if s.Declared(netip.MustParseAddr("192.0.2.1")) {
		t.Error("192.0.2.1 declared")
	}
}

// Peers by state and the smallest inner MTU; IPv6 at 1296 is below the
// minimum, and mtupolicy's input holds no value above the tunnel's.
func TestStoreCounts(t *testing.T) {
	c := &clock{t: time.Unix(1_000_000, 0)}
	s := newStore(c)
	full, unknown := netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.8")
	s.SetPeers([]netip.Addr{peer4, peer6, full, unknown})
	s.Observe(peer4, 1368, pathmtu.SourceProbed)
	s.Observe(peer6, 1296, pathmtu.SourceLearned)
	s.Observe(full, 9000, pathmtu.SourceProbed)
	byState, smallest := s.Counts()
	want := map[pathmtu.State]int{pathmtu.StateReduced: 1, pathmtu.StateBelowMinimum: 1, pathmtu.StateFull: 1, pathmtu.StateUnknown: 1}
	if diff := cmp.Diff(want, byState); diff != "" || smallest != 1296 {
		t.Errorf("Counts: smallest %d (want 1296), by state (-want +got):\n%s", smallest, diff)
	}
	wantInner := mtupolicy.InnerMTUs{peer4: 1296, peer6: 1216, full: 1420}
	if diff := cmp.Diff(wantInner, s.Inner()); diff != "" {
		t.Errorf("Inner (-want +got):\n%s", diff)
	}
	// A peer that leaves is forgotten.
	cs := s.SetPeers([]netip.Addr{peer4})
	if len(cs) != 2 || s.Get(peer6).Source != pathmtu.SourceNone {
		t.Errorf("SetPeers: changes %+v; peer6 %+v", cs, s.Get(peer6))
	}
}

func TestParseDeclared(t *testing.T) {
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{"10.0.0.0/16=1368", true},
		{"2001:db8::/32=1296", true},
		{"10.0.0.5/16=1368", false},
		{"10.0.0.0/16", false},
		{"10.0.0.0/16=big", false},
		{"10.0.0.0/16=40", false},
		{"::ffff:10.0.0.0/112=1368", false},
	} {
		d, err := pathmtu.ParseDeclared(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseDeclared(%q) = %v, %v; ok want %v", tt.in, d, err, tt.ok)
		}
		if err == nil && d.String() != tt.in {
			t.Errorf("ParseDeclared(%q).String() = %q", tt.in, d)
		}
	}
	var l pathmtu.DeclaredList
	if err := l.Set("10.0.0.0/16=1368"); err != nil {
		t.Fatal(err)
	}
	if err := l.Set("10.0.0.0/16=1400"); err == nil {
		t.Error("a prefix declared twice was taken")
	}
}

// Judge says what any value would make of a peer's route at the current
// tunnel MTU, whether or not it is the peer's.
func TestStoreJudge(t *testing.T) {
	s := pathmtu.NewStore(nil)
	s.SetTunnelMTU(1355)
	for _, tt := range []struct {
		peer  netip.Addr
		v     pathmtu.Value
		inner int
		state pathmtu.State
	}{
		{peer4, pathmtu.Value{}, 0, pathmtu.StateUnknown},
		{peer4, pathmtu.Value{Path: 1415, Source: pathmtu.SourceProbed}, 1355, pathmtu.StateFull},
		{peer4, pathmtu.Value{Path: 1368, Source: pathmtu.SourceLearned}, 1296, pathmtu.StateReduced},
		{peer6, pathmtu.Value{Path: 1296, Source: pathmtu.SourceLearned}, 1216, pathmtu.StateBelowMinimum},
	} {
		if p := s.Judge(tt.peer, tt.v); p.Inner != tt.inner || p.State != tt.state {
			t.Errorf("Judge(%v, %d %v) = inner %d %v, want %d %v", tt.peer, tt.v.Path, tt.v.Source, p.Inner, p.State, tt.inner, tt.state)
		}
	}
}
