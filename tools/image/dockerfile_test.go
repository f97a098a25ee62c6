package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct{ cmd, rest string }

func readDockerfile(t *testing.T) []instruction {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		cmd, rest, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(rest)})
		cur.Reset()
	}
	return out
}

// labelPair matches key="value" in a LABEL instruction.
var labelPair = regexp.MustCompile(`([A-Za-z0-9._-]+)="([^"]*)"`)

// TestDockerfileAgrees keeps deploy/Dockerfile's final stage in step with
// what this tool writes: an empty base, the binary at the same path, the
// same labels (with the build args standing for the flags), user and
// entrypoint; and its compile step with make release's.
func TestDockerfileAgrees(t *testing.T) {
	instrs := readDockerfile(t)
	last := 0
	for i, in := range instrs {
		if in.cmd == "FROM" {
			last = i
		}
	}
	final := instrs[last:]
	if base := strings.Fields(final[0].rest)[0]; base != "scratch" {
		t.Errorf("final stage FROM %s, want scratch (tools/image writes on an empty base)", base)
	}
	labels := map[string]string{}
	args := map[string]string{}
	var usr, entrypoint, dest string
	for _, in := range final[1:] {
		switch in.cmd {
		case "LABEL":
			for _, m := range labelPair.FindAllStringSubmatch(in.rest, -1) {
				labels[m[1]] = m[2]
			}
		case "ARG":
			k, v, _ := strings.Cut(in.rest, "=")
			args[k] = v
		case "USER":
			usr = in.rest
		case "ENTRYPOINT":
			entrypoint = in.rest
		case "COPY":
			f := strings.Fields(in.rest)
			dest = f[len(f)-1]
		case "ENV", "RUN", "ADD", "VOLUME", "WORKDIR", "CMD":
			t.Errorf("final stage has %s %s: the tool's image has no such thing", in.cmd, in.rest)
		}
	}
	m := meta{version: "${VERSION}", revision: "${REVISION}", source: "${SOURCE}"}
	if diff := cmp.Diff(m.labels(), labels); diff != "" {
		t.Errorf("final stage labels (-tools/image +Dockerfile):\n%s", diff)
	}
	if args["SOURCE"] != defaultSource {
		t.Errorf("ARG SOURCE=%s, want %s", args["SOURCE"], defaultSource)
	}
	if usr != user {
		t.Errorf("USER %q, want %q", usr, user)
	}
	if want := `["` + binaryPath + `"]`; entrypoint != want {
		t.Errorf("ENTRYPOINT %s, want %s", entrypoint, want)
	}
	if dest != binaryPath {
		t.Errorf("COPY to %s, want %s", dest, binaryPath)
	}

	// The same static binary: make release's flags are the Dockerfile's.
	var build string
	for _, in := range instrs[:last] {
		if in.cmd == "RUN" && strings.Contains(in.rest, "go build") {
			build = in.rest
		}
	}
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	ldflags := regexp.MustCompile(`(?m)^LDFLAGS\s*:?=\s*(.*)$`).FindSubmatch(mk)
	if ldflags == nil {
		t.Fatal("Makefile has no LDFLAGS line")
	}
	wantLD := strings.ReplaceAll(string(ldflags[1]), "$(VERSION)", "${VERSION}")
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "` + wantLD + `"`, "./agent"} {
		if !strings.Contains(build, want) {
			t.Errorf("Dockerfile's go build lacks %q (make release has it): %s", want, build)
		}
	}
}
