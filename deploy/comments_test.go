package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/netwatch/reconcile"
)

// TestTableCommentSaysRefused: the --table comment of daemonset.yaml names
// exactly the tables the agent refuses (reconcile.OwnTable), in its
// "N and A-B are refused" form.
func TestTableCommentSaysRefused(t *testing.T) {
	data, err := os.ReadFile("daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "#   --table ")
	if !ok {
		t.Fatal("daemonset.yaml: no --table comment")
	}
	comment, _, _ := strings.Cut(after, "#   --priority")
	comment = strings.Join(strings.Fields(strings.ReplaceAll(comment, "#", " ")), " ")
	m := regexp.MustCompile(`; ([0-9 ,and-]+) are refused`).FindStringSubmatch(comment)
	if m == nil {
		t.Fatalf("daemonset.yaml: the --table comment says no `… are refused`: %q", comment)
	}
	var said []uint64
	for _, part := range regexp.MustCompile(`,| and `).Split(m[1], -1) {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err1 := strconv.ParseUint(lo, 10, 32)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.ParseUint(hi, 10, 32)
		}
		if err1 != nil || err2 != nil {
			t.Fatalf("daemonset.yaml: --table comment: %q is no table or range", part)
		}
		for n := a; n <= b; n++ {
			said = append(said, n)
		}
	}
	var refused []uint64
	for n := range uint64(1000) {
		var v reconcile.OwnTable
		if v.Set(strconv.FormatUint(n, 10)) != nil {
			refused = append(refused, n)
		}
	}
	if !slices.Equal(said, refused) {
		t.Errorf("daemonset.yaml's --table comment says %v are refused; the agent refuses %v (below 1000)", said, refused)
	}
}

// TestMonitoringReadmeScheme: monitoring/README.md names the PodMonitor's
// scheme as the manifest spells it (the CRD takes only http or https).
func TestMonitoringReadmeScheme(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("monitoring", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	pm, err := os.ReadFile(filepath.Join("monitoring", "podmonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?m)^\s*scheme: (\S+)`).FindSubmatch(pm)
	if want == nil {
		t.Fatal("podmonitor.yaml: no scheme")
	}
	for _, got := range regexp.MustCompile("`scheme: ([^`]+)`").FindAllSubmatch(readme, -1) {
		if string(got[1]) != string(want[1]) {
			t.Errorf("monitoring/README.md says `scheme: %s`; podmonitor.yaml says %s", got[1], want[1])
		}
	}
}
