//go:build linux

package k8s

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// How long the agent may take to follow a change that reaches it through an
// established watch, and to repair the kernel.
const (
	watchDeadline = 10 * time.Second
	// Until its CiliumNode exists the agent repeats its GET with back-off
	// (there is no resourceVersion to watch from).
	appearDeadline = 30 * time.Second
	repairDeadline = 10 * time.Second
	// After an outage the agent reconnects on its own schedule (backoff).
	reconnectDeadline = 90 * time.Second
)

// agent is a marksplit process run the way the DaemonSet runs it.
type agent struct {
	*proc
	c         *cluster
	name      string  // its node's name (NODE_NAME, the CiliumNode)
	sa        *podDir // its service-account volume
	token     string  // the token sa holds
	auditFrom int     // audit events of the service account before it started
}

// nodeName returns a CiliumNode name no other test of this run uses (and
// that is no prefix of another).
func (c *cluster) nodeName() string { return fmt.Sprintf("node%03d", c.next()) }

// startAgent runs `marksplit run --encryption=auto --prefix=10.0.0.0/16
// --metrics-addr=` in n's namespace as the DaemonSet's pod would run it (see
// launch). When t ends the agent gets SIGTERM and must exit 0 within 5 s, and
// must not have been denied (403).
func (c *cluster) startAgent(t *testing.T, n *node, name string) *agent {
	t.Helper()
	a := c.launch(t, n, name, []string{"run", "--encryption=auto", "--prefix=10.0.0.0/16", "--metrics-addr="})
	t.Cleanup(func() { a.finish(t) })
	return a
}

// launch runs the agent with args (the command first) in n's namespace as
// the DaemonSet's pod would run it: the environment has
// KUBERNETES_SERVICE_HOST/PORT, NODE_NAME and env, and a fresh
// service-account token and the cluster CA are in a kubelet-style directory
// (MARKSPLIT_SERVICEACCOUNT_DIR stands for
// /var/run/secrets/kubernetes.io/serviceaccount), removed when t ends. The
// caller says how the agent is to end.
func (c *cluster) launch(t *testing.T, n *node, name string, args []string, env ...string) *agent {
	t.Helper()
	token, err := c.token(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return c.launchToken(t, n, name, token, args, env...)
}

// launchToken is launch with the given service-account token (one bound to
// a Pod, as the kubelet mounts).
func (c *cluster) launchToken(t *testing.T, n *node, name, token string, args []string, env ...string) *agent {
	t.Helper()
	bin := needAgent(t)
	dir := filepath.Join(c.dir, fmt.Sprintf("%s-%d", name, c.next()))
	sa, err := newPodDir(filepath.Join(dir, "serviceaccount"), c.caFile(), c.sa.Metadata.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := sa.write(token); err != nil {
		t.Fatal(err)
	}
	before, err := c.agentRequests()
	if err != nil {
		t.Fatal(err)
	}
	env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"KUBERNETES_SERVICE_HOST=" + apiAddr,
		"KUBERNETES_SERVICE_PORT=" + apiPort,
		"NODE_NAME=" + name,
		"MARKSPLIT_SERVICEACCOUNT_DIR=" + sa.dir,
	}, env...)
	p, err := startProc("marksplit", filepath.Join(dir, "agent.log"), env,
		"ip", append([]string{"netns", "exec", n.ns, bin}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &agent{proc: p, c: c, name: name, sa: sa, token: token, auditFrom: len(before)}
}

// encrypting makes a new node whose CiliumNode encrypts (key 255), starts
// an agent for it as startAgent does, and waits for the split.
func (c *cluster) encrypting(t *testing.T, ctx context.Context) (*node, string, *agent) {
	t.Helper()
	n := c.newNode(t)
	name := c.nodeName()
	if err := c.admin.createCiliumNode(ctx, name, 255); err != nil {
		t.Fatal(err)
	}
	a := c.startAgent(t, n, name)
	eventually(t, watchDeadline, "split with key 255", func() error {
		return firstErr(a.alive(), n.splitOn())
	})
	return n, name, a
}

// finish stops the agent and checks how it ended and what it was denied.
func (a *agent) finish(t *testing.T) {
	t.Helper()
	early := a.exited()
	clean := a.stop(5 * time.Second)
	out := a.output()
	if t.Failed() || testing.Verbose() {
		t.Logf("agent output:\n%s", out)
	}
	switch {
	case early:
		t.Errorf("the agent exited before the test ended: %v", a.err)
	case !clean:
		t.Errorf("the agent did not exit within 5 s of SIGTERM")
	case a.err != nil:
		t.Errorf("the agent exited with %v after SIGTERM, want 0", a.err)
	}
	for _, line := range strings.Split(out, "\n") {
		if !deniedRE.MatchString(line) {
			continue
		}
		if ts, ok := logTime(line); ok && a.c.wasUnready(ts) {
			t.Logf("denied while the API server was starting (not the ClusterRole's fault): %s", line)
			continue
		}
		t.Errorf("the agent was denied: the deploy ClusterRole is not sufficient: %s", line)
	}
	for _, e := range a.requests(t) {
		if e.ResponseStatus == nil || e.ResponseStatus.Code != 403 {
			continue
		}
		if a.c.wasUnready(e.RequestReceived) {
			continue
		}
		t.Errorf("the API server denied the agent: %v", e)
	}
}

// deniedRE finds a 403 or "forbidden" in a log line; a 403 next to a dot or
// a digit is part of a number (a duration, a timestamp).
var deniedRE = regexp.MustCompile(`(?i)(^|[^.\d])403([^.\d]|$)|forbidden`)

var logTimeRE = regexp.MustCompile(`\btime="?([0-9][0-9T:.+\-Z]+)`)

// logTime returns the time= (text) or "time": (JSON) of an slog line.
func logTime(line string) (time.Time, bool) {
	line = strings.Replace(line, `"time":`, "time=", 1)
	m := logTimeRE.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}, false
	}
	ts, err := time.Parse(time.RFC3339Nano, m[1])
	return ts, err == nil
}

// requests returns the audit events of the agent's requests so far.
func (a *agent) requests(t testing.TB) []auditEvent {
	t.Helper()
	evs, err := a.c.agentRequests()
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < a.auditFrom {
		return nil
	}
	return evs[a.auditFrom:]
}

// alive ends a poll at once when the agent has exited.
func (a *agent) alive() error {
	if a.exited() {
		return stopPolling(fmt.Errorf("the agent exited: %v", a.waitErr()))
	}
	return nil
}

// logged is nil once the agent's output contains s.
func (a *agent) logged(s string) error {
	if !strings.Contains(a.output(), s) {
		return fmt.Errorf("the agent has not logged %q", s)
	}
	return nil
}

func (a *agent) watching(t testing.TB) {
	t.Helper()
	for _, e := range about(a.requests(t), a.name) {
		if e.Verb == "watch" {
			return
		}
	}
	t.Errorf("the agent never watched CiliumNode %s; its requests:\n%v", a.name, about(a.requests(t), a.name))
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The node's mode follows its CiliumNode: nothing before it exists, the split
// once it has an encryption key, none when the key is patched away, and back
// when it returns; each change arrives through the watch.
func TestKernelK8sEncryptionFollowsCiliumNode(t *testing.T) {
	c := need(t)
	n := c.newNode(t)
	name := c.nodeName()
	ctx := ctxFor(t, 5*time.Minute)

	seed, err := n.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	a := c.startAgent(t, n, name)

	// Two requests about its node: the agent has been answered 404 and has
	// acted on it (asked again, or started watching).
	eventually(t, 30*time.Second, "the agent asks about its CiliumNode", func() error {
		if err := a.alive(); err != nil {
			return err
		}
		if got := distinct(about(a.requests(t), name)); got < 2 {
			return fmt.Errorf("%d requests about %s", got, name)
		}
		return nil
	})
	got, err := n.snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(seed, got); diff != "" {
		t.Fatalf("the agent edited the kernel before the CiliumNode existed (-want +got):\n%s", diff)
	}
	if err := n.splitOff(); err != nil {
		t.Fatal(err)
	}

	if err := c.admin.createCiliumNode(ctx, name, 255); err != nil {
		t.Fatal(err)
	}
	eventually(t, appearDeadline, "split after the CiliumNode is created with key 255", func() error {
		return firstErr(a.alive(), n.splitOn())
	})

	if err := c.admin.setEncryptionKey(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, watchDeadline, "no split after the key is patched away", func() error {
		return firstErr(a.alive(), n.splitOff(), a.logged("node encryption: no"))
	})

	if err := c.admin.setEncryptionKey(ctx, name, 255); err != nil {
		t.Fatal(err)
	}
	eventually(t, watchDeadline, "split after the key is patched back", func() error {
		return firstErr(a.alive(), n.splitOn())
	})
	a.watching(t)
}

// With the API server gone the mode stands and the kernel is still repaired;
// when it is back the agent's watch resumes.
func TestKernelK8sAPIServerDownAndBack(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 5*time.Minute)
	n, name, a := c.encrypting(t, ctx)

	c.stopAPIServer()
	t.Cleanup(func() { c.ensureAPIServer(t) })
	if _, err := ipOut(n.ns, "rule", "del", "pref", "900"); err != nil {
		t.Fatal(err)
	}
	eventually(t, repairDeadline, "the deleted rule repaired while the API server is down", func() error {
		return firstErr(a.alive(), n.splitOn())
	})

	start := time.Now()
	if err := c.startAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server down for %s", time.Since(start).Round(time.Millisecond))
	if err := n.splitOn(); err != nil {
		t.Fatalf("the mode did not stand while the API server was down: %v", err)
	}

	if err := c.admin.setEncryptionKey(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, reconnectDeadline, "the watch resumes: no split after the key is patched away", func() error {
		return firstErr(a.alive(), n.splitOff(), a.logged("node encryption: no"))
	})
	if err := c.admin.setEncryptionKey(ctx, name, 255); err != nil {
		t.Fatal(err)
	}
	eventually(t, watchDeadline, "split after the key is patched back", func() error {
		return firstErr(a.alive(), n.splitOn())
	})
}

// The token in the pod's volume rotates and the old one stops working: the
// agent reads the new one and keeps following its CiliumNode.
func TestKernelK8sTokenRotation(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 5*time.Minute)
	n, name, a := c.encrypting(t, ctx)

	// Re-creating the ServiceAccount (same name, new UID) invalidates every
	// token issued for the old one.
	if err := c.admin.delete(ctx, c.sa); err != nil {
		t.Fatal(err)
	}
	if err := c.admin.create(ctx, c.sa); err != nil {
		t.Fatal(err)
	}
	old := c.admin.withToken(a.token)
	eventually(t, 30*time.Second, "the old token is refused", func() error {
		code, _, err := old.do(ctx, "GET", ciliumNodes+"/"+name, nil)
		if err == nil && code != 401 {
			err = fmt.Errorf("GET with the old token: %d, want 401", code)
		}
		return err
	})
	token, err := c.token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.sa.write(token); err != nil {
		t.Fatal(err)
	}

	// The agent's watch was authenticated with the old token and would go
	// on; a restart of the API server makes it authenticate again.
	c.restartAPIServer(t)

	if err := c.admin.setEncryptionKey(ctx, name, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, reconnectDeadline, "no split after the key is patched away, with the new token", func() error {
		return firstErr(a.alive(), n.splitOff(), a.logged("node encryption: no"))
	})
	if err := c.admin.setEncryptionKey(ctx, name, 255); err != nil {
		t.Fatal(err)
	}
	eventually(t, watchDeadline, "split after the key is patched back", func() error {
		return firstErr(a.alive(), n.splitOn())
	})
}

// restartAPIServer stops and starts the API server, failing t on error.
func (c *cluster) restartAPIServer(t testing.TB) {
	t.Helper()
	c.stopAPIServer()
	t.Cleanup(func() { c.ensureAPIServer(t) })
	if err := c.startAPIServer(); err != nil {
		t.Fatal(err)
	}
}

// ensureAPIServer starts the API server again if a test stopped it and
// failed before starting it, so the following tests have one.
func (c *cluster) ensureAPIServer(t testing.TB) {
	t.Helper()
	if c.apiserver != nil && !c.apiserver.exited() {
		return
	}
	c.stopAPIServer()
	if err := c.startAPIServer(); err != nil {
		t.Errorf("restart the API server: %v", err)
	}
}
