//go:build linux

package k8s

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// docs/operations.md, run: every fenced command block of the file, taken
// from the file (not copied here), is run as written — against the real API
// server, in a node's network namespace, or both, since the node's namespace
// reaches the API server as a host-network pod does — or is listed in
// docRules with the reason it cannot run here (a registry, a real Cilium).
// A block that no rule names fails the test, and so does a rule that names
// no block: the doc and the test cannot drift apart.
//
// What a kubelet and the controllers would do, the test does in their
// stead, visibly (standIn): it schedules the DaemonSet's pod on worker-1,
// runs the agent with the args of the DaemonSet the API server holds and a
// token bound to that pod, reports the DaemonSet rolled out once the agent
// is Ready, and runs helm test's pod. `kubectl exec` runs the command after
// -- in the pod's node namespace with the pod's environment, `kubectl logs`
// prints the agent's log, and `kubectl port-forward` is a no-op because the
// commands already run in the node's network namespace.

// docBlock is one fenced block of docs/operations.md.
type docBlock struct {
	line   int    // the line of its opening fence
	lang   string // the fence's info string
	first  string // its first command
	script string // the block as a bash script (prompt blocks: the $ lines)
	prompt bool   // "$ cmd" lines followed by their output
}

// docBlocks reads the fenced blocks of the file, each as a script: full
// comment lines kept (bash ignores them), indentation of list items
// removed.
func docBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks []docBlock
		cur    *docBlock
		indent string
		lines  []string
	)
	fence := regexp.MustCompile("^( *)```([a-z]*)$")
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		if m := fence.FindStringSubmatch(l); m != nil {
			if cur == nil {
				cur, indent, lines = &docBlock{line: n, lang: m[2]}, m[1], nil
				continue
			}
			if m[1] == indent && m[2] == "" {
				cur.script, cur.first, cur.prompt = blockScript(lines)
				blocks = append(blocks, *cur)
				cur = nil
				continue
			}
		}
		if cur != nil {
			lines = append(lines, strings.TrimPrefix(l, indent))
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: unterminated fence", path, cur.line)
	}
	return blocks
}

func blockScript(lines []string) (script, first string, prompt bool) {
	for _, l := range lines {
		if strings.HasPrefix(l, "$ ") {
			prompt = true
		}
	}
	var out []string
	for _, l := range lines {
		if prompt {
			if !strings.HasPrefix(l, "$ ") {
				continue
			}
			l = strings.TrimPrefix(l, "$ ")
		}
		out = append(out, l)
		if t := strings.TrimSpace(l); first == "" && t != "" && !strings.HasPrefix(t, "#") {
			first = t
		}
	}
	return strings.Join(out, "\n") + "\n", first, prompt
}

// docRule says how the blocks whose first command matches are run.
type docRule struct {
	first string // a regexp on the block's first command
	skip  string // why it is not run here; empty: run it
	where string // "scratch": a node namespace of its own; "": worker-1's, the operator's shell
	// subst replaces the doc's placeholders with this cluster's values.
	subst []string
	// check judges the output (stdout and stderr) and the exit code.
	check func(out string, code int) error
	// retry runs the block again (3 times at most) while check fails: for
	// a block that changes nothing and may race with what it looks at.
	retry bool
}

func exit0(out string, code int) error {
	if code != 0 {
		return fmt.Errorf("exit %d", code)
	}
	return nil
}

func has(want ...string) func(string, int) error {
	return func(out string, code int) error {
		if code != 0 {
			return fmt.Errorf("exit %d", code)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("output lacks %q", w)
			}
		}
		return nil
	}
}

// The walk, in the order a new operator takes it with kustomize, then with
// Helm; each rule names one block by its first command.
var docRules = []docRule{
	// Before you install.
	{first: `^ip rule show pref 900`, where: "fresh", check: func(out string, code int) error {
		if strings.TrimSpace(out) != "" {
			return fmt.Errorf("a free node printed something")
		}
		return nil
	}},
	{first: `^ip route replace 10\.0\.0\.9/32`, where: "split", check: exit0},
	// After the uninstall: by hand, on a node whose agent never ran
	// cleanup (block 0's namespace). `ip -6 rule del` says "No such file
	// or directory" where there was no IPv6 rule, as on a real node.
	{first: `^ip rule del pref 900`, where: "split", check: func(out string, code int) error { return nil }},
	{first: `^kubectl get namespace kube-system`, check: exit0},
	{first: `^kubectl apply -f deploy/rbac.yaml`, subst: []string{"KUBERNETES_SERVICE_HOST=HOST", "KUBERNETES_SERVICE_HOST=" + apiAddr,
		"KUBERNETES_SERVICE_PORT=PORT", "KUBERNETES_SERVICE_PORT=" + apiPort, "--node-name=NODE", "--node-name=worker-1"},
		check: has("rule 900: not fwmark 0xe00/0xf00 lookup 900", "table 900: 10.0.0.9")},
	{first: `^SA=system:serviceaccount`, check: func(out string, code int) error {
		if got := strings.Fields(out); strings.Join(got, " ") != "yes yes yes no" {
			return fmt.Errorf("can-i answers %q, want yes yes yes no", got)
		}
		return nil
	}},
	{first: `^kubectl -n kube-system get configmap cilium-config`, skip: "needs a Node whose agent stands down, with its condition and Events (the agent's side: TestAgentFollowsEncryptNode here, and agent's TestNodeEncryptionOffOnOff)"},
	{first: `^NODE=worker-3$`, skip: "needs Cilium itself: cilium-agent publishes the key when it restarts (the agent's side: TestKernelK8sEncryptionFollowsCiliumNode)"},
	// Install.
	{first: `^\(cd deploy && kustomize edit set image marksplit=REGISTRY`, skip: "needs the kustomize binary and edits the checkout (the image and digest edits: deploy's TestChartMatchesKustomize)"},
	{first: `^kubectl apply -k deploy/$`, check: has("daemonset.apps/marksplit created", `daemon set "marksplit" successfully rolled out`)},
	{first: `^kubectl -n kube-system get pods -l app.kubernetes.io/name=marksplit -o wide`, check: has("marksplit-worker-1", "1/1", "Running")},
	{first: `^kubectl -n kube-system logs -l`, check: has("rule 900: not fwmark 0xe00/0xf00 lookup 900")},
	{first: `^kubectl debug node/NODE`, skip: "runs a debug pod on a real kubelet; the commands it leads to run here in the node's namespace"},
	{first: `^ip rule$`, check: has("900:\tnot from all fwmark 0xe00/0xf00 lookup 900", "10.0.0.9 via 10.0.0.1 dev enp7s0 table 900", "mtu 1355", "mark 0xe00")},
	{first: `^NODE=worker-1 PEER=10\.0\.0\.9`, check: has("ok: unmarked traffic to 10.0.0.9 uses table 900", "exit 0")},
	{first: `^kubectl -n kube-system port-forward`, check: has("marksplit_host_ip_frag_oks_total", "marksplit_host_ip_frag_creates_total")},
	{first: `^kubectl create clusterrolebinding marksplit-metrics-reader`, check: has("clusterrolebinding.rbac.authorization.k8s.io/marksplit-metrics-reader created")},
	{first: `^TOKEN=\$\(kubectl -n monitoring create token prometheus\)`, subst: []string{"NODE_IP", "10.0.0.5"}, check: has("# HELP ")},
	{first: `^NODE=worker-1$`, check: has("SplitInstalled", "Events:")},
	{first: `^kubectl get validatingadmissionpolicybinding -l app\.kubernetes\.io/name=marksplit`, check: has("marksplit-node-condition\n", "clusterrolebinding.rbac.authorization.k8s.io/marksplit-node-condition\n")},
	{first: `^kubectl get nodes -o json \| jq -r --arg t`, check: func(out string, code int) error {
		if code != 0 || strings.Contains(out, "MarkSplitReady") || strings.TrimSpace(out) != "" {
			return fmt.Errorf("exit %d, want 0 and no stale node: %q", code, out)
		}
		return nil
	}},
	{first: `^kubectl get node \$NODE -o jsonpath`, check: has(`"type":"MarkSplitReady"`, `"status":"True"`, `"reason":"SplitInPlace"`)},
	// Released images and upgrade.
	{first: `^IMAGE=ghcr\.io/marksplit/marksplit:v0\.2\.0`, skip: "verifies signatures in the registry, which this machine cannot reach"},
	{first: `^DIGEST=\$\(oras resolve`, skip: "reads the registry, which this machine cannot reach"},
	{first: `^make image VERSION=v0\.2\.0`, skip: "pushes to a registry, which this machine cannot reach (make image itself: test/image)"},
	{first: `^kubectl -n kube-system create configmap marksplit-uninstall +#`, check: has(`daemon set "marksplit" successfully rolled out`, `configmap "marksplit-uninstall" deleted`)},
	// Uninstall (kustomize): every step, then nothing left.
	{first: `^kubectl -n kube-system create configmap marksplit-uninstall$`, check: func(out string, code int) error {
		return docUninstalled(out)
	}},
	// Coexistence.
	{first: `^ss -f netlink -a -p`, where: "fresh", retry: true, subst: []string{" N ", " $MONITOR_PID "}, check: has("rtnl:ip/", "ip monitor")},
	// The Helm walk, on the cluster the uninstall left empty.
	{first: `^helm install marksplit charts/marksplit -n kube-system$`, retry: true, check: has("STATUS: deployed", `daemon set "marksplit" successfully rolled out`)},
	{first: `^helm upgrade marksplit charts/marksplit -n kube-system --reset-then-reuse-values \\`, check: has("Succeeded")},
	{first: `^helm upgrade marksplit charts/marksplit -n kube-system --reset-then-reuse-values$`, check: has(`daemon set "marksplit" successfully rolled out`)},
}

// docUninstalled checks the uninstall block's output: one switch line per
// pod, cleanup's note on every node, and step 5 finding nothing.
func docUninstalled(out string) error {
	switch {
	case !regexp.MustCompile(`(?m)^[1-9][0-9]*$`).MatchString(out):
		return fmt.Errorf("step 1 did not count the switched-off pod")
	case !strings.Contains(out, "it has nothing left that cleanup would remove"):
		return fmt.Errorf("step 2: no cleanup note")
	case !strings.Contains(out, `daemonset.apps "marksplit" deleted`) && !strings.Contains(out, `release "marksplit" uninstalled`):
		return fmt.Errorf("step 3 deleted no DaemonSet")
	}
	// Step 5: after the switch is deleted, nothing but "No resources found".
	_, step5, ok := strings.Cut(out, `configmap "marksplit-uninstall" deleted`)
	if !ok {
		return fmt.Errorf("step 4 did not delete the switch")
	}
	for _, l := range strings.Split(step5, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "No resources found") {
			return fmt.Errorf("step 5 found %q", l)
		}
	}
	return nil
}

// TestDocRulesCoverDoc runs without a cluster: every block of the doc is
// named by exactly one rule (or is data: yaml, ini, text), and every rule
// names a block.
func TestDocRulesCoverDoc(t *testing.T) {
	blocks := docBlocks(t, "../../docs/operations.md")
	if len(blocks) < 25 {
		t.Fatalf("%d blocks: the parser lost some", len(blocks))
	}
	used := make([]int, len(docRules))
	for _, b := range blocks {
		if b.lang != "" {
			continue // data: a config file, a manifest, log lines
		}
		var hit []int
		for i, r := range docRules {
			if regexp.MustCompile(r.first).MatchString(b.first) {
				hit = append(hit, i)
			}
		}
		if len(hit) != 1 {
			t.Errorf("docs/operations.md:%d: block %q is named by %d rules, want 1: give it a rule (run it, or say why it cannot run)", b.line, b.first, len(hit))
			continue
		}
		used[hit[0]]++
	}
	for i, n := range used {
		if n == 0 {
			t.Errorf("rule %q names no block of docs/operations.md", docRules[i].first)
		}
	}
}

// docEnv is the operator's shell: a working directory with a copy of the
// checkout's deploy/ and charts/, a kubeconfig for the API server, helm, and
// the stand-ins for what a kubelet does (kubectl exec, logs, port-forward).
type docEnv struct {
	dir   string // the working directory (the checkout's copy)
	bin   string // prepended to PATH
	state string // the shell variables one block leaves for the next
	node  *node  // worker-1's namespace: where the blocks run
	pods  string // the stand-in's pod registry: pods/NAME holds "NETNS SA-DIR"
	// monitorPID is an `ip monitor` in the fresh namespace of the ss block.
	monitorPID string
}

// kubectlShim is kubectl with a kubelet's part played by the test. The real
// kubectl does everything else.
const kubectlShim = `#!/bin/bash
real=/usr/bin/kubectl
args=("$@"); sub=""; i=0
while [ $i -lt ${#args[@]} ]; do
  case "${args[$i]}" in
    -n|--namespace|-c|--container) i=$((i+2)); continue;;
    -*) i=$((i+1)); continue;;
    *) sub=${args[$i]}; break;;
  esac
done
case "$sub" in
exec)
  pod=${args[$((i+1))]}; pod=${pod#pod/}
  read -r ns sa < "$STANDIN_PODS/$pod" || { echo "Error from server (NotFound): pods \"$pod\" not found" >&2; exit 1; }
  cmd=(); seen=""
  for a in "${args[@]}"; do if [ -n "$seen" ]; then cmd+=("${a/\/usr\/local\/bin\/marksplit/$MARKSPLIT_BIN}"); elif [ "$a" = "--" ]; then seen=1; fi; done
  exec ip netns exec "$ns" env -i PATH="$PATH" NODE_NAME="${pod#marksplit-}" POD_NAMESPACE=kube-system \
    KUBERNETES_SERVICE_HOST=$KSH KUBERNETES_SERVICE_PORT=$KSP MARKSPLIT_SERVICEACCOUNT_DIR="$sa" "${cmd[@]}";;
logs)
  for f in "$STANDIN_PODS"/*.log; do [ -e "$f" ] || continue; p=$(basename "$f" .log); sed "s|^|[pod/$p/marksplit] |" "$f"; done;;
delete)
  "$real" "$@"; rc=$?
  # A DaemonSet deleted: its pods stop (the garbage collector and the
  # kubelet, played by the test); wait as the doc's next line does.
  case " $* " in *" -k "*|*daemonset*) for _ in $(seq 300); do [ -e "$STANDIN_PODS/marksplit-worker-1" ] || break; sleep 0.1; done;; esac
  exit $rc;;
delete)
  "$real" "$@"; rc=$?
  # A DaemonSet deleted: its pods stop (the garbage collector and the
  # kubelet, played by the test); wait as the doc's next line does.
  case " $* " in *" -k "*|*daemonset*) for _ in $(seq 300); do [ -e "$STANDIN_PODS/marksplit-worker-1" ] || break; sleep 0.1; done;; esac
  exit $rc;;
port-forward)
  echo "Forwarding from 127.0.0.1:9184 -> 9184 (the test's stand-in: the shell already runs in the node's network namespace)";;
*) exec "$real" "$@";;
esac
`

func (c *cluster) newDocEnv(t *testing.T, n *node, helm string) *docEnv {
	t.Helper()
	e := &docEnv{dir: t.TempDir(), node: n}
	e.bin = filepath.Join(e.dir, ".bin")
	e.state = filepath.Join(e.dir, ".state")
	e.pods = filepath.Join(e.dir, ".pods")
	for _, d := range []string{e.bin, e.pods} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"deploy", "charts"} {
		if out, err := exec.Command("cp", "-r", filepath.Join(c.repo, d), e.dir).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v: %s", d, err, out)
		}
	}
	files := map[string]string{
		"kubectl": kubectlShim,
		// sudo, for root, runs the command with the assignments before it.
		"sudo": "#!/bin/sh\nexec env \"$@\"\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(e.bin, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(helm, filepath.Join(e.bin, "helm")); err != nil {
		t.Fatal(err)
	}
	// The release binary of the preview step.
	if out, err := exec.Command("cp", needAgent(t), filepath.Join(e.dir, "marksplit-linux-amd64")).CombinedOutput(); err != nil {
		t.Fatalf("cp marksplit: %v: %s", err, out)
	}
	ca, err := os.ReadFile(c.caFile())
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://%s:%s", certificate-authority-data: %q}
users:
- name: admin
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: admin}
current-context: test
`, apiAddr, apiPort, b64(ca), adminToken)
	if err := os.WriteFile(filepath.Join(e.dir, ".kubeconfig"), []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

// run runs script in ns (worker-1's unless given) as the operator's shell,
// with the variables the earlier blocks left.
func (e *docEnv) run(t *testing.T, ns, script string) (string, int) {
	t.Helper()
	if ns == "" {
		ns = e.node.ns
	}
	full := fmt.Sprintf("[ -f %[1]s ] && . %[1]s\ntrap 'rc=$?; set +e; declare -p NODE PEER ARGS POD SA TOKEN IMAGE 2>/dev/null > %[1]s; exit $rc' EXIT\n%[2]s", e.state, script)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "bash", "-c", full)
	cmd.Dir = e.dir
	cmd.Env = []string{
		"MONITOR_PID=" + e.monitorPID,
		"PATH=" + e.bin + ":/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + e.dir, "KUBECONFIG=" + filepath.Join(e.dir, ".kubeconfig"),
		"STANDIN_PODS=" + e.pods, "MARKSPLIT_BIN=" + needAgent(t), "KSH=" + apiAddr, "KSP=" + apiPort,
		"HELM_CACHE_HOME=" + filepath.Join(e.dir, ".helm"), "HELM_CONFIG_HOME=" + filepath.Join(e.dir, ".helm"), "HELM_DATA_HOME=" + filepath.Join(e.dir, ".helm"),
	}
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return string(out), code
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// standIn plays the kubelet and the controllers for the DaemonSet marksplit
// on worker-1 (the only node with a namespace) and for helm test's pods.
type standIn struct {
	c   *cluster
	e   *docEnv
	log func(string, ...any)

	mu    sync.Mutex
	agent *proc
	gen   float64 // the DaemonSet generation the agent runs
	ready bool
	ran   map[string]bool // helm test pods run
}

const standInNode = "worker-1"

func (s *standIn) run(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.stopAgent()
			return
		case <-tick.C:
		}
		if err := s.step(ctx); err != nil && ctx.Err() == nil {
			s.log("stand-in: %v", err)
		}
	}
}

func (s *standIn) stopAgent() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.agent != nil {
		s.agent.stop(5 * time.Second)
		s.agent = nil
	}
	os.Remove(filepath.Join(s.e.pods, "marksplit-"+standInNode))
}

const dsPath = "/apis/apps/v1/namespaces/kube-system/daemonsets/marksplit"

func (s *standIn) step(ctx context.Context) error {
	k := s.c.admin
	code, b, err := k.do(ctx, "GET", dsPath, nil)
	if err != nil {
		return err
	}
	pod := "marksplit-" + standInNode
	podPath := "/api/v1/namespaces/kube-system/pods/" + pod
	if code == http.StatusNotFound {
		if s.gen != 0 {
			s.stopAgent()
			k.do(ctx, "DELETE", podPath+"?gracePeriodSeconds=0", nil)
			s.gen, s.ready = 0, false
		}
		return s.testPods(ctx)
	}
	var ds struct {
		Metadata struct{ Generation float64 } `json:"metadata"`
		Spec     struct {
			Template struct {
				Metadata struct{ Labels map[string]string } `json:"metadata"`
				Spec     struct {
					Containers []struct {
						Image string   `json:"image"`
						Args  []string `json:"args"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(b, &ds); err != nil {
		return err
	}
	if ds.Metadata.Generation != s.gen {
		s.stopAgent()
		k.do(ctx, "DELETE", podPath+"?gracePeriodSeconds=0", nil)
		if err := poll(ctx, 100*time.Millisecond, func() error {
			code, _, err := k.do(ctx, "GET", podPath, nil)
			if err == nil && code != http.StatusNotFound {
				err = fmt.Errorf("pod %s still there", pod)
			}
			return err
		}); err != nil {
			return err
		}
		c := ds.Spec.Template.Spec.Containers[0]
		sa, err := s.podWithToken(ctx, pod, ds.Spec.Template.Metadata.Labels, c.Image, nil)
		if err != nil {
			return err
		}
		logPath := filepath.Join(s.e.pods, pod+".log")
		os.Remove(logPath)
		env := []string{"PATH=" + os.Getenv("PATH"), "KUBERNETES_SERVICE_HOST=" + apiAddr, "KUBERNETES_SERVICE_PORT=" + apiPort,
			"NODE_NAME=" + standInNode, "POD_NAMESPACE=kube-system", "MARKSPLIT_SERVICEACCOUNT_DIR=" + sa}
		p, err := startProc("marksplit", logPath, env, "ip", append([]string{"netns", "exec", s.e.node.ns, needAgentPath(s.c)}, c.Args...)...)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.agent = p
		s.mu.Unlock()
		if err := os.WriteFile(filepath.Join(s.e.pods, pod), []byte(s.e.node.ns+" "+sa+"\n"), 0o644); err != nil {
			return err
		}
		s.gen, s.ready = ds.Metadata.Generation, false
		s.log("stand-in: pod %s runs the DaemonSet's generation %v: %s", pod, ds.Metadata.Generation, strings.Join(c.Args, " "))
	}
	if !s.ready {
		out, _ := exec.Command("ip", "netns", "exec", s.e.node.ns, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:9184/readyz").Output()
		if string(out) == "200" {
			now := time.Now().UTC().Format(time.RFC3339)
			if _, err := k.mergePatch(ctx, podPath+"/status", map[string]any{"status": map[string]any{
				"phase": "Running", "hostIP": "10.0.0.5", "podIP": "10.0.0.5", "startTime": now,
				"conditions": []any{map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": now}},
				"containerStatuses": []any{map[string]any{"name": "marksplit", "ready": true, "started": true, "restartCount": 0,
					"image": ds.Spec.Template.Spec.Containers[0].Image, "imageID": "", "state": map[string]any{"running": map[string]any{"startedAt": now}}}},
			}}); err != nil {
				return err
			}
			if _, err := k.mergePatch(ctx, dsPath+"/status", map[string]any{"status": map[string]any{
				"observedGeneration": s.gen, "desiredNumberScheduled": 1, "currentNumberScheduled": 1, "updatedNumberScheduled": 1,
				"numberReady": 1, "numberAvailable": 1, "numberMisscheduled": 0,
			}}); err != nil {
				return err
			}
			s.ready = true
			s.log("stand-in: pod %s Ready; DaemonSet status: 1 of 1 updated and available", pod)
		}
	}
	return s.testPods(ctx)
}

// podWithToken creates a pod object of the agent's ServiceAccount on
// worker-1 and returns a service-account directory with a token bound to it.
func (s *standIn) podWithToken(ctx context.Context, name string, labels map[string]string, image string, ann map[string]string) (string, error) {
	k := s.c.admin
	b, err := k.must(ctx, http.StatusCreated, "POST", "/api/v1/namespaces/kube-system/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "labels": labels},
		"spec": map[string]any{"nodeName": standInNode, "serviceAccountName": "marksplit", "hostNetwork": true,
			"containers": []any{map[string]any{"name": "marksplit", "image": image}}},
	})
	if err != nil {
		return "", err
	}
	return s.bind(ctx, b, name)
}

func (s *standIn) bind(ctx context.Context, podJSON []byte, name string) (string, error) {
	var p struct {
		Metadata struct{ UID string } `json:"metadata"`
	}
	if err := json.Unmarshal(podJSON, &p); err != nil {
		return "", err
	}
	b, err := s.c.admin.must(ctx, http.StatusCreated, "POST", "/api/v1/namespaces/kube-system/serviceaccounts/marksplit/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"expirationSeconds": 3600,
			"boundObjectRef": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": p.Metadata.UID}},
	})
	if err != nil {
		return "", err
	}
	var tr struct {
		Status struct{ Token string } `json:"status"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		return "", err
	}
	sa, err := newPodDir(filepath.Join(s.e.pods, fmt.Sprintf("sa-%s-%d", name, s.c.next())), s.c.caFile(), "kube-system")
	if err != nil {
		return "", err
	}
	return sa.dir, sa.write(tr.Status.Token)
}

// testPods runs helm test's pods: their container's args in worker-1's
// namespace with the pod's environment and a token bound to it, then the
// phase the exit code says.
func (s *standIn) testPods(ctx context.Context) error {
	k := s.c.admin
	b, err := k.must(ctx, http.StatusOK, "GET", "/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io%2Fcomponent%3Dtest", nil)
	if err != nil {
		return err
	}
	var list struct {
		Items []struct {
			Metadata struct{ Name, UID string } `json:"metadata"`
			Spec     struct {
				NodeName   string `json:"nodeName"`
				Containers []struct {
					Name string   `json:"name"`
					Args []string `json:"args"`
				} `json:"containers"`
			} `json:"spec"`
			Status struct{ Phase string } `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return err
	}
	for _, p := range list.Items {
		if s.ran[p.Metadata.UID] || p.Spec.NodeName != standInNode {
			continue
		}
		s.ran[p.Metadata.UID] = true
		podJSON, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": p.Metadata.UID}})
		sa, err := s.bind(ctx, podJSON, p.Metadata.Name)
		if err != nil {
			return err
		}
		cmd := exec.Command("ip", append([]string{"netns", "exec", s.e.node.ns, needAgentPath(s.c)}, p.Spec.Containers[0].Args...)...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "KUBERNETES_SERVICE_HOST=" + apiAddr, "KUBERNETES_SERVICE_PORT=" + apiPort,
			"NODE_NAME=" + p.Spec.NodeName, "POD_NAMESPACE=kube-system", "MARKSPLIT_SERVICEACCOUNT_DIR=" + sa}
		out, err := cmd.CombinedOutput()
		phase, code := "Succeeded", 0
		if err != nil {
			phase, code = "Failed", 1
		}
		s.log("stand-in: helm test pod %s ran %q: %s, %s", p.Metadata.Name, p.Spec.Containers[0].Args, phase, out)
		now := time.Now().UTC().Format(time.RFC3339)
		if _, err := k.mergePatch(ctx, "/api/v1/namespaces/kube-system/pods/"+p.Metadata.Name+"/status", map[string]any{"status": map[string]any{
			"phase": phase, "startTime": now,
			"containerStatuses": []any{map[string]any{"name": p.Spec.Containers[0].Name, "ready": false, "restartCount": 0, "image": "", "imageID": "",
				"state": map[string]any{"terminated": map[string]any{"exitCode": code, "startedAt": now, "finishedAt": now, "reason": phase}}}},
		}}); err != nil {
			return err
		}
	}
	return nil
}

// mergePatch sends a JSON merge patch.
func (k *kube) mergePatch(ctx context.Context, path string, patch any) ([]byte, error) {
	code, b, err := k.doType(ctx, "PATCH", path, "application/merge-patch+json", patch)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("PATCH %s: %d %s", path, code, b)
	}
	return b, err
}

func needAgentPath(c *cluster) string { return c.agentBin }

// TestKernelK8sOperationsDoc walks docs/operations.md as a new operator
// would: with kustomize (the monitoring and node-condition components
// added to the kustomization, as their sections say), from the checks
// before installing to the full uninstall, then again with Helm, helm test
// included.
func TestKernelK8sOperationsDoc(t *testing.T) {
	c := need(t)
	needAgent(t)
	helm, err := helmBin()
	if err != nil {
		t.Fatalf("helm: %v", err)
	}
	ctx := ctxFor(t, 20*time.Minute)
	blocks := docBlocks(t, filepath.Join(c.repo, "docs", "operations.md"))

	// The cluster a new operator has: Nodes worker-1 (10.0.0.5, this
	// namespace), worker-2 (10.0.0.9, encrypting) and worker-3 (10.0.0.7,
	// opted out); the Prometheus operator's CRDs; a Prometheus
	// (monitoring/prometheus) of their own. No marksplit object: the
	// harness's RBAC is removed, and put back at the end.
	for _, o := range c.rbac {
		c.admin.delete(ctx, o)
	}
	t.Cleanup(func() { c.restoreManifests(t) })
	n := c.newNode(t)
	for _, nd := range []struct {
		name, ip string
		key      int
	}{{"worker-1", "10.0.0.5", 255}, {"worker-2", "10.0.0.9", 255}, {"worker-3", "10.0.0.7", 0}} {
		if err := c.admin.createNode(ctx, nd.name); err != nil {
			t.Fatal(err)
		}
		if err := c.admin.createPeerNode(ctx, nd.name, nd.ip); err != nil {
			t.Fatal(err)
		}
		if nd.key == 0 {
			if err := c.admin.setEncryptionKey(ctx, nd.name, 0); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			c.admin.do(context.Background(), "DELETE", "/api/v1/nodes/"+nd.name, nil)
			c.admin.do(context.Background(), "DELETE", ciliumNodes+"/"+nd.name, nil)
		})
	}
	e := c.newDocEnv(t, n, helm)
	setup := fmt.Sprintf(`set -e
kubectl apply --server-side -f %[1]s/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml -f %[1]s/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml
kubectl wait --for condition=established crd/podmonitors.monitoring.coreos.com crd/prometheusrules.monitoring.coreos.com
kubectl create namespace monitoring
kubectl -n monitoring create serviceaccount prometheus
# The Node condition and monitoring sections: add the components.
printf 'components:\n  - monitoring\n  - node-condition\n' >> deploy/kustomization.yaml
`, promOperatorDir(t))
	if out, code := e.run(t, "", setup); code != 0 {
		t.Fatalf("setup: exit %d:\n%s", code, out)
	}
	t.Cleanup(func() {
		e.run(t, "", "kubectl delete namespace monitoring --wait=false; kubectl delete crd podmonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com")
	})

	s := &standIn{c: c, e: e, log: t.Logf, ran: map[string]bool{}}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.run(sctx) }()
	t.Cleanup(func() { stop(); <-done })

	var split *node // block 0's namespace, for the manual cleanup
	var deferred []docBlock
	runBlock := func(b docBlock) {
		r := ruleFor(b)
		if r == nil {
			t.Errorf("docs/operations.md:%d: no rule for %q", b.line, b.first)
			return
		}
		if r.skip != "" {
			t.Logf("docs/operations.md:%d: not run: %s: %s", b.line, r.skip, b.first)
			return
		}
		script := b.script
		for i := 0; i+1 < len(r.subst); i += 2 {
			script = strings.ReplaceAll(script, r.subst[i], r.subst[i+1])
		}
		ns := ""
		switch r.where {
		case "fresh":
			ns = c.newNode(t).ns
		case "split":
			if split == nil {
				split = c.newNode(t)
			}
			ns = split.ns
		}
		if strings.HasPrefix(b.first, "ss ") {
			mon := exec.Command("ip", "netns", "exec", ns, "ip", "monitor")
			if err := mon.Start(); err != nil {
				t.Fatal(err)
			}
			defer mon.Process.Kill()
			e.monitorPID = fmt.Sprint(mon.Process.Pid)
		}
		var out string
		var code int
		err := func() error {
			var err error
			for try := 0; try < 3; try++ {
				out, code = e.run(t, ns, script)
				if err = r.check(out, code); err == nil || !r.retry {
					return err
				}
				if strings.HasPrefix(b.first, "helm install") && !strings.Contains(out, "cluster unreachable") {
					return err // only a failed reachability check left nothing to undo
				}
			}
			return err
		}()
		t.Logf("docs/operations.md:%d: ran %q: exit %d\n%s", b.line, b.first, code, out)
		if err != nil {
			t.Errorf("docs/operations.md:%d: %s: %v", b.line, b.first, err)
		}
		if strings.HasPrefix(b.first, "ip route replace") {
			// Host traffic to the peer takes table 900 at the tunnel MTU.
			// (The marked path keeps the main table's route, which this
			// node's seed topology has lowered: the agent's repair, not
			// these two commands, puts it back.)
			got, err := ipOut(split.ns, "route", "get", peer)
			if err != nil || !strings.Contains(got, "table 900") || routeMTU(got) != 1355 {
				t.Errorf("block 0 did not make the split it describes: ip route get %s: %q %v", peer, got, err)
			}
		}
		if strings.HasPrefix(b.first, "ip rule del pref 900") {
			if err := split.splitOff(); err != nil {
				t.Errorf("the manual cleanup left: %v", err)
			}
		}
	}
	for _, b := range blocks {
		if b.lang != "" {
			continue
		}
		if strings.HasPrefix(b.first, "helm ") {
			deferred = append(deferred, b)
			continue
		}
		runBlock(b)
	}
	// The kustomize walk's uninstall left nothing: no object, no split.
	for _, p := range []string{dsPath, "/apis/rbac.authorization.k8s.io/v1/clusterroles/marksplit",
		"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/marksplit-node-condition",
		"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/marksplit-metrics-reader",
		"/apis/monitoring.coreos.com/v1/namespaces/kube-system/podmonitors/marksplit",
		"/api/v1/namespaces/kube-system/configmaps/marksplit-uninstall"} {
		if code, _, err := c.admin.do(ctx, "GET", p, nil); err != nil || code != http.StatusNotFound {
			t.Errorf("after the uninstall: GET %s: %d %v, want 404", p, code, err)
		}
	}
	if err := n.splitOff(); err != nil {
		t.Errorf("after the uninstall, worker-1: %v", err)
	}
	// Step 4 removed the Node condition the agent had set: no agent is
	// left to keep it, and a NodeReadinessRule would read it.
	if b, err := c.admin.must(ctx, http.StatusOK, "GET", "/api/v1/nodes/"+standInNode, nil); err != nil {
		t.Errorf("after the uninstall: %v", err)
	} else if strings.Contains(string(b), `"type":"MarkSplitReady"`) {
		t.Errorf("after the uninstall, Node %s still has the condition MarkSplitReady", standInNode)
	}
	// The Helm walk.
	for _, b := range deferred {
		runBlock(b)
	}
	// The Helm walk's uninstall: the doc's block, with helm uninstall in
	// step 3 (its kustomize line left out), after helm test made its pod.
	if code, _, err := c.admin.do(ctx, "GET", "/api/v1/namespaces/kube-system/pods/marksplit-test-verify", nil); err != nil || code != http.StatusOK {
		t.Errorf("before the Helm uninstall: helm test's pod: %d %v, want it there", code, err)
	}
	for _, b := range blocks {
		if b.first != "kubectl -n kube-system create configmap marksplit-uninstall" {
			continue
		}
		script := strings.Replace(b.script, "kubectl delete -k deploy/ --ignore-not-found", "true", 1)
		out, code := e.run(t, "", script)
		t.Logf("docs/operations.md:%d: ran the uninstall after the Helm install: exit %d\n%s", b.line, code, out)
		if err := docUninstalled(out); err != nil {
			t.Errorf("docs/operations.md:%d: the uninstall after the Helm install: %v", b.line, err)
		}
	}
	for _, p := range []string{dsPath, "/api/v1/namespaces/kube-system/pods/marksplit-test-verify"} {
		if code, _, err := c.admin.do(ctx, "GET", p, nil); err != nil || code != http.StatusNotFound {
			t.Errorf("after the Helm uninstall: GET %s: %d %v, want 404", p, code, err)
		}
	}
	if err := n.splitOff(); err != nil {
		t.Errorf("after the Helm uninstall, worker-1: %v", err)
	}
}

func ruleFor(b docBlock) *docRule {
	for i, r := range docRules {
		if regexp.MustCompile(r.first).MatchString(b.first) {
			return &docRules[i]
		}
	}
	return nil
}

// promOperatorDir is the Prometheus operator's module in the module cache
// (the version deploy's TestMonitoringAgainstCRDs checks against).
func promOperatorDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/prometheus-operator/prometheus-operator@v0.85.0").Output()
	if err != nil {
		t.Fatalf("go mod download: %v", err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download: %v %s", err, out)
	}
	return m.Dir
}
