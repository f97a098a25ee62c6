package main

import (
	"strings"
	"testing"
)

// The row reads the benchmark's lines and writes the ratios against the
// reference of the same run.
func TestProbeRow(t *testing.T) {
	out := `goos: linux
BenchmarkKernelPathProbe5000/probe=false-2  1  0 counted-pps  0.2000 cpu-%  0 found  40.00 peak-rss-MiB  0 probe-pps
BenchmarkKernelPathProbe5000/probe=true-2   1  19.99 counted-pps  1.000 cpu-%  43.00 found  44.00 peak-rss-MiB  20.00 probe-pps
PASS`
	res, err := parseProbeBench(out)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	(&report{Probe: res}).probeTable(&b)
	for _, want := range []string{
		"| reference (no probing) | 40.0 MiB | 1.00× | 0.20% | 1.00× | 0.0 | 0.00× | 0.0 | 0 |",
		"| --path-mtu-probe | 44.0 MiB | 1.10× | 1.00% | 5.00× | 20.0 | 1.00× | 20.0 | 43 |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no row %q in:\n%s", want, b.String())
		}
	}
	if _, err := parseProbeBench("BenchmarkKernelPathProbe5000/probe=true-2 1 1 cpu-%"); err == nil {
		t.Error("one result parsed: want an error")
	}
}
