package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// probeResult is one run of the agent package's
// BenchmarkKernelPathProbe5000: the agent over 5,000 peers with
// --path-mtu-probe (Probe) or without it (the reference).
type probeResult struct {
	Probe    bool
	PeakRSS  float64 // MiB, the agent's VmHWM
	CPU      float64 // percent of one core over the window
	ProbePPS float64 // probes per second the peers' responder received
	Counted  float64 // marksplit_path_mtu_probes_total's rate
	Found    int     // searches that found a path MTU
}

// parseProbeBench reads BenchmarkKernelPathProbe5000's result lines:
//
//	BenchmarkKernelPathProbe5000/probe=true-2  1  19.99 counted-pps  5.010 cpu-%  43.00 found  37.72 peak-rss-MiB  19.99 probe-pps
//
// into one probeResult per run, the reference (probe=false) first.
func parseProbeBench(out string) ([]probeResult, error) {
	var res []probeResult
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "BenchmarkKernelPathProbe5000/probe=") {
			continue
		}
		r := probeResult{Probe: strings.HasPrefix(strings.TrimPrefix(f[0], "BenchmarkKernelPathProbe5000/probe="), "true")}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("BenchmarkKernelPathProbe5000: %q: %v", line, err)
			}
			switch f[i+1] {
			case "peak-rss-MiB":
				r.PeakRSS = v
			case "cpu-%":
				r.CPU = v
			case "probe-pps":
				r.ProbePPS = v
			case "counted-pps":
				r.Counted = v
			case "found":
				r.Found = int(v)
			}
		}
		res = append(res, r)
	}
	if len(res) != 2 || res[0].Probe || !res[1].Probe {
		return nil, fmt.Errorf("BenchmarkKernelPathProbe5000: want the reference's result, then probing's:\n%s", out)
	}
	return res, nil
}

// probeDesignRate is the node-wide probe rate the agent holds
// (internal/pathprobe's DefaultRate): the probe rate's reference.
const probeDesignRate = 20

// probeTable writes the cost of probing 5,000 peers: the agent with
// probing against the same agent without it, measured in the same run.
func (rep *report) probeTable(b *strings.Builder) {
	if len(rep.Probe) != 2 {
		return
	}
	ref, p := rep.Probe[0], rep.Probe[1]
	b.WriteString("## Path-MTU probing, 5,000 peers\n\n")
	b.WriteString("The built agent with `--peers=auto` over 5,000 CiliumNodes that all encrypt (the agent tests' stand-in API server), " +
		"every peer behind the gateway and answered by one responder there (AnyIP), once without `--path-mtu-probe` (the reference) " +
		"and once with it, each in a fresh seed namespace, measured over the same window after the first pass converged " +
		"(`go test -run '^$' -bench KernelPathProbe5000 -benchtime 1x ./agent`). Peak RSS is the agent's own VmHWM; CPU is the " +
		"run time of all its threads over the window, in percent of one core; probes are those the responder received. " +
		"The DaemonSet's memory limit is 128 MiB; the node-wide probe rate is designed to hold 20 packets/s.\n\n")
	b.WriteString("| agent | peak RSS | × reference | CPU | × reference | probes/s on the wire | × 20/s | probes/s counted | searches found |\n" +
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.Probe {
		name := "reference (no probing)"
		if r.Probe {
			name = "--path-mtu-probe"
		}
		fmt.Fprintf(b, "| %s | %.1f MiB | %.2f× | %.2f%% | %.2f× | %.1f | %.2f× | %.1f | %d |\n", name, r.PeakRSS, r.PeakRSS/max(ref.PeakRSS, 1e-9),
			r.CPU, r.CPU/max(ref.CPU, 1e-9), r.ProbePPS, r.ProbePPS/probeDesignRate, r.Counted, r.Found)
	}
	fmt.Fprintf(b, "\nProbing adds %.1f MiB of peak RSS and %.2f%% of a core at %.1f probes/s.\n\n", p.PeakRSS-ref.PeakRSS, p.CPU-ref.CPU, p.ProbePPS)
}

// writeProbe writes the probing row alone (-rows=probe).
func (rep *report) writeProbe(w io.Writer) error {
	var b strings.Builder
	b.WriteString("<!-- The path-MTU probing row alone: `cd bench && go run . -rows=probe`. make bench-compare writes every row to BENCHMARKS.md. -->\n\n")
	rep.probeTable(&b)
	_, err := io.WriteString(w, b.String())
	return err
}
