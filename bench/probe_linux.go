//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
)

// probeSection runs the agent package's BenchmarkKernelPathProbe5000 in
// repo and takes its figures: the reference (no probing) and probing,
// measured in the same run.
func probeSection(repo string) ([]probeResult, error) {
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", "^BenchmarkKernelPathProbe5000$", "-benchtime", "1x", "-timeout", "20m", "./agent")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "MARKSPLIT_KERNEL_TESTS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("BenchmarkKernelPathProbe5000: %v\n%s", err, out)
	}
	res, err := parseProbeBench(string(out))
	for _, r := range res {
		logf("path-MTU probing %v: peak RSS %.1f MiB, CPU %.2f%%, %.1f probes/s", r.Probe, r.PeakRSS, r.CPU, r.ProbePPS)
	}
	return res, err
}

// probeOnly is -rows=probe: the probing row alone, its table written to w
// (for checking the row without the rest of the run).
func probeOnly(cfg *config) (*report, error) {
	rep := &report{Args: cfg.args, Machine: machineInfo()}
	var err error
	rep.Probe, err = probeSection(cfg.repo)
	return rep, err
}
