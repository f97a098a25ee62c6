//go:build linux

// Command bench measures netwatch side by side with the libraries and tools
// people already use to read Linux routes — vishvananda/netlink,
// jsimonetti/rtnetlink and iproute2 — and the marksplit agent against the
// 30 s polling loop it replaces, in fresh network namespaces, and writes
// the figures as Markdown (BENCHMARKS.md at the repository root).
//
//	cd bench && go run . -out ../BENCHMARKS.md   # make bench-compare; ~10 minutes
//	cd bench && go run . -quick                  # 10k routes, one run, < 60 s
//
// It needs root (network namespaces), ip(8) and nsenter(1). Every
// measurement of memory runs in a fresh process: the command re-executes
// itself inside the namespace with -child.
//
// # Method
//
// One namespace holds the seed topology of the agent's tests and N IPv4
// /24 routes via the gateway, loaded with netlink batches (1024
// RTM_NEWROUTE per sendmsg, one ack per batch). N grows through the
// -routes list, so each size is loaded once and every contender reads the
// same table. Initial sync, event ingest and repair latency are described
// in the Method section of the report it writes.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func main() { os.Exit(run()) }

// childTimeout bounds one child's measurement; a hung one is killed.
const childTimeout = 10 * time.Minute

type config struct {
	routes       []int
	runs         []int
	pairs        int
	churnAt      int
	perWriter    int
	writers      int
	churnBatch   int
	churnRuns    int
	agentTrials  int
	pollTrials   int
	pollInterval time.Duration
	agent, repo  string
	out          string
	quick        bool
	loadBatch    int
	largeRcvBuf  int
	args         []string
	child        string
	contender    string
	expect       int
	events       int64
	rcvbuf       int
	skipRepair   bool
	skipPasses   bool
	passHogs     int
	baseRev      string
	only         []string
	rows         string // -rows: "all", or "probe" alone
}

func run() int {
	var cfg config
	var routes, runs string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&routes, "routes", "10000,100000,1000000", "route table sizes, ascending")
	fs.StringVar(&runs, "runs", "5,5,5", "runs per size for the initial sync; the last value repeats")
	fs.IntVar(&cfg.pairs, "sync-pairs", 10, "more initial-sync rounds per size of the raw floor and netwatch alone, for netwatch's ratio to the floor")
	fs.IntVar(&cfg.churnAt, "churn-at", 0, "table size at which event ingest is measured (default: the largest of -routes up to 100000)")
	fs.IntVar(&cfg.perWriter, "churn-routes", 25000, "routes each writer adds and then deletes")
	fs.IntVar(&cfg.writers, "writers", 2, "parallel churn writers")
	fs.IntVar(&cfg.churnBatch, "churn-batch", 256, "route messages per sendmsg for the writers")
	fs.IntVar(&cfg.churnRuns, "churn-runs", 3, "runs per consumer and scenario for event ingest")
	fs.IntVar(&cfg.agentTrials, "agent-trials", 20, "rule deletions repaired by the agent")
	fs.IntVar(&cfg.pollTrials, "poll-trials", 3, "rule deletions repaired by the polling loop")
	fs.DurationVar(&cfg.pollInterval, "poll-interval", 30*time.Second, "the polling loop's sleep")
	fs.StringVar(&cfg.agent, "agent", "", "the marksplit binary (default: go build ./agent in -repo)")
	fs.StringVar(&cfg.repo, "repo", "..", "the repository root, for building the agent")
	fs.StringVar(&cfg.out, "out", "", "write the report here (default: standard output)")
	fs.BoolVar(&cfg.quick, "quick", false, "CI size: 10k routes, one run, 5000 routes per writer, 5 agent and 2 poll trials at 2 s, no CPU hogs")
	fs.IntVar(&cfg.loadBatch, "load-batch", 1024, "route messages per sendmsg when loading")
	fs.IntVar(&cfg.largeRcvBuf, "ingest-rcvbuf", 256<<20, "receive buffer requested by every consumer in the ingest scenario")
	fs.BoolVar(&cfg.skipRepair, "skip-repair", false, "leave out the repair latency")
	fs.BoolVar(&cfg.skipPasses, "skip-passes", false, "leave out the agent's big passes")
	fs.IntVar(&cfg.passHogs, "pass-hogs", 2, "CPU hogs (spinning loops) running beside the big passes, as a busy node has")
	fs.StringVar(&cfg.baseRev, "base-rev", "a29e597", "the commit whose agent the big passes are compared with (built from a git worktree of -repo)")
	fs.StringVar(&cfg.rows, "rows", "all", "the rows to measure: all, or probe (the path-MTU probing row alone, its table written to -out)")
	var only string
	fs.StringVar(&only, "only", "", "comma-separated contenders to measure (default: all), for debugging")
	fs.StringVar(&cfg.child, "child", "", "internal: run one measurement (sync or churn) and print it as JSON")
	fs.StringVar(&cfg.contender, "contender", "", "internal: the child's contender")
	fs.IntVar(&cfg.expect, "expect", 0, "internal: route messages in an AF_UNSPEC dump")
	fs.Int64Var(&cfg.events, "events", 0, "internal: route events the churn causes")
	fs.IntVar(&cfg.rcvbuf, "rcvbuf", 0, "internal: the consumer's receive buffer (0: its default)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	switch cfg.child {
	case "sync":
		return printJSON(childSync(cfg.contender, cfg.expect))
	case "churn":
		return printJSON(childChurn(cfg.contender, cfg.rcvbuf, cfg.expect, cfg.events))
	case "links":
		return printJSON(childLinks(cfg.expect))
	case "":
	default:
		fmt.Fprintf(os.Stderr, "bench: unknown -child %q\n", cfg.child)
		return 2
	}

	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.quick {
		for name, v := range map[string]string{"routes": "10000", "runs": "1", "churn-routes": "5000", "churn-runs": "1",
			"sync-pairs": "1", "agent-trials": "5", "poll-trials": "2", "poll-interval": "2s", "pass-hogs": "0"} {
			if !set[name] {
				fs.Set(name, v)
			}
		}
	}
	var err error
	if cfg.routes, err = intList(routes); err != nil || len(cfg.routes) == 0 || !slices.IsSorted(cfg.routes) || cfg.routes[0] < 1 || cfg.routes[len(cfg.routes)-1] > 1<<20 {
		fmt.Fprintf(os.Stderr, "bench: -routes %q: want ascending sizes from 1 to %d\n", routes, 1<<20)
		return 2
	}
	if cfg.runs, err = intList(runs); err != nil || len(cfg.runs) == 0 || slices.Min(cfg.runs) < 1 {
		fmt.Fprintf(os.Stderr, "bench: -runs %q: want positive counts\n", runs)
		return 2
	}
	if cfg.pairs < 0 {
		fmt.Fprintf(os.Stderr, "bench: -sync-pairs %d: want 0 or more\n", cfg.pairs)
		return 2
	}
	if cfg.churnAt == 0 {
		cfg.churnAt = cfg.routes[0]
		for _, n := range cfg.routes {
			if n <= 100000 {
				cfg.churnAt = n
			}
		}
	}
	if !slices.Contains(cfg.routes, cfg.churnAt) {
		fmt.Fprintf(os.Stderr, "bench: -churn-at %d is not one of -routes\n", cfg.churnAt)
		return 2
	}
	if cfg.writers < 1 || cfg.perWriter < 1 || cfg.perWriter > 1<<16 || cfg.writers > 8 {
		fmt.Fprintln(os.Stderr, "bench: -writers 1..8 and -churn-routes 1..65536")
		return 2
	}
	if only != "" {
		cfg.only = strings.Split(only, ",")
	}
	cfg.args = os.Args[1:]
	if reason := kernelUnavailable(); reason != "" {
		fmt.Fprintf(os.Stderr, "bench: cannot run: %s\n", reason)
		return 1
	}
	measureRows, write := measure, (*report).write
	switch cfg.rows {
	case "all":
	case "probe":
		measureRows, write = probeOnly, (*report).writeProbe
	default:
		fmt.Fprintf(os.Stderr, "bench: -rows %q: want all or probe\n", cfg.rows)
		return 2
	}
	rep, err := measureRows(&cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	var w io.Writer = os.Stdout
	if cfg.out != "" {
		f, err := os.Create(cfg.out)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			return 1
		}
		defer f.Close()
		w = f
	}
	if err := write(rep, w); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	return 0
}

func printJSON(v any, err error) int {
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench child: %v\n", err)
		return 1
	}
	b, _ := json.Marshal(v)
	fmt.Printf("%s\n", b)
	return 0
}

func intList(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// measure runs everything and returns the report.
func measure(cfg *config) (*report, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	rep := &report{Args: cfg.args, Machine: machineInfo(), Started: time.Now(), Loads: []float64{loadAvg1()}}
	begin := time.Now()

	t, err := newTopo()
	if err != nil {
		return nil, err
	}
	defer t.Close()
	loader, err := t.node.dialNL()
	if err != nil {
		return nil, err
	}
	defer loader.Close()
	if err := loader.setRcvBuf(4 << 20); err != nil {
		return nil, err
	}
	spec := routeSpec{gw: netip.MustParseAddr("10.0.0.1"), oif: t.oif, proto: unix.RTPROT_BGP}

	loaded := 0
	for i, n := range cfg.routes {
		start := time.Now()
		if err := load(loader, loaded, n, cfg.loadBatch, spec); err != nil {
			return nil, fmt.Errorf("load %d routes: %w", n, err)
		}
		took := time.Since(start)
		logf("loaded routes %d..%d in %v (%.0f routes/s)", loaded, n, took.Round(time.Millisecond), float64(n-loaded)/took.Seconds())
		rep.Loads = append(rep.Loads, loadAvg1())
		g := syncGroup{N: n, LoadedFrom: loaded, LoadTime: took, Runs: cfg.runs[min(i, len(cfg.runs)-1)]}
		loaded = n
		if g.Total, err = loader.dump(unix.AF_UNSPEC, nil); err != nil {
			return nil, err
		}
		if err := syncSize(cfg, self, t, &g); err != nil {
			return nil, err
		}
		rep.Sync = append(rep.Sync, g)
		if cfg.wants("netwatch") {
			logf("link changes at %d routes", n)
			lr, err := linkCost(self, t, n, g.Total)
			if err != nil {
				return nil, fmt.Errorf("link changes at %d routes: %w", n, err)
			}
			rep.Links = append(rep.Links, lr)
		}
		if n == cfg.churnAt {
			rep.Loads = append(rep.Loads, loadAvg1())
			c, err := churnSection(cfg, self, t, spec, g.Total)
			if err != nil {
				return nil, err
			}
			rep.Churn = c
		}
	}
	t.Close()

	agent := cfg.agent
	if !cfg.skipRepair || !cfg.skipPasses {
		if agent == "" {
			dir, err := os.MkdirTemp("", "bench-agent-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(dir)
			agent = filepath.Join(dir, "marksplit")
			build := exec.Command("go", "build", "-o", agent, "./agent")
			build.Dir = cfg.repo
			if out, err := build.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("go build ./agent in %s: %v\n%s", cfg.repo, err, out)
			}
		}
	}
	if !cfg.skipRepair {
		rep.Loads = append(rep.Loads, loadAvg1())
		logf("repair latency: %d agent trials", cfg.agentTrials)
		a, err := repairAgent(agent, cfg.agentTrials, logf)
		if err != nil {
			return nil, err
		}
		logf("repair latency: %d poll-loop trials at %v", cfg.pollTrials, cfg.pollInterval)
		p, err := repairPoll(cfg.pollTrials, cfg.pollInterval, logf)
		if err != nil {
			return nil, err
		}
		rep.Repair = []repairResult{a, p}
	}
	if !cfg.skipPasses {
		rep.Loads = append(rep.Loads, loadAvg1())
		logf("big passes: this tree's agent against %s's", cfg.baseRev)
		stop := startHogs(cfg.passHogs)
		ps, err := passSection(cfg.repo, agent, cfg.baseRev)
		rep.PassLoad = loadAvg1()
		stop()
		if err != nil {
			return nil, err
		}
		rep.Passes, rep.BaseRev, rep.PassHogs = ps, cfg.baseRev, cfg.passHogs
	}
	rep.Loads = append(rep.Loads, loadAvg1())
	logf("path-MTU probing: 5,000 peers, with and without --path-mtu-probe")
	if rep.Probe, err = probeSection(cfg.repo); err != nil {
		return nil, err
	}
	rep.Loads = append(rep.Loads, loadAvg1())
	rep.Took = time.Since(begin)
	return rep, nil
}

func (cfg *config) wants(contender string) bool {
	return cfg.only == nil || slices.Contains(cfg.only, contender)
}

// load adds the routes [from, to) of the bulk range.
func load(s *nlSock, from, to, batch int, spec routeSpec) error {
	dsts := make([]netip.Prefix, 0, batch)
	for i := from; i < to; i += batch {
		dsts = dsts[:0]
		for j := i; j < min(i+batch, to); j++ {
			dsts = append(dsts, bulkPrefix(j))
		}
		if err := s.routeBatch(unix.RTM_NEWROUTE, dsts, spec); err != nil {
			return err
		}
	}
	return nil
}

// syncSize runs every contender g.Runs times, round-robin, and then the
// raw floor and netwatch cfg.pairs more times, each in a fresh process in
// the namespace.
func syncSize(cfg *config, self string, t *topo, g *syncGroup) error {
	byName := map[string]*syncRow{}
	for _, c := range syncContenders {
		if cfg.wants(c) {
			g.Rows = append(g.Rows, syncRow{Contender: c})
		}
	}
	for i := range g.Rows {
		byName[g.Rows[i].Contender] = &g.Rows[i]
	}
	// The round-robin, then the floor and netwatch alone: their ratio
	// is the headline, and a 2-vCPU VM's pace drifts within a minute.
	rounds := make([][]string, 0, g.Runs+cfg.pairs)
	for range g.Runs {
		var all []string
		for _, row := range g.Rows {
			all = append(all, row.Contender)
		}
		rounds = append(rounds, all)
	}
	if byName["raw"] != nil && byName["netwatch"] != nil {
		for range cfg.pairs {
			rounds = append(rounds, []string{"raw", "netwatch"})
		}
		g.Pairs = cfg.pairs
	}
	for r, round := range rounds {
		for _, c := range round {
			ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
			cmd := t.node.command(ctx, self, "-child", "sync", "-contender", c, "-expect", strconv.Itoa(g.Total))
			cmd.Stderr = os.Stderr
			out, err := cmd.Output()
			cancel()
			if err != nil {
				return fmt.Errorf("sync %s at %d routes: %w", c, g.N, err)
			}
			var res syncResult
			if err := json.Unmarshal(lastLine(out), &res); err != nil {
				return fmt.Errorf("sync %s: %w: %q", c, err, out)
			}
			if res.Routes < g.N {
				return fmt.Errorf("sync %s at %d routes saw only %d", c, g.N, res.Routes)
			}
			row := byName[c]
			row.Runs = append(row.Runs, res)
			logf("sync %-22s N=%-7d run %d: %8.1f ms, VmHWM %6.1f MiB, heap %6.1f MiB, retained %6.1f MiB, %d routes",
				c, g.N, r+1, float64(res.WallNS)/1e6, kib(res.HWMKiB), kib(res.HeapKiB), kib(res.RetainKiB), res.Routes)
		}
	}
	return nil
}

func kib(v int64) float64 { return float64(v) / 1024 }

func lastLine(b []byte) []byte {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return []byte(lines[len(lines)-1])
}

// churnSection measures event ingest in two scenarios.
func churnSection(cfg *config, self string, t *topo, spec routeSpec, total int) (*churnData, error) {
	rmemDefault := readInt("/proc/sys/net/core/rmem_default", 212992)
	rmemMax := readInt("/proc/sys/net/core/rmem_max", 212992)
	c := &churnData{N: cfg.churnAt, Writers: cfg.writers, PerWriter: cfg.perWriter, Batch: cfg.churnBatch,
		Runs: cfg.churnRuns, RmemDefault: rmemDefault, RmemMax: rmemMax}
	c.Scenarios = []churnScenario{
		{Name: "ingest", RcvBuf: cfg.largeRcvBuf},
		// setsockopt doubles the value: half of rmem_default gives every
		// consumer the kernel's default buffer.
		{Name: "overflow", RcvBuf: rmemDefault / 2},
	}
	socks := make([]*nlSock, cfg.writers)
	for i := range socks {
		s, err := t.node.dialNL()
		if err != nil {
			return nil, err
		}
		defer s.Close()
		if err := s.setRcvBuf(1 << 20); err != nil {
			return nil, err
		}
		socks[i] = s
	}
	expected := int64(2 * cfg.perWriter * cfg.writers)
	for si := range c.Scenarios {
		sc := &c.Scenarios[si]
		for _, name := range churnContenders {
			if !cfg.wants(name) {
				continue
			}
			sc.Rows = append(sc.Rows, churnRow{Contender: name})
		}
		for r := range cfg.churnRuns {
			for i := range sc.Rows {
				row := &sc.Rows[i]
				res, ws, err := churnOnce(self, t, socks, row.Contender, sc.RcvBuf, total, expected, cfg, spec)
				if err != nil {
					return nil, fmt.Errorf("churn %s %s: %w", sc.Name, row.Contender, err)
				}
				row.Runs = append(row.Runs, res)
				row.Writers = append(row.Writers, ws)
				logf("churn %-8s %-22s run %d: writers %.0f ops/s; %d/%d events, %.0f events/s, lag %v, ENOBUFS %d, resyncs %v, died %v, diverged %d",
					sc.Name, row.Contender, r+1, ws.rate(), res.Events, res.Expected, res.rate(), res.lag().Round(time.Millisecond),
					res.ENOBUFS, res.ResyncsAll, res.Died, res.Diverged)
			}
		}
	}
	return c, nil
}

func readInt(path string, def int) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return def
	}
	return n
}

// readyChild is a measuring child process: it prints "ready" once it has
// synced, and one JSON line of results after the line its parent writes
// when the measurement is over.
type readyChild struct {
	cmd   *exec.Cmd
	what  string // for errors: "the consumer", "the watcher"
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// startReady starts cmd, its stderr the bench's, and waits for its
// "ready".
func startReady(cmd *exec.Cmd, what string) (*readyChild, error) {
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &readyChild{cmd: cmd, what: what, stdin: stdin, lines: bufio.NewScanner(stdout)}
	c.lines.Buffer(make([]byte, 1<<20), 1<<20)
	if !c.lines.Scan() || c.lines.Text() != "ready" {
		c.close()
		return nil, fmt.Errorf("%s did not get ready: %q", what, c.lines.Text())
	}
	return c, nil
}

// result writes done, decodes the child's result line into v and waits
// for it to exit.
func (c *readyChild) result(done string, v any) error {
	fmt.Fprintln(c.stdin, done)
	if !c.lines.Scan() {
		c.cmd.Wait()
		return fmt.Errorf("no result from %s", c.what)
	}
	if err := json.Unmarshal(c.lines.Bytes(), v); err != nil {
		return err
	}
	return c.cmd.Wait()
}

// close ends the child if result has not.
func (c *readyChild) close() {
	c.stdin.Close()
	if c.cmd.ProcessState == nil {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	}
}

// churnOnce starts a consumer in a fresh process, waits until it has
// synced, churns, and collects its result.
func churnOnce(self string, t *topo, socks []*nlSock, contender string, rcvbuf, total int, expected int64, cfg *config, spec routeSpec) (churnResult, writerStats, error) {
	var res churnResult
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	cmd := t.node.command(ctx, self, "-child", "churn", "-contender", contender, "-rcvbuf", strconv.Itoa(rcvbuf),
		"-expect", strconv.Itoa(total), "-events", strconv.FormatInt(expected, 10))
	c, err := startReady(cmd, "the consumer")
	if err != nil {
		return res, writerStats{}, err
	}
	defer c.close()
	ws, err := churn(socks, cfg.perWriter, cfg.churnBatch, spec)
	if err != nil {
		return res, ws, err
	}
	if err := c.result(fmt.Sprintf("done %d", ws.EndNS), &res); err != nil {
		return res, ws, err
	}
	// The writers delete what they add: the table must be back where it
	// was for the next run.
	s := socks[0]
	if n, err := s.dump(unix.AF_UNSPEC, nil); err != nil || n != total {
		if err == nil {
			err = errors.New("the writers left routes behind or took some away")
		}
		return res, ws, fmt.Errorf("after churn the kernel has %d routes, want %d: %w", n, total, err)
	}
	return res, ws, nil
}
