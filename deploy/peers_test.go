package deploy

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// The shipped DaemonSet needs no edit: the agent learns the peers from the
// cluster (--peers=auto), and nothing in the manifest is a placeholder.
func TestDaemonSetNeedsNoEdit(t *testing.T) {
	ds := loadDaemonSet(t)
	flags := parseArgs(t, ds.Spec.Template.Spec.Containers[0].Args)
	if got := flags["peers"]; !slices.Equal(got, []string{"auto"}) {
		t.Errorf("--peers = %q, want auto", got)
	}
	for _, f := range []string{"prefix", "underlay-link"} {
		if v, ok := flags[f]; ok {
			t.Errorf("--%s=%q: the agent refuses it beside --peers=auto, and it would be an edit to make", f, v)
		}
	}
	data, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(data), "\n") {
		if l := strings.ToLower(line); strings.Contains(l, "placeholder") || strings.Contains(l, "edit it") {
			t.Errorf("daemonset.yaml:%d: %q: the manifest must work as shipped", i+1, strings.TrimSpace(line))
		}
	}
}
