package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() { os.Exit(run()) }

type config struct {
	repo, cache, work string
	kernels           []string
	full              bool
	only              []string
	runOnly           string
	parallel          int
	memMiB, cpus      int
	timeout           time.Duration
}

func run() int {
	var c config
	kernels := flag.String("kernels", "6.1,5.10,6.12", "comma-separated `list` of kernels to boot (5.10, 6.1, 6.12)")
	only := flag.String("suites", "", "comma-separated `list` of suites to run (default: each kernel's plan.go budget)")
	flag.StringVar(&c.runOnly, "run", "", "`regexp` for -test.run instead of each suite's (to run one test while debugging)")
	flag.BoolVar(&c.full, "full", false, "run every suite on every kernel (make test-kernels FULL=1)")
	flag.IntVar(&c.parallel, "parallel", 2, "guests at once")
	flag.IntVar(&c.memMiB, "mem", 2560, "guest memory in MiB")
	flag.IntVar(&c.cpus, "smp", 2, "guest CPUs")
	flag.StringVar(&c.work, "work", "", "the run's `directory`, emptied first (default $MARKSPLIT_CACHE/kernels/run)")
	flag.DurationVar(&c.timeout, "timeout", 45*time.Minute, "the longest a guest may run")
	flag.Parse()
	c.kernels = strings.Split(*kernels, ",")
	if *only != "" {
		c.only = strings.Split(*only, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	wd, err := os.Getwd()
	if err != nil {
		return fail(err)
	}
	c.repo = filepath.Dir(filepath.Dir(wd)) // test/kernels
	c.cache = filepath.Join(cacheDir(), "kernels")
	start := time.Now()
	if err := c.prepare(ctx); err != nil {
		return fail(err)
	}
	fmt.Printf("== test-kernels: prepared in %v; booting %s (%d at once)\n", time.Since(start).Round(time.Second), strings.Join(c.kernels, ", "), c.parallel)

	// The kernels in the order given, each to the next free guest slot:
	// the default order puts the longest plan (6.1) first.
	results := make([]*result, len(c.kernels))
	next := make(chan int, len(c.kernels))
	for i := range c.kernels {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range c.parallel {
		wg.Go(func() {
			for i := range next {
				results[i] = c.boot(ctx, c.kernels[i])
				fmt.Printf("== %s\n", results[i].line())
			}
		})
	}
	wg.Wait()
	ok := true
	fmt.Println()
	fmt.Println("== test-kernels summary")
	for _, r := range results {
		fmt.Println(r.line())
		r.details(os.Stdout)
		ok = ok && r.ok()
	}
	fmt.Printf("== test-kernels: %v in all\n", time.Since(start).Round(time.Second))
	if !ok {
		return 1
	}
	return 0
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "test-kernels: %v\n", err)
	return 1
}

func cacheDir() string {
	if d := os.Getenv("MARKSPLIT_CACHE"); d != "" {
		return d
	}
	return "/var/cache/marksplit"
}

// prepare fetches what the guests boot and builds what they run.
func (c *config) prepare(ctx context.Context) error {
	fetch := exec.CommandContext(ctx, filepath.Join(c.repo, "test/kernels/fetch.sh"))
	fetch.Env = append(os.Environ(), "KERNELS="+strings.Join(c.kernels, " "))
	fetch.Stdout, fetch.Stderr = io.Discard, os.Stderr
	if err := fetch.Run(); err != nil {
		return fmt.Errorf("fetch.sh: %w", err)
	}
	if c.work == "" {
		c.work = filepath.Join(c.cache, "run")
	}
	os.RemoveAll(c.work)
	bin := filepath.Join(c.work, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	build := func(dir string, args ...string) error {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = filepath.Join(c.repo, dir)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go %s (in %s): %v\n%s", strings.Join(args, " "), cmd.Dir, err, out)
		}
		return nil
	}
	jobs := []func() error{
		func() error { return build("", "build", "-o", filepath.Join(c.work, "test2json"), "cmd/test2json") },
		func() error { return build("", "build", "-o", filepath.Join(bin, "marksplit"), "./agent") },
	}
	for _, s := range suites {
		jobs = append(jobs, func() error {
			return build(s.module, "test", "-c", "-o", filepath.Join(bin, s.name+".test"), s.pkg)
		})
	}
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for i, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = j()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// boot runs kernel k's plan in a guest and reads its results.
func (c *config) boot(ctx context.Context, k string) *result {
	r := &result{kernel: k, start: time.Now()}
	defer func() { r.took = time.Since(r.start) }()
	kdir := filepath.Join(c.cache, k)
	dir := filepath.Join(c.work, k)
	if err := os.MkdirAll(filepath.Join(dir, "out"), 0o755); err != nil {
		r.err = err
		return r
	}
	plan := planFor(k, c.full, c.only)
	r.planned = plan
	if r.leftOut, r.err = c.leftOut(plan); r.err != nil {
		return r
	}
	if err := c.writePlan(dir, plan); err != nil {
		r.err = err
		return r
	}
	initrd := filepath.Join(dir, "initrd")
	if err := c.initramfs(kdir, initrd); err != nil {
		r.err = fmt.Errorf("initramfs: %w", err)
		return r
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	r.err = c.run(ctx, kdir, dir, initrd)
	if !guestUp(dir) && ctx.Err() == nil {
		// The kernel died before the guest's first line: under TCG on a
		// busy host a boot can panic in the emulation (6.12 did, patching
		// its own code). That is no test's result; one more boot is.
		r.rebooted = bootFailure(filepath.Join(dir, "console.log"))
		os.Rename(filepath.Join(dir, "console.log"), filepath.Join(dir, "console-first-boot.log"))
		r.err = c.run(ctx, kdir, dir, initrd)
	}
	r.read(dir)
	return r
}

// run boots the kernel of kdir once with initrd, its console in dir/console.log.
func (c *config) run(ctx context.Context, kdir, dir, initrd string) error {
	if err := os.RemoveAll(filepath.Join(dir, "out")); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, "out"), 0o755); err != nil {
		return err
	}
	console, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		return err
	}
	defer console.Close()
	tools := filepath.Join(c.cache, "tools")
	cmdline := strings.Join([]string{"console=ttyS0", "panic=-1", "quiet", "random.trust_cpu=on",
		// 5.10 picks hpet under TCG, where each clock read is an emulated
		// device access: Go reads the clock all the time.
		"clocksource=tsc", "tsc=reliable",
		// On a busy host the boot-time check of the timer interrupt can
		// miss its ticks and panic ("IO-APIC + timer doesn't work").
		"no_timer_check",
		"marksplit.work=" + dir, "marksplit.repo=" + c.repo, "marksplit.tools=" + tools}, " ")
	q := exec.CommandContext(ctx, "qemu-system-x86_64",
		"-accel", "tcg", "-cpu", "max", "-smp", fmt.Sprint(c.cpus), "-m", fmt.Sprint(c.memMiB),
		"-nographic", "-no-reboot", "-nic", "none",
		"-kernel", filepath.Join(kdir, "vmlinuz"), "-initrd", initrd, "-append", cmdline,
		"-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path="+filepath.Join(kdir, "modules")+",mount_tag=modules,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path="+dir+",mount_tag=work,security_model=none,multidevs=remap")
	q.Stdout, q.Stderr = console, console
	// A guest never outlives the run, however it ends.
	q.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := q.Run(); err != nil {
		return fmt.Errorf("qemu: %v (see %s)", err, console.Name())
	}
	return nil
}

// guestUp reports whether the guest of dir came up: its first stage wrote
// out/guest.
func guestUp(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "out", "guest"))
	return err == nil
}

// bootFailure is why a boot that never reached the guest ended: the
// console's panic line, or its last line.
func bootFailure(console string) string {
	b, _ := os.ReadFile(console)
	last := ""
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if _, msg, ok := strings.Cut(line, "] "); ok && strings.HasPrefix(msg, "Kernel panic") {
			return msg
		}
		if line != "" {
			last = line
		}
	}
	if last == "" {
		return "no console output"
	}
	return last
}

func (c *config) writePlan(dir string, plan []planned) error {
	var b strings.Builder
	for _, s := range plan {
		cwd := filepath.Join(c.repo, s.module, s.pkg)
		fmt.Fprintf(&b, "%s %s %s -t -p %s env", s.name, cwd, filepath.Join(c.work, "test2json"), s.name)
		for _, e := range s.env {
			fmt.Fprintf(&b, " %s", strings.ReplaceAll(e, "@agent", filepath.Join(c.work, "bin", "marksplit")))
		}
		run := cmp.Or(c.runOnly, s.choice.run, s.suite.run)
		fmt.Fprintf(&b, " %s -test.v=test2json -test.run %s -test.timeout 40m", filepath.Join(c.work, "bin", s.name+".test"), run)
		if s.skip != "" && c.runOnly == "" {
			fmt.Fprintf(&b, " -test.skip %s", s.skip)
		}
		b.WriteString("\n")
	}
	return os.WriteFile(filepath.Join(dir, "plan"), []byte(b.String()), 0o644)
}

// leftOut lists the real-kernel tests of every suite that plan does not
// run, as "SUITE TEST": the test binaries list them on the host.
func (c *config) leftOut(plan []planned) ([]string, error) {
	var out []string
	for _, s := range suites {
		list, err := exec.Command(filepath.Join(c.work, "bin", s.name+".test"), "-test.list", s.run).Output()
		if err != nil {
			return nil, fmt.Errorf("%s.test -test.list: %w", s.name, err)
		}
		i := slices.IndexFunc(plan, func(p planned) bool { return p.name == s.name })
		for name := range strings.Lines(string(list)) {
			name = strings.TrimSpace(name)
			if name == "" || !strings.HasPrefix(name, "Test") {
				continue
			}
			if i >= 0 && c.runOnly == "" && runs(plan[i], name) {
				continue
			}
			if i >= 0 && c.runOnly != "" && regexp.MustCompile(c.runOnly).MatchString(name) {
				continue
			}
			out = append(out, s.name+" "+name)
		}
	}
	return out, nil
}

// runs reports whether p's patterns select the top-level test name.
func runs(p planned, name string) bool {
	run := regexp.MustCompile(cmp.Or(p.choice.run, p.suite.run))
	if !run.MatchString(name) {
		return false
	}
	return p.skip == "" || !regexp.MustCompile(p.skip).MatchString(name)
}

// initramfs writes the guest's initramfs: busybox, init.sh as /init, and
// the modules the root file system needs (decompressed: busybox's insmod
// reads plain .ko files), in the order modprobe would load them.
func (c *config) initramfs(kdir, out string) error {
	version, err := os.ReadFile(filepath.Join(kdir, "version"))
	if err != nil {
		return err
	}
	tools := filepath.Join(c.cache, "tools")
	mp := exec.Command(filepath.Join(tools, "bin", "modprobe"), "-d", kdir, "-S", strings.TrimSpace(string(version)),
		"-a", "--show-depends", "virtio_pci", "9pnet_virtio", "9p", "overlay")
	mp.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(tools, "lib"))
	deps, err := mp.Output()
	if err != nil {
		return fmt.Errorf("modprobe --show-depends: %w", err)
	}
	root, err := os.MkdirTemp(filepath.Dir(out), "initramfs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	for _, d := range []string{"bin", "lib"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	var order []string
	for line := range strings.Lines(string(deps)) {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "insmod" {
			continue // builtin
		}
		name := filepath.Base(f[1])
		plain := strings.TrimSuffix(strings.TrimSuffix(name, ".xz"), ".zst")
		if slices.Contains(order, plain) {
			continue
		}
		order = append(order, plain)
		dst := filepath.Join(root, "lib", plain)
		var cmd *exec.Cmd
		switch {
		case strings.HasSuffix(name, ".xz"):
			cmd = exec.Command("sh", "-c", `"$0" unxz -c "$1" >"$2"`, filepath.Join(tools, "bin", "busybox"), f[1], dst)
		case strings.HasSuffix(name, ".zst"):
			cmd = exec.Command("sh", "-c", `zstd -dc "$1" >"$2"`, "sh", f[1], dst)
		default:
			cmd = exec.Command("cp", f[1], dst)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", f[1], err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "modules.list"), []byte(strings.Join(order, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(c.repo, "test/kernels/init.sh"), filepath.Join(root, "init"), 0o755); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(tools, "bin", "busybox"), filepath.Join(root, "bin", "busybox"), 0o755); err != nil {
		return err
	}
	cpio := exec.Command("sh", "-c", `find . | "$0" -o -H newc --quiet >"$1"`, filepath.Join(tools, "bin", "cpio"), out)
	cpio.Dir = root
	if b, err := cpio.CombinedOutput(); err != nil {
		return fmt.Errorf("cpio: %v: %s", err, b)
	}
	return nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, mode)
}

// result is what one guest ran and found.
type result struct {
	kernel      string
	uname       string
	planned     []planned
	leftOut     []string // tests this run left to FULL=1
	start       time.Time
	took        time.Duration
	err         error
	passed      []string
	failed      []string
	skipped     map[string]string // test: its reason
	missing     []string          // suites that wrote no result
	wireguard   string
	figures     []string
	failureLogs map[string][]string
	rebooted    string // why the first boot failed, when a second one ran
}

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func (r *result) read(dir string) {
	r.skipped = map[string]string{}
	r.failureLogs = map[string][]string{}
	if b, err := os.ReadFile(filepath.Join(dir, "out", "guest")); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "uname="); ok {
				r.uname = v
			}
		}
	}
	for _, s := range r.planned {
		f, err := os.Open(filepath.Join(dir, "out", s.name+".json"))
		if err != nil {
			r.missing = append(r.missing, s.name)
			continue
		}
		r.readSuite(s, f)
		f.Close()
	}
}

func (r *result) readSuite(s planned, f io.Reader) {
	output := map[string][]string{}
	ended := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		name := s.name + " " + e.Test
		switch e.Action {
		case "output":
			if e.Test == "" {
				continue
			}
			output[e.Test] = append(output[e.Test], e.Output)
			if v, ok := strings.CutPrefix(trimLog(strings.TrimSpace(e.Output)), "the running kernel: "); ok {
				r.figures = append(r.figures, "netwatchtest.Behavior probed: "+v)
			}
			if s.name == "wireguard" {
				if v, ok := strings.CutPrefix(trimLog(strings.TrimSpace(e.Output)), "WireGuard: "); ok {
					r.wireguard = v
				} else if o := strings.TrimSpace(e.Output); isFigure(o) {
					r.figures = append(r.figures, e.Test+": "+trimLog(o))
				}
			}
		case "pass", "fail", "skip":
			if e.Test == "" {
				ended = true
				if e.Action == "fail" && len(r.failed) == 0 {
					r.failed = append(r.failed, s.name+" (the binary failed: see its output)")
				}
				continue
			}
			if strings.Contains(e.Test, "/") {
				continue // subtests count with their test
			}
			switch e.Action {
			case "pass":
				r.passed = append(r.passed, name)
			case "fail":
				r.failed = append(r.failed, name)
				r.failureLogs[name] = output[e.Test]
			case "skip":
				r.skipped[name] = skipReason(output[e.Test])
			}
		}
	}
	if !ended {
		r.missing = append(r.missing, s.name+" (did not finish)")
	}
}

func isFigure(o string) bool {
	for _, p := range []string{"without the agent", "with the agent", "bulk TCP", "flap:", "traffic during", "after the flap", "host TCP"} {
		if strings.Contains(trimLog(o), p) {
			return true
		}
	}
	return false
}

// trimLog drops the file:line prefix of a t.Log line.
func trimLog(o string) string {
	if i := strings.Index(o, ".go:"); i >= 0 {
		if j := strings.Index(o[i:], ": "); j >= 0 {
			return o[i+j+2:]
		}
	}
	return o
}

func skipReason(out []string) string {
	for _, o := range slices.Backward(out) {
		o = strings.TrimSpace(o)
		if o == "" || strings.HasPrefix(o, "---") || strings.HasPrefix(o, "===") {
			continue
		}
		return trimLog(o)
	}
	return "no reason given"
}

func (r *result) ok() bool {
	return r.err == nil && len(r.failed) == 0 && len(r.missing) == 0 && len(r.passed) > 0
}

// line is the kernel's summary line.
func (r *result) line() string {
	uname := r.uname
	if uname == "" {
		uname = r.kernel + " (did not report)"
	}
	var skips []string
	for t, why := range r.skipped {
		skips = append(skips, t+": "+why)
	}
	sort.Strings(skips)
	s := fmt.Sprintf("%s: %d passed, %d failed, %d skipped", uname, len(r.passed), len(r.failed), len(r.skipped))
	if len(skips) > 0 {
		s += " (" + strings.Join(skips, "; ") + ")"
	}
	wg := r.wireguard
	if wg == "" {
		wg = "none (the WireGuard tests did not run)"
	}
	s += fmt.Sprintf("; WireGuard: %s; %v", wg, r.took.Round(time.Second))
	if r.rebooted != "" {
		s += fmt.Sprintf("; booted twice (the first boot: %s)", r.rebooted)
	}
	if len(r.leftOut) > 0 {
		s += fmt.Sprintf("; %d left to FULL=1", len(r.leftOut))
	}
	if !r.ok() {
		s += "; FAIL"
	}
	return s
}

func (r *result) details(w io.Writer) {
	if r.err != nil {
		fmt.Fprintf(w, "   error: %v\n", r.err)
	}
	for _, m := range r.missing {
		fmt.Fprintf(w, "   no result: %s\n", m)
	}
	if len(r.leftOut) > 0 {
		fmt.Fprintf(w, "   left to FULL=1 (test/kernels/plan.go says why): %s\n", strings.Join(r.leftOut, ", "))
	}
	for _, f := range r.figures {
		fmt.Fprintf(w, "   %s\n", f)
	}
	for _, t := range r.failed {
		fmt.Fprintf(w, "   FAIL %s\n", t)
		for _, o := range r.failureLogs[t] {
			fmt.Fprintf(w, "      %s", o)
		}
	}
}
