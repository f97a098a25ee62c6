//go:build linux

package image

import (
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The agent stops within 5 s of SIGTERM (docs/design.md).
const stopWithin = 5 * time.Second

// refused matches what a process logs when the read-only root or a missing
// capability refuses it something.
var refused = regexp.MustCompile(`(?i)read-only file system|operation not permitted|permission denied`)

// splitCheck returns nil once the node's kernel routes peer through the
// agent's table at the tunnel MTU without the mark, and outside it at the
// link MTU with the mark: the repaired main route has no MTU of its own,
// so ip route get prints none (or the link's).
func (w *world) splitCheck(table, mark string) error {
	plain, marked := w.routeGet(""), w.routeGet(mark)
	if !strings.Contains(plain, "table "+table+" ") || !strings.Contains(plain, fmt.Sprintf("mtu %d", tunnelMTU)) {
		return fmt.Errorf("unmarked: %s", plain)
	}
	if strings.Contains(marked, "table "+table+" ") || strings.Contains(marked, " mtu ") && !strings.Contains(marked, fmt.Sprintf("mtu %d", linkMTU)) {
		return fmt.Errorf("marked: %s", marked)
	}
	return nil
}

// policy returns the agent's table, the mark it matches (without the mask,
// as `ip route get … mark` takes it) and its metrics address, from the
// args it runs with.
func policy(t *testing.T, args []string) (table, mark, metrics string) {
	t.Helper()
	var ok bool
	if table, ok = flagValue(args, "table"); !ok {
		table = "900"
	}
	if mark, ok = flagValue(args, "mark"); !ok {
		mark = "0xe00/0xf00"
	}
	mark, _, _ = strings.Cut(mark, "/")
	if metrics, ok = flagValue(args, "metrics-addr"); !ok || metrics == "" {
		t.Fatalf("args %q: no --metrics-addr (the loopback listener)", args)
	}
	return table, mark, metrics
}

// TestKernelImageAsDaemonSet runs the image's amd64 agent with the
// DaemonSet's security context on the seed topology: it converges, answers
// its probes on loopback, holds exactly the privileges asked for, and exits
// 0 on SIGTERM leaving the split in place.
func TestKernelImageAsDaemonSet(t *testing.T) {
	w := newWorld(t)
	r := w.agentRun()
	table, mark, metrics := policy(t, r.args)
	t.Logf("image %s, labels %v", w.image.Architecture, w.image.Config.Labels)
	t.Logf("runc run: %q", append(slices.Clone(w.image.Config.Entrypoint), r.args...))
	t.Logf("before: ip route get %s: %s", peer, w.routeGet(""))

	agent := w.start(r)
	start := time.Now()
	if err := poll(20*time.Second, func() error {
		if agent.exited() {
			return fmt.Errorf("agent exited %d:\n%s", agent.exit, agent.out)
		}
		return w.splitCheck(table, mark)
	}); err != nil {
		t.Fatalf("no split: %v\nagent:\n%s", err, agent.out)
	}
	t.Logf("converged in %s", time.Since(start).Round(time.Millisecond))
	t.Logf("  ip route get %s: %s", peer, w.routeGet(""))
	t.Logf("  ip route get %s mark %s: %s", peer, mark, w.routeGet(mark))

	c := w.pod.container
	for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.Exec == nil {
			t.Errorf("probe %+v: want an exec probe (the health socket)", p)
			continue
		}
		var said string
		if err := poll(time.Minute, func() (err error) {
			said, err = agent.exec(p.Exec.Command...)
			return err
		}); err != nil {
			t.Errorf("exec probe %q: %v: %s", p.Exec.Command, err, said)
		} else {
			t.Logf("exec probe %q: %s", p.Exec.Command, said)
		}
	}
	if host, _, _ := net.SplitHostPort(metrics); !net.ParseIP(host).IsLoopback() {
		t.Errorf("--metrics-addr=%s is not on loopback", metrics)
	}
	// The loopback listener keeps /healthz for a person with a port-forward.
	if err := poll(time.Minute, func() error {
		code, err := w.httpGet("http://" + metrics + "/healthz")
		if err == nil && code != 200 {
			err = fmt.Errorf("status %d", code)
		}
		return err
	}); err != nil {
		t.Errorf("http://%s/healthz: %v", metrics, err)
	}

	t.Run("privileges of the agent's process", func(t *testing.T) {
		pid, err := agent.pid()
		if err != nil {
			t.Fatal(err)
		}
		st, err := procStatus(pid)
		if err != nil {
			t.Fatal(err)
		}
		w.checkPrivileges(t, r, st)
	})

	t.Run("what a process in this container may do", func(t *testing.T) {
		rep := w.runProbe(t, w.probeRun(r))
		w.checkPrivileges(t, r, rep.Status)
		if !strings.Contains(rep.WriteRoot, "read-only file system") {
			t.Errorf("write to /: %q, want read-only file system", rep.WriteRoot)
		}
		if !strings.Contains(rep.WriteBinary, "read-only file system") {
			t.Errorf("write to the agent's binary: %q, want read-only file system", rep.WriteBinary)
		}
		if !strings.Contains(rep.GetMempolicy, "operation not permitted") {
			t.Errorf("get_mempolicy: %q, want operation not permitted (the seccomp profile, without CAP_SYS_NICE)", rep.GetMempolicy)
		}
		t.Logf("probe: write / → %s; write the binary → %s; get_mempolicy → %s", rep.WriteRoot, rep.WriteBinary, rep.GetMempolicy)
	})

	// The kubelet stops a container with SIGTERM, then SIGKILL after the
	// grace period.
	if err := agent.signal("TERM"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	code, err := agent.wait(time.Duration(w.pod.grace) * time.Second)
	took := time.Since(stopped)
	if err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if code != 0 || took > stopWithin {
		t.Errorf("SIGTERM: exit %d after %s, want 0 within %s", code, took.Round(time.Millisecond), stopWithin)
	}
	t.Logf("SIGTERM: exit %d after %s", code, took.Round(time.Millisecond))
	if err := w.splitCheck(table, mark); err != nil {
		t.Errorf("after the agent stopped: %v", err)
	} else {
		t.Logf("after exit: ip route get %s: %s", peer, w.routeGet(""))
	}

	out := agent.out.String()
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if refused.MatchString(line) || strings.Contains(line, "level=ERROR") {
			t.Errorf("agent logged a refusal or an error: %s", line)
		}
	}
	t.Logf("agent output:\n%s", out)
}

// checkPrivileges compares a process's /proc status with what r asks for.
func (w *world) checkPrivileges(t *testing.T, r run, st map[string]string) {
	t.Helper()
	spec, err := runtimeSpec(r)
	if err != nil {
		t.Fatal(err)
	}
	want, err := capMask(spec.Process.Capabilities.Effective)
	if err != nil {
		t.Fatal(err)
	}
	if netAdmin := uint64(1) << capNames["CAP_NET_ADMIN"]; want != netAdmin {
		t.Errorf("the manifest asks for capabilities %#x; the agent needs exactly NET_ADMIN (%#x)", want, netAdmin)
	}
	for field, wantMask := range map[string]uint64{"CapEff": want, "CapPrm": want, "CapBnd": want, "CapInh": 0, "CapAmb": 0} {
		got, err := strconv.ParseUint(st[field], 16, 64)
		if err != nil || got != wantMask {
			t.Errorf("%s = %s, want %016x", field, st[field], wantMask)
		}
	}
	if st["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs = %s, want 1 (allowPrivilegeEscalation: false)", st["NoNewPrivs"])
	}
	if st["Seccomp"] != "2" {
		t.Errorf("Seccomp = %s, want 2, a filter (RuntimeDefault)", st["Seccomp"])
	}
	if uid := strings.Fields(st["Uid"]); len(uid) > 0 && uid[0] != "0" {
		t.Errorf("Uid = %s, want 0 (runAsUser)", st["Uid"])
	}
	t.Logf("CapEff %s CapBnd %s CapInh %s CapAmb %s NoNewPrivs %s Seccomp %s",
		st["CapEff"], st["CapBnd"], st["CapInh"], st["CapAmb"], st["NoNewPrivs"], st["Seccomp"])
}

// probeReport mirrors probe.Report.
type probeReport struct {
	UID, GID     int
	Status       map[string]string
	WriteRoot    string
	WriteBinary  string
	GetMempolicy string
}

// runProbe runs r (a probeRun) to its end and returns the probe's report.
func (w *world) runProbe(t *testing.T, r run) probeReport {
	t.Helper()
	c := w.start(r)
	code, err := c.wait(20 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("probe: exit %d, %v:\n%s", code, err, c.out)
	}
	var rep probeReport
	out := c.out.String()
	if err := json.Unmarshal([]byte(out[strings.IndexByte(out, '{'):]), &rep); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	return rep
}

// TestKernelImageWithoutNetAdmin shows that the convergence check fails
// when the agent lacks the one capability it needs: the same image and
// manifest, with NET_ADMIN taken out of the added capabilities.
func TestKernelImageWithoutNetAdmin(t *testing.T) {
	w := newWorld(t)
	r := w.agentRun()
	r.withCaps = func(c *corev1.Capabilities) {
		c.Add = slices.DeleteFunc(c.Add, func(cp corev1.Capability) bool { return cp == "NET_ADMIN" })
	}
	table, mark, _ := policy(t, r.args)
	agent := w.start(r)
	if err := poll(20*time.Second, func() error {
		if !refused.MatchString(agent.out.String()) {
			return fmt.Errorf("no EPERM logged yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("without NET_ADMIN: %v\nagent:\n%s", err, agent.out)
	}
	if err := w.splitCheck(table, mark); err == nil {
		t.Fatal("without NET_ADMIN the split is in place: the check cannot tell")
	}
	readyz := w.pod.container.ReadinessProbe.Exec.Command
	if said, err := agent.exec(readyz...); err == nil {
		t.Errorf("without NET_ADMIN %q succeeds: %s", readyz, said)
	}
	var first string
	for _, line := range strings.Split(agent.out.String(), "\n") {
		if refused.MatchString(line) {
			first = line
			break
		}
	}
	t.Logf("without NET_ADMIN: not converged, /readyz not ready; the agent logs: %s", first)
}

// TestKernelImageProbeControls shows that the probe's checks can fail: with
// a writable root its write to / succeeds, and without seccomp its
// get_mempolicy does.
func TestKernelImageProbeControls(t *testing.T) {
	w := newWorld(t)
	r := w.probeRun(w.agentRun())
	r.writable, r.noSecc = true, true
	rep := w.runProbe(t, r)
	if rep.WriteRoot != "" {
		t.Errorf("writable root: write to / failed: %s", rep.WriteRoot)
	}
	if rep.GetMempolicy != "" {
		t.Errorf("no seccomp: get_mempolicy failed: %s", rep.GetMempolicy)
	}
	if rep.Status["Seccomp"] != "0" {
		t.Errorf("no seccomp: Seccomp = %s, want 0", rep.Status["Seccomp"])
	}
	t.Logf("controls: writable root → write / ok; no seccomp → get_mempolicy ok, Seccomp %s", rep.Status["Seccomp"])
}
