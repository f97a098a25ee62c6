//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/marksplit/marksplit/internal/apitest"
	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/kubeauth"
	"github.com/prometheus/client_golang/prometheus"
)

// metricsGolden lists, one a line, the metric names the agent's /metrics
// shows (a summary's or a histogram's series each under its own name). The
// deploy module's tests check the dashboard's and the alerts' queries
// against it; rewrite it with `go test -run TestMetricsGolden ./agent -update`.
var (
	metricsGolden = filepath.Join("testdata", "metrics.txt")
	update        = flag.Bool("update", false, "rewrite testdata/metrics.txt from the agent's registry")
)

// TestMetricsGolden gathers the agent's registry, built as runAgent builds
// it (with --peers=auto, after a converged pass and a list of CiliumNodes,
// so that the families shown only once there is something to show are
// there too), checks that every metric it describes was gathered, and
// compares the names with testdata/metrics.txt.
func TestMetricsGolden(t *testing.T) {
	_, h, srcs := peerSourceHarness(t,
		apitest.Node{Name: "node-self", InternalIPs: []string{"10.0.0.5"}, Key: 255},
		apitest.Node{Name: "peer-1", InternalIPs: []string{"10.0.0.9"}, Key: 255},
	)
	// As runAgent: the registry sees the API's request counters and the peers.
	m := newMetrics(h.w, peersConfig(), srcs.requests, snmpPath)
	m.addPeers(h.l, srcs.peers)
	m.addNodeEncryption(h.l, srcs.nodeEnc)
	m.addPathMTU(h.l)
	authz, err := kubeauth.New(kubeauth.Config{API: &kubeapi.Client{}}) // with --secure-metrics-addr
	must(t, err)
	m.addAuth(authz)
	m.addEvents(nil)
	m.addNodeCondition(nil)
	h.start()
	ctx, cancel := context.WithCancel(context.Background())
	var g group
	<-srcs.start(ctx, &g, h.l)
	t.Cleanup(func() { cancel(); g.wg.Wait() })
	h.waitPass("that splits the peer", applied(3))
	eventually(t, 5*time.Second, "an API request counted", func() error {
		if len(srcs.requests()) == 0 {
			return errors.New("no requests")
		}
		return nil
	})

	got, gathered := exposedNames(t, m.reg)
	described := describedNames(m.reg)
	if len(described) < len(gathered)/2 {
		t.Fatalf("%d metrics described, %d gathered: has the format of Desc.String changed?", len(described), len(gathered))
	}
	for _, d := range described {
		if !gathered[d] {
			t.Errorf("%s is described but not gathered: exercise the code path that shows it", d)
		}
	}
	if *update {
		must(t, os.MkdirAll(filepath.Dir(metricsGolden), 0o755))
		must(t, os.WriteFile(metricsGolden, []byte(strings.Join(got, "\n")+"\n"), 0o644))
		return
	}
	data, err := os.ReadFile(metricsGolden)
	must(t, err)
	want := strings.Fields(string(data))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s (-file +gathered), rewrite it with -update:\n%s", metricsGolden, diff)
	}
}

// exposedNames returns the sorted names of the series reg gathers, as the
// text exposition spells them, and the set of its families' names.
func exposedNames(t *testing.T, reg *prometheus.Registry) ([]string, map[string]bool) {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	var names []string
	families := map[string]bool{}
	for _, mf := range mfs {
		n := mf.GetName()
		families[n] = true
		switch mf.GetType().String() { // client_model's names; the module does not import it
		case "SUMMARY":
			names = append(names, n, n+"_sum", n+"_count")
		case "HISTOGRAM", "GAUGE_HISTOGRAM":
			names = append(names, n+"_bucket", n+"_sum", n+"_count")
		default:
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return slices.Compact(names), families
}

// fqNameRE takes the name out of a Desc's String: Desc has no getter.
var fqNameRE = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

// describedNames returns the names of the families reg's collectors describe.
func describedNames(reg *prometheus.Registry) []string {
	ch := make(chan *prometheus.Desc)
	go func() { reg.Describe(ch); close(ch) }()
	var names []string
	for d := range ch {
		if m := fqNameRE.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}
