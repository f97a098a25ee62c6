package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		in   []int64
		want float64
	}{
		{nil, 0},
		{[]int64{7}, 7},
		{[]int64{3, 1, 2}, 2},
		{[]int64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(tt.in); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{fmtInt(1000000), "1,000,000"},
		{fmtInt(999), "999"},
		{fmtDur(float64(1500 * time.Microsecond)), "1.5 ms"},
		{fmtDur(float64(15 * time.Second)), "15.0 s"},
		{fmtDur(float64(250 * time.Microsecond)), "250 µs"},
		{ratio(3, 2), "1.50×"},
		{ratio(-1, 2), "—"},
		{fmtMiB(-1), "—"},
		{fmtRate(250000), "250 k/s"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

// A report rendered from made-up figures has every section; the kernel
// test checks the real one in detail.
func TestWriteFakeReport(t *testing.T) {
	sync := func(c string, wall int64) syncResult {
		return syncResult{Contender: c, Routes: 10, WallNS: wall, HWMKiB: 1024, HeapKiB: 512, RetainKiB: 256}
	}
	rep := &report{
		Args:    []string{"-quick"},
		Started: time.Unix(0, 0),
		Took:    time.Minute,
		Sync: []syncGroup{{N: 10, Total: 12, Runs: 1, LoadTime: time.Millisecond, Rows: []syncRow{
			{Contender: "raw", Runs: []syncResult{sync("raw", 1e6)}},
			{Contender: "netwatch", Runs: []syncResult{sync("netwatch", 2e6)}},
		}}},
		Churn: &churnData{N: 10, Writers: 2, PerWriter: 5, Batch: 2, Runs: 1, RmemDefault: 212992, Scenarios: []churnScenario{
			{Name: "ingest", RcvBuf: 1 << 20, Rows: []churnRow{{Contender: "netwatch",
				Runs:    []churnResult{{Events: 20, Expected: 20, FirstNS: 0, LastNS: 1e6}},
				Writers: []writerStats{{Ops: 20, StartNS: 0, EndNS: 1e6}}}}},
			{Name: "overflow", RcvBuf: 106496, Rows: []churnRow{{Contender: "vishvananda-subscribe",
				Runs:    []churnResult{{Events: 3, Expected: 20, ENOBUFS: 1, Died: true, DiedAfter: 3, Diverged: 3, Errors: []string{"Receive failed: no buffer space available"}}},
				Writers: []writerStats{{Ops: 20, StartNS: 0, EndNS: 1e6}}}}},
		}},
		Repair: []repairResult{
			{Name: "marksplit agent", Latencies: []time.Duration{time.Millisecond}},
			{Name: "shell loop polling every 30s", Interval: 30 * time.Second, Latencies: []time.Duration{15 * time.Second}},
		},
	}
	var b strings.Builder
	if err := rep.write(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{"## Initial sync", "| raw dump, no decoding (floor) | 1.0 ms |", "netwatch 2.0 ms (2.00× the raw dump floor", "the subscription closed its channel in 1/1 runs",
		"off by 3 routes", "| shell loop polling every 30s | 1 | 15.0 s |", "sleep 30; done"} {
		if !strings.Contains(md, want) {
			t.Errorf("no %q in\n%s", want, md)
		}
	}
}

// floorRatio pairs each run with the floor's of the same round: a slow
// minute for both moves neither their ratio nor the median, where a ratio
// of medians would mix rounds.
func TestFloorRatio(t *testing.T) {
	runs := func(c string, walls ...int64) syncRow {
		r := syncRow{Contender: c}
		for _, w := range walls {
			r.Runs = append(r.Runs, syncResult{Contender: c, WallNS: w})
		}
		return r
	}
	g := syncGroup{Rows: []syncRow{runs("raw", 100, 300, 200, 100), runs("netwatch", 110, 330, 400, 110), runs("ip", 500, 900)}}
	for _, tc := range []struct {
		name string
		want float64
	}{{"netwatch", 1.1}, {"ip", 4}, {"rtnetlink", -1}} {
		if got := g.floorRatio(tc.name); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("floorRatio(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := (syncGroup{Rows: []syncRow{runs("netwatch", 1)}}).floorRatio("netwatch"); got != -1 {
		t.Errorf("floorRatio without a floor = %v, want -1", got)
	}
}

func TestParsePeersBench(t *testing.T) {
	out := `goos: linux
BenchmarkKernelPeersFirstPass/nodes=10000/agent=new-2         	       1	         1.016 pass-s	        56.08 peak-rss-MiB
--- BENCH: BenchmarkKernelPeersFirstPass/nodes=10000/agent=new-2
    passes_bench_test.go:43: new: 10000 CiliumNodes, first pass 1.016s, peak RSS 56.1 MiB
BenchmarkKernelPeersFirstPass/nodes=10000/agent=base-2        	       1	         2.275 pass-s	       136.0 peak-rss-MiB
ok  	github.com/marksplit/marksplit/agent	12.180s
`
	got, err := parsePeersBench(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []passResult{
		{Case: "peers-10000", Agent: "new", PeakRSS: 57425, Took: 1016 * time.Millisecond},
		{Case: "peers-10000", Agent: "base", PeakRSS: 139264, Took: 2275 * time.Millisecond},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d results, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("result %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := parsePeersBench("BenchmarkKernelPeersFirstPass/nodes=1/agent=new-2 1 x pass-s 1 peak-rss-MiB\n"); err == nil {
		t.Error("a malformed line parsed without error")
	}
}
