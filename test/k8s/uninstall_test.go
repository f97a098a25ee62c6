//go:build linux

package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The uninstall switch: a ConfigMap no manifest ships, created by hand.
const (
	switchName = "marksplit-uninstall"
	switchNS   = "kube-system"
	switchPath = "/api/v1/namespaces/" + switchNS + "/configmaps"
	switchLine = "uninstall switch " + switchNS + "/" + switchName + " present: the split is removed and stays off"
	backLine   = "uninstall switch " + switchNS + "/" + switchName + " deleted: the split follows the encryption mode again"
)

// installRE matches a log line of the agent's that installs or changes
// something in its table or at its priority (removals say "removed").
var installRE = regexp.MustCompile(`msg="(table|rule) 900: (?:[^r]|r[^e]|re[^m])`)

// deployed is the shipped DaemonSet's container, as the harness needs it.
type deployed struct {
	obj  object
	args []string // the container's args, "run" first
}

func loadDaemonSet(t *testing.T, c *cluster) deployed {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(c.repo, "deploy", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := parseManifests(b)
	if err != nil || len(objs) != 1 {
		t.Fatalf("deploy/daemonset.yaml: %v (%d objects)", err, len(objs))
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Args []string `json:"args"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(objs[0].raw, &ds); err != nil || len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("deploy/daemonset.yaml: %v", err)
	}
	d := deployed{obj: objs[0], args: ds.Spec.Template.Spec.Containers[0].Args}
	if len(d.args) == 0 || d.args[0] != "run" || !slices.Contains(d.args, "--uninstall-configmap="+switchName) {
		t.Fatalf("deploy/daemonset.yaml args %q: want run … --uninstall-configmap=%s", d.args, switchName)
	}
	return d
}

// policyArgs are the deployed args the uninstall's cleanup passes, as the
// docs select them.
func (d deployed) policyArgs() []string {
	re := regexp.MustCompile(`^--(tunnel-link|mark|table|priority|peers|prefix|underlay-link|protocol)=`)
	var out []string
	for _, a := range d.args {
		if re.MatchString(a) {
			out = append(out, a)
		}
	}
	return out
}

// apply applies o as `kubectl apply --server-side` does: a PATCH of the
// whole object as the manifest has it, field manager kubectl, no force. A
// conflict (409) fails.
func (k *kube) apply(ctx context.Context, o object) error {
	p, err := objectPath(o)
	if err != nil {
		return err
	}
	code, b, err := k.doType(ctx, "PATCH", p+"?fieldManager=kubectl", "application/apply-patch+yaml", o.raw)
	if err == nil && code != http.StatusOK && code != http.StatusCreated {
		err = fmt.Errorf("apply %s %s: status %d: %s", o.Kind, o.Metadata.Name, code, bytes.TrimSpace(b))
	}
	return err
}

// createSwitch is `kubectl -n kube-system create configmap marksplit-uninstall`.
func (k *kube) createSwitch(ctx context.Context) error {
	_, err := k.must(ctx, http.StatusCreated, "POST", switchPath, map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": switchName, "namespace": switchNS},
	})
	return err
}

// deleteSwitch is `kubectl -n kube-system delete configmap marksplit-uninstall`.
func (k *kube) deleteSwitch(ctx context.Context) error {
	p := switchPath + "/" + switchName
	if _, err := k.must(ctx, http.StatusOK, "DELETE", p, nil); err != nil {
		return err
	}
	return poll(ctx, 50*time.Millisecond, func() error {
		code, _, err := k.do(ctx, "GET", p, nil)
		if err == nil && code != http.StatusNotFound {
			err = fmt.Errorf("GET %s: %d after delete", p, code)
		}
		return err
	})
}

// createPeerNode creates an encrypting CiliumNode with InternalIPs.
func (k *kube) createPeerNode(ctx context.Context, name string, ips ...string) error {
	var addrs []map[string]string
	for _, ip := range ips {
		addrs = append(addrs, map[string]string{"type": "InternalIP", "ip": ip})
	}
	_, err := k.must(ctx, http.StatusCreated, "POST", ciliumNodes, map[string]any{
		"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
		"metadata": map[string]any{"name": name, "labels": map[string]string{"marksplit-test": "uninstall"}},
		"spec":     map[string]any{"encryption": map[string]any{"key": 255}, "addresses": addrs},
	})
	return err
}

func (k *kube) setPeerAddrs(ctx context.Context, name string, ips ...string) error {
	var addrs []map[string]string
	for _, ip := range ips {
		addrs = append(addrs, map[string]string{"type": "InternalIP", "ip": ip})
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"addresses": addrs}})
	code, b, err := k.doType(ctx, "PATCH", ciliumNodes+"/"+name, "application/merge-patch+json", patch)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("PATCH ciliumnode %s: status %d: %s", name, code, bytes.TrimSpace(b))
	}
	return err
}

// deployedAgent is an agent run with the shipped DaemonSet's args and
// environment (NODE_NAME and POD_NAMESPACE from the downward API), its
// metrics on 127.0.0.1:9184 of its node's namespace.
type deployedAgent struct {
	*agent
	n        *node
	finished bool
	// denied is set when the test takes its read access away on purpose:
	// stopNow then checks only how it exits.
	denied bool
}

func (c *cluster) startDeployed(t *testing.T, n *node, name string, d deployed) *deployedAgent {
	t.Helper()
	return c.startWith(t, n, name, d.args, false)
}

// startWith runs the agent with args (the command first) as startDeployed
// does; denied says that the test takes its read access away.
func (c *cluster) startWith(t *testing.T, n *node, name string, args []string, denied bool) *deployedAgent {
	t.Helper()
	a := &deployedAgent{agent: c.launch(t, n, name, args, "POD_NAMESPACE="+switchNS), n: n, denied: denied}
	t.Cleanup(func() { a.stopNow(t) })
	return a
}

// stopNow stops the agent (a pod deleted) and checks how it ended; once.
func (a *deployedAgent) stopNow(t *testing.T) {
	t.Helper()
	switch {
	case a.finished:
	case a.denied:
		a.finished = true
		early, clean := a.exited(), a.stop(5*time.Second)
		if t.Failed() || testing.Verbose() {
			t.Logf("agent output:\n%s", a.output())
		}
		if early || !clean || a.err != nil {
			t.Errorf("the agent: exited early %v, within 5 s of SIGTERM %v, with %v; want no, yes, exit 0", early, clean, a.err)
		}
	default:
		a.finished = true
		a.finish(t)
	}
}

// get fetches path from the agent's metrics listener.
func (a *deployedAgent) get(path string) (int, string, error) {
	resp, err := httpClientIn(a.n.ns, nil).Get("http://127.0.0.1:9184" + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), err
}

// ready is nil once /readyz answers 200.
func (a *deployedAgent) ready() error {
	code, body, err := a.get("/readyz")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("/readyz: %d %s", code, strings.TrimSpace(body))
	}
	return err
}

// metric returns the value of an unlabelled metric.
func (a *deployedAgent) metric(name string) (string, error) {
	_, body, err := a.get("/metrics")
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return "", fmt.Errorf("/metrics has no %s", name)
	}
	return m[1], nil
}

// metricIs is nil once the metric has the value want.
func (a *deployedAgent) metricIs(name, want string) error {
	v, err := a.metric(name)
	if err == nil && v != want {
		err = fmt.Errorf("%s %s, want %s", name, v, want)
	}
	return err
}

// installs returns the lines where the agent installed or changed something
// in its table or at its priority, after the first line that contains after
// (from the start when after is "").
func (a *deployedAgent) installs(after string) []string {
	var out []string
	text := a.output()
	if after != "" {
		i := strings.Index(text, after)
		if i < 0 {
			return []string{"(no line " + after + ")"}
		}
		text = text[i:]
	}
	for _, l := range strings.Split(text, "\n") {
		if installRE.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

// off is nil when the agent is switched off, ready, and its node has no split.
func (a *deployedAgent) off() error {
	return firstErr(a.alive(), a.logged(switchLine), a.n.splitOff(), a.ready())
}

func (a *deployedAgent) on() error {
	return firstErr(a.alive(), a.n.splitOn(), a.ready())
}

// cleanup runs `marksplit cleanup` in the node's namespace with args and
// returns its output and exit code.
func (c *cluster) cleanup(t *testing.T, n *node, args []string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.ns, needAgent(t), "cleanup"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // as `kubectl exec` in the pod, minus the API: cleanup needs none
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// deleteTestNodes deletes the CiliumNodes createPeerNode made, so that the
// peers of later tests are their own.
func (c *cluster) deleteTestNodes(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	if _, err := c.admin.must(ctx, http.StatusOK, "DELETE", ciliumNodes+"?labelSelector=marksplit-test%3Duninstall", nil); err != nil {
		t.Error(err)
	}
}

// restoreManifests puts back deploy/rbac.yaml as the harness created it, for
// the tests that run after one that deleted it.
func (c *cluster) restoreManifests(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	for _, o := range c.rbac {
		p, _ := objectPath(o)
		if code, _, err := c.admin.do(ctx, "GET", p, nil); err == nil && code == http.StatusOK {
			continue
		}
		if err := c.admin.create(ctx, o); err != nil {
			t.Errorf("restore %s %s: %v", o.Kind, o.Metadata.Name, err)
		}
	}
	if code, _, err := c.admin.do(ctx, "GET", switchPath+"/"+switchName, nil); err == nil && code == http.StatusOK {
		if err := c.admin.deleteSwitch(ctx); err != nil {
			t.Error(err)
		}
	}
}

// The deploy Role lets the agent's token list and watch its one ConfigMap
// by a metadata.name field selector — kube-apiserver authorizes that against
// resourceNames — and read no other ConfigMap, nor change this one.
func TestKernelK8sUninstallRBAC(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, time.Minute)
	token, err := c.token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sa := c.admin.withToken(token)
	if _, err := c.admin.must(ctx, http.StatusCreated, "POST", switchPath, map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "other"},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.admin.do(context.Background(), "DELETE", switchPath+"/other", nil) })
	b, err := sa.must(ctx, http.StatusOK, "GET", switchPath+"?fieldSelector="+url.QueryEscape("metadata.name="+switchName), nil)
	if err != nil {
		t.Fatalf("the agent's list of its switch: %v", err)
	}
	var l struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &l); err != nil || l.Metadata.ResourceVersion == "" {
		t.Fatalf("no resourceVersion in %s", b)
	}
	sel := "fieldSelector=" + url.QueryEscape("metadata.name="+switchName)
	for _, tc := range []struct {
		name, method, path string
		body               any
		want               int
	}{
		// What the agent does.
		{"list by name", "GET", switchPath + "?" + sel, nil, http.StatusOK},
		{"watch by name", "GET", switchPath + "?watch=1&allowWatchBookmarks=true&timeoutSeconds=1&" + sel +
			"&resourceVersion=" + l.Metadata.ResourceVersion, nil, http.StatusOK},
		{"get by name (absent)", "GET", switchPath + "/" + switchName, nil, http.StatusNotFound},
		// What it must not.
		{"list every configmap", "GET", switchPath, nil, http.StatusForbidden},
		{"list another by name", "GET", switchPath + "?fieldSelector=" + url.QueryEscape("metadata.name=other"), nil, http.StatusForbidden},
		{"get another", "GET", switchPath + "/other", nil, http.StatusForbidden},
		{"watch every configmap", "GET", switchPath + "?watch=1&timeoutSeconds=1", nil, http.StatusForbidden},
		{"create the switch", "POST", switchPath, map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": switchName},
		}, http.StatusForbidden},
		{"delete another", "DELETE", switchPath + "/other", nil, http.StatusForbidden},
		{"configmaps of another namespace", "GET", "/api/v1/namespaces/default/configmaps?" + sel, nil, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := sa.do(ctx, tc.method, tc.path, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if code != tc.want {
				t.Errorf("%s %s: status %d, want %d: %s", tc.method, tc.path, code, tc.want, body)
			}
		})
	}
}

// The switch turns a running agent off and back on, and an agent restarted
// while it exists never installs the split.
func TestKernelK8sUninstallSwitch(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 5*time.Minute)
	d := loadDaemonSet(t, c)
	t.Cleanup(func() { c.restoreManifests(t) })
	t.Cleanup(func() { c.deleteTestNodes(t) })
	self, peerNode := c.nodeName(), c.nodeName()
	if err := firstErr(c.admin.createPeerNode(ctx, self, "10.0.0.21"), c.admin.createPeerNode(ctx, peerNode, peer)); err != nil {
		t.Fatal(err)
	}
	n := c.newNode(t)
	a := c.startDeployed(t, n, self, d)
	eventually(t, appearDeadline, "the split, ready", a.on)

	if err := c.admin.createSwitch(ctx); err != nil {
		t.Fatal(err)
	}
	took := eventually(t, watchDeadline, "switched off: no split, still ready", func() error {
		return firstErr(a.off(), a.metricIs("marksplit_uninstall_switch", "1"))
	})
	t.Logf("switched off %s after the ConfigMap was created", took.Round(time.Millisecond))

	// Restarted with the switch present: ready (a converged pass, the switch
	// read) with nothing ever installed.
	a.stopNow(t)
	b := c.startDeployed(t, n, self, d)
	eventually(t, appearDeadline, "the restarted agent switched off and ready", b.off)
	if got := b.installs(""); len(got) != 0 {
		t.Errorf("the restarted agent installed with the switch present:\n%s", strings.Join(got, "\n"))
	}

	if err := c.admin.deleteSwitch(ctx); err != nil {
		t.Fatal(err)
	}
	took = eventually(t, watchDeadline, "back on after the ConfigMap is deleted", func() error {
		return firstErr(b.on(), b.logged(backLine), b.metricIs("marksplit_uninstall_switch", "0"))
	})
	t.Logf("back on %s after the ConfigMap was deleted", took.Round(time.Millisecond))
}

// An agent that cannot read the switch at start (its RoleBinding is gone:
// 403) carries on as before and says so; once it can, the switch holds.
func TestKernelK8sUninstallSwitchUnreadable(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 5*time.Minute)
	t.Cleanup(func() { c.restoreManifests(t) })
	var binding object
	for _, o := range c.rbac {
		if o.Kind == "RoleBinding" && o.Metadata.Namespace == switchNS && o.Metadata.Name == "marksplit" {
			binding = o // the switch's; not marksplit-cilium-config's
		}
	}
	if binding.Kind == "" {
		t.Fatal("deploy/rbac.yaml has no RoleBinding " + switchNS + "/marksplit")
	}
	if err := c.admin.delete(ctx, binding); err != nil {
		t.Fatal(err)
	}
	if err := c.admin.createSwitch(ctx); err != nil {
		t.Fatal(err)
	}
	n := c.newNode(t)
	a := c.startWith(t, n, c.nodeName(), []string{"run", "--prefix=10.0.0.0/16", "--encryption=on",
		"--uninstall-configmap=" + switchName, "--metrics-addr=127.0.0.1:9184"}, true)
	eventually(t, appearDeadline, "the split, as before, with the switch unreadable", func() error {
		return firstErr(a.on(), a.logged("uninstall switch "+switchNS+"/"+switchName+" not readable"),
			a.metricIs("marksplit_uninstall_switch", "0"))
	})
	if err := c.admin.create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	took := eventually(t, reconnectDeadline, "switched off once the switch is readable", func() error {
		return firstErr(a.off(), a.metricIs("marksplit_uninstall_switch", "1"))
	})
	t.Logf("switched off %s after the RoleBinding came back (the retry's back-off)", took.Round(time.Millisecond))
}

// The documented uninstall, step by step, on two nodes: create the switch;
// the agents converge to nothing; a re-apply of the manifests, unchanged,
// does not turn them on; cleanup with the deployed flags beside each agent
// succeeds the same way every time and changes nothing; delete the
// manifests (the agents stop); delete the switch. Nothing comes back.
func TestKernelK8sUninstallDocumented(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 5*time.Minute)
	d := loadDaemonSet(t, c)
	t.Cleanup(func() { c.restoreManifests(t) })
	t.Cleanup(func() { c.deleteTestNodes(t) })
	manifests := append(append([]object(nil), c.rbac...), d.obj)
	for _, o := range manifests { // kubectl apply --server-side -k deploy/: the install
		if err := c.admin.apply(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { c.admin.do(context.Background(), "DELETE", mustPath(t, d.obj), nil) })

	names := []string{c.nodeName(), c.nodeName()}
	third := c.nodeName()
	if err := firstErr(
		c.admin.createPeerNode(ctx, names[0], "10.0.0.21"),
		c.admin.createPeerNode(ctx, names[1], "10.0.0.22"),
		c.admin.createPeerNode(ctx, third, peer),
	); err != nil {
		t.Fatal(err)
	}
	var agents []*deployedAgent
	for _, name := range names {
		agents = append(agents, c.startDeployed(t, c.newNode(t), name, d))
	}
	for _, a := range agents {
		eventually(t, appearDeadline, a.name+": the split, ready", a.on)
	}

	// 1. kubectl -n kube-system create configmap marksplit-uninstall
	if err := c.admin.createSwitch(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		eventually(t, watchDeadline, a.name+": switched off", a.off)
	}
	snaps, addrs := map[string]string{}, map[string]string{}
	for _, a := range agents {
		v, err := a.metric("marksplit_peer_addresses")
		if err != nil {
			t.Fatal(err)
		}
		addrs[a.name] = v
		s, err := a.n.snapshot()
		if err != nil {
			t.Fatal(err)
		}
		snaps[a.name] = s
	}

	// 2. A re-apply of the manifests, unchanged (kubectl apply, helm
	// upgrade, a GitOps reconcile): no conflict, and the switch stays.
	for _, o := range manifests {
		if err := c.admin.apply(ctx, o); err != nil {
			t.Fatalf("re-apply: %v", err)
		}
	}
	if _, err := c.admin.must(ctx, http.StatusOK, "GET", switchPath+"/"+switchName, nil); err != nil {
		t.Fatalf("the switch after the re-apply: %v", err)
	}
	// A fence: a CiliumNode change after the re-apply reaches each agent
	// (a third peer address); they stay off all the same.
	if err := c.admin.setPeerAddrs(ctx, third, peer, "10.0.0.19"); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		eventually(t, watchDeadline, a.name+": the peer change seen, still off", func() error {
			v, err := a.metric("marksplit_peer_addresses")
			if err == nil && v == addrs[a.name] {
				err = fmt.Errorf("marksplit_peer_addresses still %s", v)
			}
			return firstErr(err, a.off())
		})
	}

	// 3. marksplit cleanup with the deployed policy flags, beside each
	// running agent, three times: the same answer every time.
	args := append(d.policyArgs(), "--encryption=off", "--metrics-addr=")
	t.Logf("cleanup %s", strings.Join(args, " "))
	for _, a := range agents {
		for i := range 3 {
			stdout, stderr, code := c.cleanup(t, a.n, args)
			want := fmt.Sprintf("marksplit: note: table 900 and priority 900 in this network namespace are kept by another marksplit (pid %d, marksplit): one program per table and per priority in a network namespace; it has nothing left that cleanup would remove\n", agentPid(t, a))
			if code != 0 || stdout != "" || stderr != want {
				t.Errorf("%s: cleanup #%d beside the switched-off agent: exit %d, stdout %q, stderr %q; want exit 0 and %q", a.name, i+1, code, stdout, stderr, want)
			}
		}
	}

	// 4. kubectl delete -k deploy/: the pods stop, then the objects go.
	for _, a := range agents {
		a.stopNow(t)
	}
	for i := len(manifests) - 1; i >= 0; i-- {
		if err := c.admin.delete(ctx, manifests[i]); err != nil {
			t.Fatal(err)
		}
	}
	// 5. kubectl -n kube-system delete configmap marksplit-uninstall
	if err := c.admin.deleteSwitch(ctx); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		if got := a.installs(switchLine); len(got) != 0 {
			t.Errorf("%s: installed after the switch:\n%s", a.name, strings.Join(got, "\n"))
		}
		got, err := a.n.snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(snaps[a.name], got); diff != "" {
			t.Errorf("%s: the node changed after the agents were switched off (-off +now):\n%s", a.name, diff)
		}
		if err := a.n.splitOff(); err != nil {
			t.Errorf("%s: %v", a.name, err)
		}
	}
}

func mustPath(t *testing.T, o object) string {
	p, err := objectPath(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// agentPid is the pid of the marksplit process that `ip netns exec` became.
func agentPid(t *testing.T, a *deployedAgent) int {
	t.Helper()
	return a.cmd.Process.Pid // ip netns exec execs the command: the same process
}
