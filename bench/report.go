package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"text/template"
	"time"
)

// The figures are measured by the linux files; this file turns them into
// Markdown and builds anywhere, so its test needs no kernel.

// syncResult is what a child reports for one initial sync.
type syncResult struct {
	Contender  string `json:"contender"`
	Routes     int    `json:"routes"`
	WallNS     int64  `json:"wall_ns"`
	HWMKiB     int64  `json:"hwm_kib"`      // VmHWM, or ip's ru_maxrss
	HeapKiB    int64  `json:"heap_kib"`     // HeapAlloc right after the sync (netwatch: + MappedBytes); -1 for ip
	RetainKiB  int64  `json:"retained_kib"` // HeapAlloc after a GC with the result alive (netwatch: + MappedBytes)
	InterruptN int    `json:"interrupted,omitempty"`
}

// churnResult is what a child reports for one churn run.
type churnResult struct {
	Contender string `json:"contender"`
	// RcvBuf is the socket's receive buffer as the kernel reports it (the
	// doubled value), when the bench can read it; 0 otherwise.
	RcvBuf int `json:"rcvbuf"`
	// Events is the number of route events the consumer processed after
	// its initial sync; Expected is how many the writers caused.
	Events   int64 `json:"events"`
	Expected int64 `json:"expected"`
	// FirstNS and LastNS are the wall-clock times of the first and last
	// event processed; WritersEndNS is when the writers' last ack came.
	FirstNS      int64 `json:"first_ns"`
	LastNS       int64 `json:"last_ns"`
	WritersEndNS int64 `json:"writers_end_ns"`
	// ENOBUFS counts receive errors reporting an overflow; ENOBUFSIs says
	// whether errors.Is(err, unix.ENOBUFS) matched the error the consumer
	// saw (vishvananda formats it with %v).
	ENOBUFS   int64    `json:"enobufs"`
	ENOBUFSIs bool     `json:"enobufs_is"`
	Errors    []string `json:"errors,omitempty"`
	// Died is set when the subscription ended by itself (vishvananda
	// closes its channel); DiedAfter is how many events it had delivered.
	Died      bool  `json:"died"`
	DiedAfter int64 `json:"died_after"`
	// Resyncs is netwatch's Stats().Resyncs[ResyncOverflow].
	Resyncs    uint64            `json:"resyncs"`
	ResyncsAll map[string]uint64 `json:"resyncs_all,omitempty"` // by cause
	// Diverged is the size of the symmetric difference between the
	// consumer's IPv4 routes and a kernel dump after the churn; -1 for a
	// consumer that keeps no state.
	Diverged int `json:"diverged"`
}

// writerStats is one churn's writers' work.
type writerStats struct {
	Ops            int64
	StartNS, EndNS int64
}

// repairResult is one repairer's trials.
type repairResult struct {
	Name      string
	Interval  time.Duration // the poll loop's
	Latencies []time.Duration
}

// rate is the consumer's events per second, from its first event to its last.
func (r churnResult) rate() float64 {
	if r.LastNS <= r.FirstNS {
		return 0
	}
	return float64(r.Events) / (float64(r.LastNS-r.FirstNS) / 1e9)
}

// lag is how long after the writers' last ack the consumer processed its
// last event.
func (r churnResult) lag() time.Duration {
	if r.LastNS == 0 {
		return 0
	}
	return max(0, time.Duration(r.LastNS-r.WritersEndNS))
}

func (w writerStats) rate() float64 {
	if w.EndNS <= w.StartNS {
		return 0
	}
	return float64(w.Ops) / (float64(w.EndNS-w.StartNS) / 1e9)
}

// report is everything one run of the command measured.
type report struct {
	Args []string
	// Loads are the 1-minute load averages sampled before each phase and
	// at the end: other work on the machine shows there (the bench itself
	// adds about one to two).
	Loads   []float64
	Machine machine
	Started time.Time
	Took    time.Duration
	Sync    []syncGroup
	Churn   *churnData
	Links   []linkResult
	Repair  []repairResult
	// Passes are the agent's big passes, against BaseRev's agent.
	Passes []passResult
	// Probe is the path-MTU probing row: the reference, then probing.
	Probe   []probeResult
	BaseRev string
	// PassHogs is how many CPU hogs ran beside the passes, PassLoad the
	// 1-minute load average at their end.
	PassHogs int
	PassLoad float64
}

type syncGroup struct {
	N          int
	LoadedFrom int
	LoadTime   time.Duration
	Total      int // route messages in an AF_UNSPEC dump
	Runs       int // rounds of every contender
	Pairs      int // more rounds of the raw floor and netwatch alone
	Rows       []syncRow
}

type syncRow struct {
	Contender string
	Runs      []syncResult
}

type churnData struct {
	N, Writers, PerWriter, Batch, Runs int
	RmemDefault, RmemMax               int
	Scenarios                          []churnScenario
}

type churnScenario struct {
	Name   string
	RcvBuf int // requested of each consumer that can set it
	Rows   []churnRow
}

type churnRow struct {
	Contender string
	Runs      []churnResult
	Writers   []writerStats
}

type machine struct {
	Kernel, CPU, Go, IPRoute2, Tree string
	Cores                           int
	MemoryGiB                       float64
	Modules                         []string
}

// loadAvg1 is the 1-minute load average.
func loadAvg1() float64 {
	var l float64
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscanf(string(b), "%f", &l)
	}
	return l
}

func machineInfo() machine {
	m := machine{Go: runtime.Version(), Cores: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				var kb float64
				fmt.Sscanf(strings.TrimSpace(v), "%f", &kb)
				m.MemoryGiB = kb / (1 << 20)
			}
		}
	}
	if out, err := exec.Command("ip", "-V").Output(); err == nil {
		m.IPRoute2 = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "-C", "..", "describe", "--always", "--dirty").Output(); err == nil {
		m.Tree = strings.TrimSpace(string(out))
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/vishvananda/netlink", "github.com/jsimonetti/rtnetlink/v2", "github.com/mdlayher/netlink":
				m.Modules = append(m.Modules, d.Path+" "+d.Version)
			}
		}
	}
	return m
}

// median of xs (the mean of the middle two for an even count).
func median[T int64 | float64 | int](xs []T) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return float64(s[n/2])
	}
	return (float64(s[n/2-1]) + float64(s[n/2])) / 2
}

func pick[T any, V int64 | float64 | int](xs []T, f func(T) V) []V {
	out := make([]V, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

// Labels of the contenders in the tables.
var labels = map[string]string{
	"raw":                   "raw dump, no decoding (floor)",
	"netwatch":              "**netwatch** Watcher until Synced",
	"vishvananda-list":      "vishvananda `RouteListFiltered`",
	"vishvananda-subscribe": "vishvananda `RouteSubscribeWithOptions` ListExisting",
	"rtnetlink":             "jsimonetti/rtnetlink `Route.List()`",
	"ip":                    "`ip -j route show table all`",
	"ip-monitor":            "`ip monitor route`",
}

var churnLabels = map[string]string{
	"raw":                   "raw socket, counts headers (floor)",
	"netwatch":              "**netwatch** Watcher (Notify + Stats)",
	"vishvananda-subscribe": "vishvananda `RouteSubscribeWithOptions` + map",
	"rtnetlink":             "rtnetlink `RouteMessage` on `netlink.Conn` + map",
	"ip-monitor":            "`ip monitor route`",
}

func fmtDur(d float64) string { // nanoseconds
	switch {
	case d >= 10e9:
		return fmt.Sprintf("%.1f s", d/1e9)
	case d >= 1e9:
		return fmt.Sprintf("%.2f s", d/1e9)
	case d >= 1e6:
		return fmt.Sprintf("%.1f ms", d/1e6)
	default:
		return fmt.Sprintf("%.0f µs", d/1e3)
	}
}

func fmtMiB(kib float64) string {
	if kib < 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f MiB", kib/1024)
}

func ratio(a, b float64) string {
	if a < 0 || b <= 0 {
		return "—"
	}
	switch r := a / b; {
	case r >= 100:
		return fmt.Sprintf("%.0f×", r)
	case r >= 10:
		return fmt.Sprintf("%.1f×", r)
	default:
		return fmt.Sprintf("%.2f×", r)
	}
}

func fmtInt(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.2f M/s", r/1e6)
	case r >= 1e3:
		return fmt.Sprintf("%.0f k/s", r/1e3)
	default:
		return fmt.Sprintf("%.0f /s", r)
	}
}

// syncMedians are one row's medians.
type syncMedians struct {
	wall, wallMin, wallMax, hwm, heap, retained float64
	routes                                      int
}

func (r syncRow) medians() syncMedians {
	m := syncMedians{
		wall:     median(pick(r.Runs, func(x syncResult) int64 { return x.WallNS })),
		hwm:      median(pick(r.Runs, func(x syncResult) int64 { return x.HWMKiB })),
		heap:     median(pick(r.Runs, func(x syncResult) int64 { return x.HeapKiB })),
		retained: median(pick(r.Runs, func(x syncResult) int64 { return x.RetainKiB })),
	}
	walls := pick(r.Runs, func(x syncResult) int64 { return x.WallNS })
	if len(walls) > 0 {
		m.wallMin, m.wallMax = float64(slices.Min(walls)), float64(slices.Max(walls))
		m.routes = r.Runs[len(r.Runs)-1].Routes
	}
	return m
}

// floorRatio is the median, over the rounds that ran both, of the named
// contender's wall time over the raw floor's in the same round (the
// floor runs first in each), or -1 without both.
func (g syncGroup) floorRatio(name string) float64 {
	var raw, c []syncResult
	for _, r := range g.Rows {
		switch r.Contender {
		case "raw":
			raw = r.Runs
		case name:
			c = r.Runs
		}
	}
	var rs []float64
	for i := range min(len(raw), len(c)) {
		if raw[i].WallNS > 0 {
			rs = append(rs, float64(c[i].WallNS)/float64(raw[i].WallNS))
		}
	}
	if len(rs) == 0 {
		return -1
	}
	return median(rs)
}

func (g syncGroup) row(name string) (syncMedians, bool) {
	for _, r := range g.Rows {
		if r.Contender == name && len(r.Runs) > 0 {
			return r.medians(), true
		}
	}
	return syncMedians{}, false
}

// churnMedians are one consumer's medians in a scenario.
type churnMedians struct {
	events, rate, writerRate, lag, enobufs, diverged, resyncs float64
	died, equal, overflowed                                   int
	stateless                                                 bool
	errs                                                      []string
	enobufsIs                                                 bool
	diedAfter                                                 float64
}

func (r churnRow) medians() churnMedians {
	m := churnMedians{
		events:     median(pick(r.Runs, func(x churnResult) int64 { return x.Events })),
		rate:       median(pick(r.Runs, func(x churnResult) float64 { return x.rate() })),
		writerRate: median(pick(r.Writers, func(x writerStats) float64 { return x.rate() })),
		lag:        median(pick(r.Runs, func(x churnResult) int64 { return int64(x.lag()) })),
		enobufs:    median(pick(r.Runs, func(x churnResult) int64 { return x.ENOBUFS })),
		diverged:   median(pick(r.Runs, func(x churnResult) int { return x.Diverged })),
		resyncs:    median(pick(r.Runs, func(x churnResult) int64 { return int64(x.Resyncs) })),
	}
	var after []int64
	for _, x := range r.Runs {
		if x.Died {
			m.died++
			after = append(after, x.DiedAfter)
		}
		if x.Diverged == 0 {
			m.equal++
		}
		if x.Diverged < 0 {
			m.stateless = true
		}
		if x.ENOBUFS > 0 || x.Resyncs > 0 {
			m.overflowed++
		}
		m.enobufsIs = m.enobufsIs || x.ENOBUFSIs
		for _, e := range x.Errors {
			if !slices.Contains(m.errs, e) {
				m.errs = append(m.errs, e)
			}
		}
	}
	m.diedAfter = median(after)
	return m
}

// outcome says in words what a consumer did, from the figures.
func (r churnRow) outcome(expected int64) string {
	m := r.medians()
	n := len(r.Runs)
	if m.overflowed == 0 {
		if m.stateless {
			return fmt.Sprintf("no overflow; %s of %s events", fmtInt(int64(m.events)), fmtInt(expected))
		}
		return fmt.Sprintf("no overflow; equal to the kernel in %d/%d runs", m.equal, n)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "overflowed in %d/%d runs", m.overflowed, n)
	firstErr := ""
	if len(m.errs) > 0 {
		firstErr = m.errs[0]
	}
	switch r.Contender {
	case "netwatch":
		fmt.Fprintf(&b, "; resynced (`Resyncs[overflow]` median %.0f) and ended equal to the kernel in %d/%d runs", m.resyncs, m.equal, n)
	case "vishvananda-subscribe":
		if firstErr != "" {
			fmt.Fprintf(&b, "; ErrorCallback got `%s` (errors.Is ENOBUFS: %v)", firstErr, m.enobufsIs)
		}
		if m.died > 0 {
			fmt.Fprintf(&b, "; the subscription closed its channel in %d/%d runs after a median %s events and did not come back", m.died, n, fmtInt(int64(m.diedAfter)))
		}
		fmt.Fprintf(&b, "; its map ended equal to the kernel in %d/%d runs", m.equal, n)
	case "rtnetlink":
		fmt.Fprintf(&b, "; `Receive` returned `%s` (errors.Is ENOBUFS: %v) a median %.0f× and then went on delivering; nothing re-dumps, so the map ended equal to the kernel in %d/%d runs", firstErr, m.enobufsIs, m.enobufs, m.equal, n)
	case "ip-monitor":
		fmt.Fprintf(&b, "; printed `%s` a median %.0f× and went on; %s of %s events printed", firstErr, m.enobufs, fmtInt(int64(m.events)), fmtInt(expected))
	default:
		fmt.Fprintf(&b, "; recv returned ENOBUFS a median %.0f×; %s of %s events read", m.enobufs, fmtInt(int64(m.events)), fmtInt(expected))
	}
	return b.String()
}

func endState(m churnMedians, n int) string {
	if m.stateless {
		return "— (keeps no state)"
	}
	if m.equal == n {
		return "equal"
	}
	return fmt.Sprintf("off by %s routes (median); equal in %d/%d", fmtInt(int64(m.diverged)), m.equal, n)
}

func (r repairResult) stats() (med, lo, hi float64) {
	if len(r.Latencies) == 0 {
		return 0, 0, 0
	}
	xs := pick(r.Latencies, func(d time.Duration) int64 { return int64(d) })
	return median(xs), float64(slices.Min(xs)), float64(slices.Max(xs))
}

// write renders the report.
func (rep *report) write(w io.Writer) error {
	var b strings.Builder
	cmdline := "cd bench && go run ."
	for _, a := range rep.Args {
		cmdline += " " + a
	}
	data := map[string]any{"Cmd": cmdline, "Rep": rep}
	if err := headTmpl.Execute(&b, data); err != nil {
		return err
	}
	rep.headline(&b)
	rep.machine(&b)
	if err := methodTmpl.Execute(&b, rep.methodData()); err != nil {
		return err
	}
	rep.syncTables(&b)
	rep.churnTables(&b)
	rep.linkTable(&b)
	rep.repairTable(&b)
	rep.passTable(&b)
	rep.probeTable(&b)
	if err := movesTmpl.Execute(&b, data); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}

var headTmpl = template.Must(template.New("head").Parse(`# Benchmarks

<!-- Generated by ` + "`{{.Cmd}}`" + ` (make bench-compare). Do not edit by hand: rerun the command. -->

netwatch side by side with vishvananda/netlink, jsimonetti/rtnetlink and iproute2 on the same
route tables, and the marksplit agent against the 30 s polling loop it replaces. Every figure
below comes from one run of ` + "`{{.Cmd}}`" + ` on {{.Rep.Started.UTC.Format "2006-01-02 15:04 UTC"}}
(it took {{printf "%.0f" .Rep.Took.Minutes}} min); rerunning it regenerates this file.

`))

func (rep *report) headline(b *strings.Builder) {
	fmt.Fprintf(b, "## Headline\n\n")
	if len(rep.Sync) > 0 {
		g := rep.Sync[len(rep.Sync)-1]
		nw, _ := g.row("netwatch")
		raw, _ := g.row("raw")
		fmt.Fprintf(b, "- **Initial sync of %s routes:** netwatch %s (%s the raw dump floor, the median of %d rounds; the floor %s), peak RSS %s, retained memory %s.",
			fmtInt(int64(g.N)), fmtDur(nw.wall), ratio(g.floorRatio("netwatch"), 1), g.Runs+g.Pairs, fmtDur(raw.wall), fmtMiB(nw.hwm), fmtMiB(nw.retained))
		var peers []string
		for _, c := range []string{"vishvananda-list", "vishvananda-subscribe", "rtnetlink", "ip"} {
			if m, ok := g.row(c); ok {
				peers = append(peers, fmt.Sprintf("%s %s / %s RSS", strings.TrimPrefix(c, ""), fmtDur(m.wall), fmtMiB(m.hwm)))
			}
		}
		fmt.Fprintf(b, " Peers: %s.\n", strings.Join(peers, "; "))
	}
	if c := rep.Churn; c != nil {
		for _, sc := range c.Scenarios {
			for _, r := range sc.Rows {
				if r.Contender != "netwatch" {
					continue
				}
				m := r.medians()
				exp := int64(2 * c.PerWriter * c.Writers)
				if sc.Name == "ingest" {
					fmt.Fprintf(b, "- **Event ingest:** against %d writers at a median %s, netwatch applied %s of %s route events at %s, its last one %s after the writers' last ack.\n",
						c.Writers, fmtRate(m.writerRate)+" ops", fmtInt(int64(m.events)), fmtInt(exp), fmtRate(m.rate), fmtDur(m.lag))
				} else {
					fmt.Fprintf(b, "- **Overflow** (every consumer at the kernel's default buffer): netwatch %s. vishvananda's subscription: %s.\n",
						r.outcome(exp), churnOutcome(sc, "vishvananda-subscribe", exp))
				}
			}
		}
	}
	if n := len(rep.Links); n > 0 {
		first, last := rep.Links[0], rep.Links[n-1]
		per := func(l linkResult) float64 { return float64(l.CPUNS) / float64(l.Changes) }
		fmt.Fprintf(b, "- **An unrelated link change** (a pod veth up or down): netwatch %s of CPU at %s routes, %s at %s (%s), %d whole-family route re-dumps over %d changes.\n",
			fmtDur(per(first)), fmtInt(int64(first.N)), fmtDur(per(last)), fmtInt(int64(last.N)), ratio(per(last), per(first)), last.FullRedumps, last.Changes)
	}
	if len(rep.Repair) == 2 {
		am, _, ahi := rep.Repair[0].stats()
		pm, _, phi := rep.Repair[1].stats()
		fmt.Fprintf(b, "- **Repair of a deleted rule:** the agent median %s (max %s over %d trials); the %s median %s (max %s over %d trials): %s the agent's median.\n",
			fmtDur(am), fmtDur(ahi), len(rep.Repair[0].Latencies), rep.Repair[1].Name, fmtDur(pm), fmtDur(phi), len(rep.Repair[1].Latencies), ratio(pm, am))
	}
	b.WriteString("\n")
}

func churnOutcome(sc churnScenario, name string, exp int64) string {
	for _, r := range sc.Rows {
		if r.Contender == name {
			return r.outcome(exp)
		}
	}
	return "not measured"
}

func (rep *report) machine(b *strings.Builder) {
	m := rep.Machine
	fmt.Fprintf(b, "## Machine\n\n| | |\n|---|---|\n")
	fmt.Fprintf(b, "| kernel | %s |\n| CPU | %s |\n| cores | %d |\n| memory | %.1f GiB |\n| Go | %s |\n| iproute2 | %s |\n",
		m.Kernel, m.CPU, m.Cores, m.MemoryGiB, m.Go, m.IPRoute2)
	if len(rep.Loads) > 0 {
		fmt.Fprintf(b, "| 1-min load average | %.2f at the start, %.2f at the end, %.2f–%.2f over %d samples (the bench itself accounts for 1–3; more means other work shared the cores) |\n",
			rep.Loads[0], rep.Loads[len(rep.Loads)-1], slices.Min(rep.Loads), slices.Max(rep.Loads), len(rep.Loads))
	}
	fmt.Fprintf(b, "| modules | %s |\n", strings.Join(append([]string{"github.com/marksplit/marksplit (this tree" + cmp.Or(", "+m.Tree, "") + ")"}, m.Modules...), "<br>"))
	b.WriteString("\n")
}

func (rep *report) methodData() map[string]any {
	d := map[string]any{"Rep": rep}
	var ns []string
	for _, g := range rep.Sync {
		ns = append(ns, fmtInt(int64(g.N)))
	}
	d["Sizes"] = strings.Join(ns, ", ")
	if c := rep.Churn; c != nil {
		d["Churn"] = c
		d["Expected"] = fmtInt(int64(2 * c.PerWriter * c.Writers))
		d["IngestBuf"] = c.Scenarios[0].RcvBuf >> 20
	}
	if len(rep.Repair) == 2 {
		d["Interval"] = rep.Repair[1].Interval
	}
	return d
}

var methodTmpl = template.Must(template.New("method").Parse(`## Method

**Namespace.** One fresh network namespace holds the seed topology of the agent's tests (enp7s0, a
veth at MTU 1450 with 10.0.0.5/16, to a gateway namespace at 10.0.0.1; cilium_wg0, a tun at MTU 1355)
and N IPv4 /24 routes from 11.0.0.0/24 upwards via 10.0.0.1 dev enp7s0 proto bgp in the main table.
They are loaded with netlink batches: 1024 RTM_NEWROUTE in one sendmsg, only the last asking for an
ack (a failing message is always answered), so each batch costs one write and one read. N grows
through {{.Sizes}}: each size is loaded once, on top of the previous one, and every contender
reads the same table. The local table, the seed routes and the IPv6 routes add a few messages to N.

**Initial sync.** Each contender runs in a fresh process (the bench binary re-executed with
nsenter inside the namespace), so its peak RSS is its own: VmHWM from /proc/self/status at the end,
or, for ip, the ru_maxrss of the ip process. The wall time runs from just before the first socket
is opened until the routes are in hand. "Go heap after sync" is runtime.MemStats.HeapAlloc then,
before any forced GC; "retained" is HeapAlloc after runtime.GC() with the result still referenced
(netwatch's cache, the returned slices, the received updates). For netwatch both also count the
route chunks it maps outside the Go heap (Stats.MappedBytes), so the columns compare what each holds. Default GOGC. The contenders:
the raw dump floor (one RTM_GETROUTE AF_UNSPEC dump read with recvfrom into a 64 KiB buffer, counting
headers, decoding nothing); netwatch (New, Run, wait for Synced: links, addresses, IPv4 and IPv6 routes
and rules, decoded into its typed cache); vishvananda/netlink ` + "`RouteListFiltered(FAMILY_ALL, &Route{Table: RT_TABLE_UNSPEC}, RT_FILTER_TABLE)`" + `;
vishvananda ` + "`RouteSubscribeWithOptions`" + ` with ListExisting, until as many updates as the dump holds
arrived (it has no end-of-dump marker) and kept in a slice; jsimonetti/rtnetlink ` + "`Conn.Route.List()`" + `;
and ` + "`ip -j route show table all`" + ` read through a pipe. The contenders take turns within each run,
and the table shows the median of the runs, with the fastest and slowest. The raw floor and netwatch
then take turns alone for more rounds (-sync-pairs), as the headline compares them and this machine's
pace drifts within a minute. "× floor" is the median, over the rounds, of a contender's wall time
divided by the raw dump's in the same round; "× netwatch" divides medians.
{{with .Churn}}
**Event ingest.** At {{.N}} routes, each consumer runs in a fresh process: it subscribes and reads the
existing routes, says it is ready, and then {{.Writers}} writers (goroutines of the bench, each with its own
socket) each add {{.PerWriter}} /24 routes of their own range in batches of {{.Batch}} per sendmsg and then
delete them, as fast as the kernel acknowledges: {{$.Expected}} route events per run. The consumer stops
when it has processed them all, or 500 ms after the writers' last ack and its own last event. Its
rate is the events it processed divided by the time from its first to its last; its lag is the time
from the writers' last ack to its last event. Consumers that keep state (netwatch's cache; a map that
the vishvananda and rtnetlink consumers update with each event, seeded by their own dump) are then
compared with a kernel dump of the IPv4 routes. Two scenarios, {{.Runs}} run(s) per consumer each:
*ingest*, where every consumer asks for a {{$.IngestBuf}} MiB receive buffer (SO_RCVBUFFORCE; ip monitor
can only ask with SO_RCVBUF, capped at net.core.rmem_max = {{.RmemMax}}), to see the rate it sustains; and
*overflow*, where every consumer has the kernel's default receive buffer (net.core.rmem_default =
{{.RmemDefault}}; netwatch's 8 MiB default is lowered to it), to see what each does when events are lost.
The rtnetlink consumer decodes with rtnetlink's RouteMessage on a mdlayher/netlink Conn, because
rtnetlink.Conn cannot size its buffer.
{{end}}{{with .Interval}}
**Repair latency.** In a fresh seed namespace, the bench deletes the rule with RTM_DELRULE (its full key,
as ` + "`ip rule del not fwmark 0xe00/0xf00 lookup 900 pref 900`" + ` would) and times, on a multicast
subscription of its own, the kernel's RTM_DELRULE notification to the RTM_NEWRULE of the restored rule.
The agent is the built binary (` + "`marksplit run --encryption=on --prefix=10.0.0.0/16 --metrics-addr=`" + `),
a deletion every 150 ms, as a foreign program's occasional deletion comes (back-to-back deletions are a
fight, whose pace the agent limits on purpose), a fresh agent every five. The kernel announces a rule
change after releasing its lock, so the restoration can reach the bench's listener before the deletion
it answers; such a trial counts the gap between the two. The loop is ` + "`while true; do ip rule show pref 900 | grep -q . || ip rule add not fwmark 0xe00/0xf00 lookup 900 pref 900; sleep {{.Seconds}}; done`" + `;
each deletion comes at a random moment of its cycle, stratified so that the trials cover the cycle
evenly, so its expected latency is half the interval.
{{end}}
`))

func (rep *report) syncTables(b *strings.Builder) {
	b.WriteString("## Initial sync\n\n")
	for _, g := range rep.Sync {
		fmt.Fprintf(b, "### %s routes\n\n", fmtInt(int64(g.N)))
		fmt.Fprintf(b, "An AF_UNSPEC dump holds %s route messages. Routes %s to %s loaded in %s (%s routes/s). Median of %d run(s)",
			fmtInt(int64(g.Total)), fmtInt(int64(g.LoadedFrom)), fmtInt(int64(g.N)), fmtDur(float64(g.LoadTime)),
			fmtInt(int64(float64(g.N-g.LoadedFrom)/g.LoadTime.Seconds())), g.Runs)
		if g.Pairs > 0 {
			fmt.Fprintf(b, "; the raw floor and netwatch %d", g.Runs+g.Pairs)
		}
		b.WriteString(".\n\n")
		nw, _ := g.row("netwatch")
		b.WriteString("| contender | wall | fastest–slowest | × floor | × netwatch | peak RSS | × netwatch | Go heap after sync | retained after GC | × netwatch | routes seen |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range g.Rows {
			m := r.medians()
			fmt.Fprintf(b, "| %s | %s | %s–%s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				labels[r.Contender], fmtDur(m.wall), fmtDur(m.wallMin), fmtDur(m.wallMax), ratio(g.floorRatio(r.Contender), 1), ratio(m.wall, nw.wall),
				fmtMiB(m.hwm), ratio(m.hwm, nw.hwm), fmtMiB(m.heap), fmtMiB(m.retained), ratio(m.retained, nw.retained), fmtInt(int64(m.routes)))
		}
		b.WriteString("\n")
	}
	b.WriteString("Routes seen differ by design: netwatch caches IPv4 and IPv6 routes of every table; the raw dump, vishvananda and rtnetlink read an AF_UNSPEC dump (which includes the multicast-routing families' entries, if any); ip prints IPv4 and IPv6.\n\n")
}

func (rep *report) churnTables(b *strings.Builder) {
	c := rep.Churn
	if c == nil {
		return
	}
	exp := int64(2 * c.PerWriter * c.Writers)
	fmt.Fprintf(b, "## Event ingest\n\nAt %s routes; %d writers × %s routes added then deleted, %d per sendmsg: %s route events per run. Median of %d run(s).\n\n",
		fmtInt(int64(c.N)), c.Writers, fmtInt(int64(c.PerWriter)), c.Batch, fmtInt(exp), c.Runs)
	for _, sc := range c.Scenarios {
		switch sc.Name {
		case "ingest":
			fmt.Fprintf(b, "### Ingest: every consumer asks for a %d MiB receive buffer\n\n", sc.RcvBuf>>20)
			b.WriteString("| consumer | events processed | events/s | × floor | writers' ops/s | lag after the writers stop | what happened | end state vs kernel |\n")
			b.WriteString("|---|---:|---:|---:|---:|---:|---|---|\n")
			var floor float64
			for _, r := range sc.Rows {
				if r.Contender == "raw" {
					floor = r.medians().rate
				}
			}
			for _, r := range sc.Rows {
				m := r.medians()
				fmt.Fprintf(b, "| %s | %s of %s | %s | %s | %s | %s | %s | %s |\n", churnLabels[r.Contender], fmtInt(int64(m.events)), fmtInt(exp),
					fmtRate(m.rate), ratio(m.rate, floor), fmtRate(m.writerRate), fmtDur(m.lag), r.outcome(exp), endState(m, len(r.Runs)))
			}
		case "overflow":
			fmt.Fprintf(b, "\n### Overflow: every consumer at the kernel's default receive buffer (%s bytes)\n\n", fmtInt(int64(c.RmemDefault)))
			b.WriteString("| consumer | ENOBUFS seen (netwatch: overflow resyncs) | what it did | events processed | end state vs kernel | lag after the writers stop |\n")
			b.WriteString("|---|---:|---|---:|---|---:|\n")
			for _, r := range sc.Rows {
				m := r.medians()
				fmt.Fprintf(b, "| %s | %.0f | %s | %s of %s | %s | %s |\n", churnLabels[r.Contender], m.enobufs, r.outcome(exp),
					fmtInt(int64(m.events)), fmtInt(exp), endState(m, len(r.Runs)), fmtDur(m.lag))
			}
		}
	}
	b.WriteString(`
What each peer does when the kernel drops events (ENOBUFS), from the runs above and their source:
netwatch re-dumps everything and swaps the cache (Stats().Resyncs[ResyncOverflow] counts it), so it
ends equal to the kernel. vishvananda/netlink's subscription goroutine calls ErrorCallback once with
"Receive failed: no buffer space available" (formatted with %v, so errors.Is(err, unix.ENOBUFS) is
false), closes the channel and stops: no resync, no new subscription; without an ErrorCallback the
channel's closing is the only sign. jsimonetti/rtnetlink (and mdlayher/netlink under it) returns the
error from Receive, matchable with errors.Is, and the socket goes on delivering later events: whatever
was lost stays lost unless the caller re-dumps. ip monitor prints the error to stderr and carries on.

`)
}

func (rep *report) linkTable(b *strings.Builder) {
	if len(rep.Links) == 0 {
		return
	}
	fmt.Fprintf(b, "## Unrelated link changes\n\n")
	fmt.Fprintf(b, "A spare veth that carries no route (its peer up, as a pod's is) goes up and down %d times, %v apart, with each table size in the main table; a netwatch watcher in a fresh process follows. Its CPU from the first change to a second after the last, per change, and the route re-dumps it asked for: of a whole family, and of one link's routes (IPv6 gives the spare link routes of its own while it is up).\n\n", linkChanges, linkPace)
	b.WriteString("| routes | CPU per change | × the smallest table's | whole-family re-dumps | one-link re-dumps |\n|---|---|---|---|---|\n")
	first := float64(rep.Links[0].CPUNS) / float64(rep.Links[0].Changes)
	for _, l := range rep.Links {
		per := float64(l.CPUNS) / float64(l.Changes)
		fmt.Fprintf(b, "| %s | %s | %s | %d | %d |\n", fmtInt(int64(l.N)), fmtDur(per), ratio(per, first), l.FullRedumps, l.LinkRedumps)
	}
	b.WriteString("\n")
}

func (rep *report) repairTable(b *strings.Builder) {
	if len(rep.Repair) == 0 {
		return
	}
	b.WriteString("## Repair latency\n\nFrom the kernel's notification of a foreign RTM_DELRULE to that of the restored rule.\n\n")
	b.WriteString("| repairer | trials | median | fastest | slowest | × agent (median) |\n|---|---:|---:|---:|---:|---:|\n")
	am, _, _ := rep.Repair[0].stats()
	for _, r := range rep.Repair {
		med, lo, hi := r.stats()
		name := r.Name
		if r.Interval == 0 {
			name = "**" + name + "**"
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s |\n", name, len(r.Latencies), fmtDur(med), fmtDur(lo), fmtDur(hi), ratio(med, am))
	}
	b.WriteString("\n")
}

var movesTmpl = template.Must(template.New("moves").Parse(`## What would move the figures

- **Kernel time dominates the floor.** The raw dump is the kernel walking its FIB and copying
  messages; everything above it is decoding and storing. Kernel version, CPU and the number of
  attributes per route (multipath, metrics, IPv6) move the floor and everyone with it.
- **Decoding and allocation.** netwatch decodes each route straight into a compact key and value
  appended to a sorted array per table (the kernel dumps in the keys' order), allocating nothing per
  route; past a table's first 4,096 routes the array's chunks are mapped outside the Go heap, so a
  large table's growth sets off no collections during the dump (netwatch's heap columns add
  Stats.MappedBytes, the memory so mapped); vishvananda allocates net.IP/net.IPNet per route; rtnetlink keeps
  net.IP slices and the raw message; ip formats JSON text. Allocation-heavy decoders pay in GC:
  a smaller GOGC lowers their peak RSS and raises their time, a larger one the opposite.
- **What is read.** netwatch also dumps links, addresses and rules, and IPv6 routes; with
  Options.RouteTables it dumps only the tables it is asked for, which shrinks both time and memory
  for a caller that needs one or two tables out of a full BGP table.
- **Syscalls per datagram.** netwatch reads a dump's datagrams whole (a peek at the length, then
  one recvfrom into one of up to 16 reused 64 KiB buffers) and hands them, eight at a time, to a
  second goroutine that caches them while the kernel fills the next (a dump of one datagram is
  cached in line); events are read with recvmmsg, up to 32 datagrams a call, into a mapped buffer.
  A dump's recvfroms are raw syscalls on the non-blocking socket: the kernel's dump runs inside
  them, and a syscall that tells the scheduler let the reader's P go to the goroutine it had just
  woken, so the dump stood still until a P was free (1.4× the floor at 1M routes before, 1.2× after,
  in alternated fresh processes of this bench's child). The rtnetlink consumer here peeks first and
  allocates per datagram.
- **Cores.** This machine has two: the writers, the kernel's work for them and the consumer share
  them, so the writers' rate is lower while a slow consumer competes for CPU, and a consumer's rate
  is capped by the writers'. More cores raise both.
- **Receive buffers.** Whether a burst overflows depends on the buffer against the burst size: the
  writers' batch size and the consumer's pause. netwatch's default is 8 MiB (Options.ReadBuffer);
  the overflow scenario lowers it on purpose to show the resync.
- **The polling interval.** The loop's latency is uniform between zero and its interval: a 5 s loop
  would have a median near 2.5 s, at six times the processes spawned. The agent's repair latency is
  the kernel's event delivery, two goroutine wake-ups and one pass (re-derive, plan, apply); on a
  2-vCPU VM its slowest trials are the machine's (BenchmarkKernelRuleRestore runs a floor repairer
  beside it, by turns), and in a fight the agent deliberately limits its repairs of the object to a bucket of
  20 refilled every 100 ms.
`))
