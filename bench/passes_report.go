package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// passCase is one big pass of the agent (issue 31): a namespace set up by
// setup, then `marksplit once` with args.
type passCase struct {
	Name, What string
	args       []string
	// routes /24s from 11.0.0.0/24 upwards via the gateway, each with
	// extra (say "table 900"), set up before the pass.
	routes int
	extra  string
}

// passResult is one agent's run of one passCase.
type passResult struct {
	Case, Agent string
	PeakRSS     int64 // KiB, the agent's own VmHWM (internal/peakrss)
	Took        time.Duration
	Err         string
}

var passCases = []passCase{
	{Name: "underlay-100k", What: "`--underlay-link` first install over 100,000 main routes",
		args:   []string{"--underlay-link=enp7s0", "--encryption=on"},
		routes: 100000, extra: "proto bgp"},
	{Name: "foreign-30k", What: "a pass deleting 30,000 routes another program put in table 900",
		args:   []string{"--prefix=10.0.0.0/16", "--encryption=on"},
		routes: 30000, extra: "table 900"},
}

// parsePeersBench reads BenchmarkKernelPeersFirstPass's result lines:
//
//	BenchmarkKernelPeersFirstPass/nodes=10000/agent=new-2  1  1.016 pass-s  56.08 peak-rss-MiB
//
// into one passResult per agent, "new" as "this tree" and "base" as the
// base's (named later by the caller's table).
func parsePeersBench(out string) ([]passResult, error) {
	var res []passResult
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[0], "BenchmarkKernelPeersFirstPass/") {
			continue
		}
		parts := strings.Split(f[0], "/")
		if len(parts) != 3 {
			continue
		}
		agent := strings.TrimPrefix(parts[2], "agent=")
		if i := strings.LastIndexByte(agent, '-'); i > 0 {
			agent = agent[:i]
		}
		r := passResult{Case: "peers-" + strings.TrimPrefix(parts[1], "nodes="), Agent: agent}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("BenchmarkKernelPeersFirstPass: %q: %v", line, err)
			}
			switch f[i+1] {
			case "pass-s":
				r.Took = time.Duration(v * float64(time.Second))
			case "peak-rss-MiB":
				r.PeakRSS = int64(v * 1024)
			case "converged":
				if v == 0 {
					r.Err = "did not converge"
				}
			}
		}
		res = append(res, r)
	}
	if len(res) != 2 {
		return nil, fmt.Errorf("BenchmarkKernelPeersFirstPass: %d results, want 2 (this tree's agent and the base's):\n%s", len(res), out)
	}
	return res, nil
}

// passTable writes the big passes' peak RSS and time, this tree's against
// the base's, measured in the same run.
func (rep *report) passTable(b *strings.Builder) {
	if len(rep.Passes) == 0 {
		return
	}
	b.WriteString("## Big passes\n\n")
	b.WriteString("Peak RSS (the agent's own VmHWM, read as it exits: internal/peakrss says why not ru_maxrss or a sample) and wall time of `marksplit once` over one big pass, in a fresh seed namespace, " +
		"this tree's agent and the one built from " + rep.BaseRev + " taking turns in the same run. " +
		"The DaemonSet's memory limit is 128 MiB; the target of each pass is 56 MiB, with other work on the node: " +
		fmt.Sprintf("%d CPU hogs (shells spinning in a loop) ran beside every pass here, and the 1-minute load average was %.2f at the end.\n\n", rep.PassHogs, rep.PassLoad))
	b.WriteString("| pass | agent | peak RSS | × base | time | × base | result |\n|---|---|---:|---:|---:|---:|---|\n")
	byCase := map[string]passResult{}
	for _, r := range rep.Passes {
		if r.Agent == rep.BaseRev {
			byCase[r.Case] = r
		}
	}
	for _, r := range rep.Passes {
		base := byCase[r.Case]
		res := "converged"
		if r.Err != "" {
			res = r.Err
		}
		fmt.Fprintf(b, "| %s | %s | %.1f MiB | %.2f× | %v | %.2f× | %s |\n", r.Case, r.Agent, float64(r.PeakRSS)/1024,
			float64(r.PeakRSS)/float64(max(base.PeakRSS, 1)), r.Took.Round(time.Millisecond), r.Took.Seconds()/max(base.Took.Seconds(), 1e-9), res)
	}
	b.WriteString("\n")
	b.WriteString("- **peers-N:** the first `--peers=auto` pass in a cluster of N CiliumNodes that all encrypt, served by the " +
		"agent tests' stand-in API server (`go test -run '^$' -bench KernelPeersFirstPass -benchtime 1x ./agent`, " +
		"MARKSPLIT_BENCH_BASE set to the base's agent): 15,000, or as many as internal/ciliumnode's list takes while its count bound is lower.\n")
	for _, c := range passCases {
		fmt.Fprintf(b, "- **%s:** %s.\n", c.Name, c.What)
	}
	b.WriteString("\n")
}
