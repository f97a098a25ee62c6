//go:build linux

package k8s

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// testUserAgent marks the harness's own requests, so the audit log tells
// them from the agent's.
const testUserAgent = "marksplit-test-k8s"

// kube is a minimal client of the API server for the harness: the test
// process reaches it through sockets opened in the apihost namespace.
type kube struct {
	base   string
	ns     string
	caFile string
	token  string
}

func newKube(ns, caFile, token string) *kube {
	return &kube{base: "https://" + apiAddr + ":" + apiPort, ns: ns, caFile: caFile, token: token}
}

// withToken returns a client of the same server that authenticates with token.
func (k *kube) withToken(token string) *kube {
	c := *k
	c.token = token
	return &c
}

func (k *kube) client() (*http.Client, error) {
	// The CA is read on every call: the API server writes it at its first
	// start, after this client is made.
	pemCA, err := os.ReadFile(k.caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemCA) {
		return nil, fmt.Errorf("%s: no certificate", k.caFile)
	}
	return httpClientIn(k.ns, &tls.Config{RootCAs: pool}), nil
}

// do sends a request with a JSON body (or body as is when it is []byte) and
// returns the status code and the response body.
func (k *kube) do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	return k.doType(ctx, method, path, "application/json", body)
}

func (k *kube) doType(ctx context.Context, method, path, contentType string, body any) (int, []byte, error) {
	hc, err := k.client()
	if err != nil {
		return 0, nil, err
	}
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.base+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("User-Agent", testUserAgent)
	req.Header.Set("Accept", "application/json")
	if r != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if k.token != "" {
		req.Header.Set("Authorization", "Bearer "+k.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// must is do that fails unless the status is want.
func (k *kube) must(ctx context.Context, want int, method, path string, body any) ([]byte, error) {
	code, b, err := k.do(ctx, method, path, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if code != want {
		return nil, fmt.Errorf("%s %s: status %d, want %d: %s", method, path, code, want, bytes.TrimSpace(b))
	}
	return b, nil
}

// object is one Kubernetes object of a manifest, as JSON.
type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	raw []byte
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// parseManifests splits a multi-document YAML manifest into its objects the
// way kubectl does: documents separated by "---" lines, each converted to
// JSON; empty documents are skipped.
func parseManifests(b []byte) ([]object, error) {
	var objs []object
	for i, doc := range docSeparator.Split(string(b), -1) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if s := string(bytes.TrimSpace(j)); s == "null" || s == "{}" {
			continue
		}
		var o object
		if err := json.Unmarshal(j, &o); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			return nil, fmt.Errorf("document %d: apiVersion, kind and metadata.name are required", i+1)
		}
		o.raw = j
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		return nil, errors.New("no objects")
	}
	return objs, nil
}

// serviceAccountOf returns the one ServiceAccount of objs.
func serviceAccountOf(objs []object) (object, error) {
	var sas []object
	for _, o := range objs {
		if o.Kind == "ServiceAccount" {
			sas = append(sas, o)
		}
	}
	if len(sas) != 1 {
		return object{}, fmt.Errorf("want exactly one ServiceAccount, found %d", len(sas))
	}
	return sas[0], nil
}

// collectionPath is the REST path objects like o are created at. Only the
// kinds an RBAC manifest holds are known.
func collectionPath(o object) (string, error) {
	ns := o.Metadata.Namespace
	if ns == "" {
		ns = "default"
	}
	switch o.APIVersion + " " + o.Kind {
	case "v1 ServiceAccount":
		return "/api/v1/namespaces/" + ns + "/serviceaccounts", nil
	case "v1 Namespace":
		return "/api/v1/namespaces", nil
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return "/apis/rbac.authorization.k8s.io/v1/clusterroles", nil
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", nil
	case "rbac.authorization.k8s.io/v1 Role":
		return "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns + "/roles", nil
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return "/apis/rbac.authorization.k8s.io/v1/namespaces/" + ns + "/rolebindings", nil
	case "apps/v1 DaemonSet":
		return "/apis/apps/v1/namespaces/" + ns + "/daemonsets", nil
	case "v1 Pod":
		return "/api/v1/namespaces/" + ns + "/pods", nil
	case "v1 Node":
		return "/api/v1/nodes", nil
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
		return "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", nil
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
		return "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", nil
	}
	return "", fmt.Errorf("%s %s/%s: kind not supported by the harness", o.APIVersion, o.Kind, o.Metadata.Name)
}

func objectPath(o object) (string, error) {
	p, err := collectionPath(o)
	return p + "/" + o.Metadata.Name, err
}

// create POSTs o exactly as the manifest has it.
func (k *kube) create(ctx context.Context, o object) error {
	p, err := collectionPath(o)
	if err != nil {
		return err
	}
	_, err = k.must(ctx, http.StatusCreated, "POST", p, o.raw)
	return err
}

// delete deletes o and waits until it is gone.
func (k *kube) delete(ctx context.Context, o object) error {
	p, err := objectPath(o)
	if err != nil {
		return err
	}
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

// createCRD installs the CiliumNode CustomResourceDefinition and waits until
// CiliumNodes are served.
func (k *kube) createCRD(ctx context.Context) error {
	crd := map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "ciliumnodes.cilium.io"},
		"spec": map[string]any{
			"group": "cilium.io",
			"scope": "Cluster",
			"names": map[string]any{
				"plural": "ciliumnodes", "singular": "ciliumnode",
				"kind": "CiliumNode", "listKind": "CiliumNodeList", "shortNames": []string{"cn"},
			},
			"versions": []any{map[string]any{
				"name": "v2", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object", "x-kubernetes-preserve-unknown-fields": true,
				}},
			}},
		},
	}
	if _, err := k.must(ctx, http.StatusCreated, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd); err != nil {
		return err
	}
	return poll(ctx, 100*time.Millisecond, func() error {
		_, err := k.must(ctx, http.StatusOK, "GET", ciliumNodes, nil)
		return err
	})
}

const ciliumNodes = "/apis/cilium.io/v2/ciliumnodes"

// createCiliumNode creates a CiliumNode as Cilium registers one: with the
// WireGuard key annotation (present on every node, it proves nothing) and
// spec.encryption.key when key is not zero.
func (k *kube) createCiliumNode(ctx context.Context, name string, key int) error {
	spec := map[string]any{"encryption": map[string]any{}}
	if key != 0 {
		spec["encryption"] = map[string]any{"key": key}
	}
	_, err := k.must(ctx, http.StatusCreated, "POST", ciliumNodes, map[string]any{
		"apiVersion": "cilium.io/v2",
		"kind":       "CiliumNode",
		"metadata": map[string]any{
			"name":        name,
			"annotations": map[string]string{"network.cilium.io/wg-pub-key": "kR7uTkqNVh8YB0bbdBCh1T5c4HXXxKOHTG0pkGWiT2c="},
		},
		"spec": spec,
	})
	return err
}

// setEncryptionKey merge-patches spec.encryption.key; 0 removes the key, as
// on a node opted out of node encryption.
func (k *kube) setEncryptionKey(ctx context.Context, name string, key int) error {
	var v any
	if key != 0 {
		v = key
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"encryption": map[string]any{"key": v}}})
	code, b, err := k.doType(ctx, "PATCH", ciliumNodes+"/"+name, "application/merge-patch+json", patch)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("PATCH ciliumnode %s: status %d: %s", name, code, bytes.TrimSpace(b))
	}
	return err
}

// token issues a token for the deploy ServiceAccount with a TokenRequest, as
// the kubelet does for a pod.
func (c *cluster) token(ctx context.Context) (string, error) {
	p, err := objectPath(c.sa)
	if err != nil {
		return "", err
	}
	b, err := c.admin.must(ctx, http.StatusCreated, "POST", p+"/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1",
		"kind":       "TokenRequest",
		"spec":       map[string]any{"expirationSeconds": 3600},
	})
	if err != nil {
		return "", fmt.Errorf("TokenRequest: %w", err)
	}
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	if err := json.Unmarshal(b, &tr); err != nil || tr.Status.Token == "" {
		return "", fmt.Errorf("TokenRequest: no token in %s", b)
	}
	return tr.Status.Token, nil
}

// saUser is the user name the deploy ServiceAccount authenticates as.
func (c *cluster) saUser() string {
	return "system:serviceaccount:" + c.sa.Metadata.Namespace + ":" + c.sa.Metadata.Name
}

// podDir is a service-account volume laid out the way the kubelet writes it:
// token, ca.crt and namespace are symlinks through ..data to a timestamped
// directory, and an update swaps ..data atomically.
type podDir struct {
	dir string
	ca  []byte
	ns  string
	gen int
}

func newPodDir(dir, caFile, namespace string) (*podDir, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for _, name := range []string{"token", "ca.crt", "namespace"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			return nil, err
		}
	}
	return &podDir{dir: dir, ca: ca, ns: namespace}, nil
}

// write publishes token (with the CA and namespace) atomically.
func (d *podDir) write(token string) error {
	d.gen++
	gen := fmt.Sprintf("..%s.%d", time.Now().UTC().Format("2006_01_02_15_04_05"), d.gen)
	if err := os.Mkdir(filepath.Join(d.dir, gen), 0o755); err != nil {
		return err
	}
	for name, b := range map[string][]byte{"token": []byte(token), "ca.crt": d.ca, "namespace": []byte(d.ns)} {
		if err := os.WriteFile(filepath.Join(d.dir, gen, name), b, 0o644); err != nil {
			return err
		}
	}
	old, _ := os.Readlink(filepath.Join(d.dir, "..data"))
	tmp := filepath.Join(d.dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(gen, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		return err
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(d.dir, old))
	}
	return nil
}

// auditEvent is the part of an audit.k8s.io/v1 Event the tests read.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	Verb       string `json:"verb"`
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource string `json:"resource"`
		Name     string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
}

func (e auditEvent) String() string {
	code := 0
	if e.ResponseStatus != nil {
		code = e.ResponseStatus.Code
	}
	return fmt.Sprintf("%s %s %s -> %d (%s)", e.Stage, e.Verb, e.RequestURI, code, e.UserAgent)
}

// agentRequests returns the audit events of requests made with the deploy
// service account's tokens, other than the harness's own.
func (c *cluster) agentRequests() ([]auditEvent, error) {
	f, err := os.Open(c.auditLog())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []auditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		if e.User.Username == c.saUser() && e.UserAgent != testUserAgent {
			evs = append(evs, e)
		}
	}
	return evs, sc.Err()
}

// about returns the events of evs about the CiliumNode node: by name, or by
// a metadata.name field selector.
func about(evs []auditEvent, node string) []auditEvent {
	var out []auditEvent
	for _, e := range evs {
		if e.ObjectRef == nil || e.ObjectRef.Resource != "ciliumnodes" {
			continue
		}
		if e.ObjectRef.Name == node ||
			strings.Contains(e.RequestURI, url.QueryEscape("metadata.name="+node)) ||
			strings.Contains(e.RequestURI, "metadata.name="+node) {
			out = append(out, e)
		}
	}
	return out
}

// distinct counts the requests of evs (a watch has two events).
func distinct(evs []auditEvent) int {
	seen := map[string]bool{}
	for _, e := range evs {
		seen[e.AuditID] = true
	}
	return len(seen)
}
