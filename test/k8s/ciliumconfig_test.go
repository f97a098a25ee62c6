package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// ciliumConfigs is the collection of Cilium's cilium-config, which the agent reads for
// encrypt-node with --encryption=auto (deploy/rbac.yaml's Role marksplit-cilium-config).
const ciliumConfigs = "/api/v1/namespaces/kube-system/configmaps"

// createCiliumConfig creates kube-system/cilium-config as Cilium's Helm chart does,
// with encrypt-node v.
func (k *kube) createCiliumConfig(ctx context.Context, v string) error {
	_, err := k.must(ctx, http.StatusCreated, "POST", ciliumConfigs, map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata":   map[string]any{"name": "cilium-config", "namespace": "kube-system"},
		"data":       map[string]string{"enable-wireguard": "true", "encrypt-node": v, "routing-mode": "native"},
	})
	if err != nil {
		return fmt.Errorf("create kube-system/cilium-config: %w", err)
	}
	return nil
}

// setEncryptNode merge-patches cilium-config's encrypt-node to v.
func (k *kube) setEncryptNode(ctx context.Context, v string) error {
	patch, _ := json.Marshal(map[string]any{"data": map[string]any{"encrypt-node": v}})
	code, b, err := k.doType(ctx, "PATCH", ciliumConfigs+"/cilium-config", "application/merge-patch+json", patch)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("PATCH cilium-config: status %d: %s", code, bytes.TrimSpace(b))
	}
	return err
}

// On the real API server, with deploy/rbac.yaml as shipped: a node whose CiliumNode has
// key 255 (every WireGuard node has) while cilium-config says encrypt-node "false" gets
// no split, and the agent says why; encrypt-node turned on installs the split, without a
// restart; turned off removes it.
func TestAgentFollowsEncryptNode(t *testing.T) {
	c := need(t)
	ctx := ctxFor(t, 5*time.Minute)
	if err := c.admin.setEncryptNode(ctx, "false"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.admin.setEncryptNode(context.Background(), "true"); err != nil {
			t.Errorf("put encrypt-node back: %v", err)
		}
	})
	n := c.newNode(t)
	name := c.nodeName()
	if err := c.admin.createCiliumNode(ctx, name, 255); err != nil {
		t.Fatal(err)
	}
	a := c.startAgent(t, n, name)
	eventually(t, watchDeadline, "the stand-down said", func() error {
		return firstErr(a.alive(), a.logged("node encryption is off; standing down"))
	})
	if err := n.splitOff(); err != nil {
		t.Errorf("with encrypt-node false: %v", err)
	}

	if err := c.admin.setEncryptNode(ctx, "true"); err != nil {
		t.Fatal(err)
	}
	eventually(t, watchDeadline, "split after encrypt-node true", func() error {
		return firstErr(a.alive(), n.splitOn())
	})

	if err := c.admin.setEncryptNode(ctx, "false"); err != nil {
		t.Fatal(err)
	}
	eventually(t, watchDeadline, "split removed after encrypt-node false", func() error {
		return firstErr(a.alive(), n.splitOff())
	})
}
