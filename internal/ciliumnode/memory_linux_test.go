//go:build linux

package ciliumnode

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/apitest"
)

// The DaemonSet's memory limit: whatever the API sends, the agent stays below it.
const memoryLimit = 128 << 20

const (
	memChildEnv  = "MARKSPLIT_MEMORY_CHILD" // the scenario the child runs
	memServerEnv = "MARKSPLIT_MEMORY_SERVER"
	memDirEnv    = "MARKSPLIT_MEMORY_DIR"
)

// TestHostileMemory (issue 22, "memory is a contract"): a process that runs a PeerSource
// against a hostile API server peaks (VmHWM) below the DaemonSet's 128 MiB: an endless
// list, a node with 90,000 InternalIPs, a page claiming 1,048,575 more items. The server
// runs in this process, the PeerSource in a child (this test binary run again), so that
// the child's peak is the reader's alone. Without the race detector, which multiplies
// memory: go test -run TestHostileMemory ./internal/ciliumnode
func TestHostileMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector multiplies memory; run without -race: go test -run TestHostileMemory ./internal/ciliumnode")
	}
	if testing.Short() {
		t.Skip("starts a child process per scenario (-short)")
	}
	for _, sc := range []struct {
		name  string
		setup func(t *testing.T, api *apitest.Server)
	}{
		{"endless-list", func(t *testing.T, api *apitest.Server) {
			// Pages of 500 realistic CiliumNodes, each page with a new continue token.
			for i := range 600 {
				api.MustPut(t, apiNode(fmt.Sprintf("worker-%03d", i), 255, fmt.Sprintf("10.0.%d.%d", i>>8, i&0xff)))
			}
			api.SetEndlessList(true)
		}},
		{"90000-addresses", func(t *testing.T, api *apitest.Server) {
			ips := make([]string, 90000)
			for i := range ips {
				ips[i] = fmt.Sprintf("10.%d.%d.%d", 1+i>>16, i>>8&0xff, i&0xff)
			}
			api.MustPut(t, apiNode("worker-1", 255, "10.0.0.5"), apiNode("worker-2", 255, ips...))
		}},
		{"remaining-item-count", func(t *testing.T, api *apitest.Server) {
			item := `{"metadata":{"name":"worker-%d","resourceVersion":"5"},"spec":{"encryption":{"key":255},"addresses":[{"type":"InternalIP","ip":"10.0.0.%d"}]}}`
			page := `{"apiVersion":"cilium.io/v2","kind":"CiliumNodeList","metadata":{"resourceVersion":"5"%s,"remainingItemCount":1048575},"items":[%s]}`
			api.Inject(apitest.KindList,
				apitest.Fault{Body: fmt.Sprintf(page, `,"continue":"next"`, fmt.Sprintf(item, 1, 1))},
				apitest.Fault{Body: fmt.Sprintf(page, "", fmt.Sprintf(item, 2, 2))})
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			api := apitest.New(t, apitest.Options{})
			dir := t.TempDir()
			if err := api.WriteServiceAccount(dir); err != nil {
				t.Fatal(err)
			}
			sc.setup(t, api)
			cmd := exec.Command(os.Args[0], "-test.run=^TestHostileMemoryChild$", "-test.v")
			cmd.Env = append(os.Environ(), memChildEnv+"="+sc.name, memServerEnv+"="+api.URL(), memDirEnv+"="+dir)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			hwm, ok := parseHWM(string(out))
			if !ok {
				t.Fatalf("child printed no VmHWM:\n%s", out)
			}
			t.Logf("%s: peak RSS (VmHWM) %.1f MiB", sc.name, float64(hwm)/(1<<20))
			if hwm >= memoryLimit {
				t.Errorf("%s: peak RSS %d bytes, want below %d (128 MiB)\n%s", sc.name, hwm, memoryLimit, out)
			}
		})
	}
}

// TestHostileMemoryChild is TestHostileMemory's child: it runs a PeerSource against the
// server until the scenario's end (the first report; for the endless list, three failed
// lists), then prints its VmHWM.
func TestHostileMemoryChild(t *testing.T) {
	scenario := os.Getenv(memChildEnv)
	if scenario == "" {
		t.Skip("run by TestHostileMemory")
	}
	dir := os.Getenv(memDirEnv)
	var failed atomic.Int32
	logger := slog.New(&countHandler{n: &failed, match: "ciliumnode: list CiliumNodes"})
	src, err := NewPeers(Config{Server: os.Getenv(memServerEnv), TokenFile: filepath.Join(dir, "token"),
		CAFile: filepath.Join(dir, "ca.crt"), Logger: logger, Backoff: backoff.NewConstantBackOff(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reported := make(chan Peers, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Run(ctx, func(ps Peers) {
			select {
			case reported <- ps:
			default:
			}
		})
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case ps := <-reported:
			if scenario != "endless-list" {
				t.Logf("reported %v", ps)
				break wait
			}
		case <-tick.C:
			if failed.Load() >= 3 {
				break wait
			}
		case <-ctx.Done():
			t.Logf("deadline: %+v", src.Stats())
			break wait
		}
	}
	cancel()
	<-done
	t.Logf("stats: %+v", src.Stats())
	hwm, err := readHWM()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("VmHWM: %d bytes\n", hwm)
}

// countHandler counts the log records whose message starts with match and says a bound
// was hit ("more than").
type countHandler struct {
	n     *atomic.Int32
	match string
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.match) && strings.Contains(r.Message, "more than") {
		h.n.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

// readHWM returns this process's peak resident set size, VmHWM in /proc/self/status.
func readHWM() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

// parseHWM finds the child's "VmHWM: N bytes" line.
func parseHWM(out string) (int64, bool) {
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "VmHWM: "); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(v, " bytes"), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
