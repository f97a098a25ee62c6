package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var (
	binsOnce sync.Once
	bins     map[string]string // arch → a small static binary
	binsErr  error
)

// staticBinaries builds a tiny static program for amd64 and arm64, standing
// in for the agent (the tool does not care what the binary does).
func staticBinaries(t *testing.T) map[string]string {
	t.Helper()
	binsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "image-test-")
		if err != nil {
			binsErr = err
			return
		}
		src := filepath.Join(dir, "main.go")
		if err := os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644); err != nil {
			binsErr = err
			return
		}
		bins = map[string]string{}
		for _, arch := range []string{"amd64", "arm64"} {
			out := filepath.Join(dir, "hello-"+arch)
			cmd := exec.Command("go", "build", "-trimpath", "-o", out, src)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOWORK=off", "GOFLAGS=-buildvcs=false")
			if b, err := cmd.CombinedOutput(); err != nil {
				binsErr = err
				bins = nil
				t.Logf("%s", b)
				return
			}
			bins[arch] = out
		}
	})
	if binsErr != nil {
		t.Fatalf("build the stand-in binaries: %v", binsErr)
	}
	return bins
}

func testMeta() meta {
	return meta{
		version:  "v1.2.3",
		revision: "0123456789abcdef0123456789abcdef01234567",
		source:   defaultSource,
		created:  v1.Time{Time: time.Unix(1700000000, 0).UTC()},
	}
}

func both(t *testing.T) []platformBinary {
	b := staticBinaries(t)
	return []platformBinary{
		{os: "linux", arch: "amd64", path: b["amd64"]},
		{os: "linux", arch: "arm64", path: b["arm64"]},
	}
}

// build runs the whole tool and returns the archive's bytes.
func build(t *testing.T, m meta, pbs []platformBinary) []byte {
	t.Helper()
	idx, err := buildIndex(m, pbs)
	if err != nil {
		t.Fatal(err)
	}
	sboms, err := buildSBOMs(m, pbs)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "image.tar")
	if _, err := writeArchive(out, m, idx, sboms); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// eachEntry calls fn with each entry of the tar stream r and its content,
// after checking that the entry is root-owned and stamped created.
func eachEntry(t *testing.T, what string, r io.Reader, created time.Time, fn func(h *tar.Header, data []byte)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(created) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s entry %s: mtime %s uid %d gid %d, want %s 0 0", what, h.Name, h.ModTime, h.Uid, h.Gid, created)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		fn(h, data)
	}
}

// untar writes archive's entries under a new directory.
func untar(t *testing.T, archive []byte, created time.Time) string {
	t.Helper()
	dir := t.TempDir()
	eachEntry(t, "archive", bytes.NewReader(archive), created, func(h *tar.Header, data []byte) {
		p := filepath.Join(dir, h.Name)
		var err error
		if h.Typeflag == tar.TypeDir {
			err = os.MkdirAll(p, 0o755)
		} else {
			err = os.WriteFile(p, data, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	return dir
}

func TestArchive(t *testing.T) {
	m := testMeta()
	archive := build(t, m, both(t))

	t.Run("reproducible", func(t *testing.T) {
		if again := build(t, m, both(t)); !bytes.Equal(archive, again) {
			t.Error("two builds of the same binaries and flags differ")
		}
	})

	dir := untar(t, archive, m.created.Time)
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	topManifest, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	// The image index, then one SBOM referrer per platform (sbom_test.go).
	if len(topManifest.Manifests) != 3 {
		t.Fatalf("index.json has %d entries, want 3 (the image index and two SBOMs)", len(topManifest.Manifests))
	}
	for _, d := range topManifest.Manifests[1:] {
		if d.ArtifactType != spdxMediaType || d.Annotations["org.opencontainers.image.ref.name"] != "" {
			t.Errorf("index.json entry %s: artifactType %q, annotations %v; want an untagged %s", d.Digest, d.ArtifactType, d.Annotations, spdxMediaType)
		}
	}
	if got := topManifest.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != m.version {
		t.Errorf("index.json ref.name = %q, want %q", got, m.version)
	}
	idx, err := top.ImageIndex(topManifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	// Every digest, size and media type agrees with the content.
	if err := validate.Index(idx); err != nil {
		t.Fatalf("validate: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range im.Manifests {
		platforms = append(platforms, d.Platform.String())
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		checkImage(t, m, d.Platform.Architecture, img)
	}
	if diff := cmp.Diff([]string{"linux/amd64", "linux/arm64"}, platforms); diff != "" {
		t.Errorf("platforms (-want +got):\n%s", diff)
	}
}

func checkImage(t *testing.T, m meta, arch string, img v1.Image) {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != arch {
		t.Errorf("%s: config says %s/%s", arch, cfg.OS, cfg.Architecture)
	}
	if !cfg.Created.Time.Equal(m.created.Time) {
		t.Errorf("%s: created %s, want %s", arch, cfg.Created.Time, m.created.Time)
	}
	for _, h := range cfg.History {
		if !h.Created.Time.Equal(m.created.Time) {
			t.Errorf("%s: history created %s, want %s", arch, h.Created.Time, m.created.Time)
		}
	}
	want := v1.Config{
		Entrypoint: []string{"/usr/local/bin/marksplit"},
		User:       "0:0",
		Env:        []string{defaultPath},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "marksplit",
			"org.opencontainers.image.description": description,
			"org.opencontainers.image.version":     "v1.2.3",
			"org.opencontainers.image.revision":    "0123456789abcdef0123456789abcdef01234567",
			"org.opencontainers.image.source":      "https://github.com/marksplit/marksplit",
		},
	}
	if diff := cmp.Diff(want, cfg.Config); diff != "" {
		t.Errorf("%s: config (-want +got):\n%s", arch, diff)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%s: %d layers, want 1 (an empty base and the binary)", arch, len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var files []string
	wantBin, err := os.ReadFile(staticBinaries(t)[arch])
	if err != nil {
		t.Fatal(err)
	}
	eachEntry(t, arch+" layer", rc, m.created.Time, func(h *tar.Header, data []byte) {
		files = append(files, h.Name+" "+os.FileMode(h.Mode).String())
		if h.Name == "usr/local/bin/marksplit" && !bytes.Equal(data, wantBin) {
			t.Errorf("%s: the layer's binary is not the one given", arch)
		}
	})
	wantFiles := []string{"usr/ -rwxr-xr-x", "usr/local/ -rwxr-xr-x", "usr/local/bin/ -rwxr-xr-x", "usr/local/bin/marksplit -rwxr-xr-x"}
	if diff := cmp.Diff(wantFiles, files); diff != "" {
		t.Errorf("%s: layer files (-want +got):\n%s", arch, diff)
	}
}

func TestRefuses(t *testing.T) {
	b := staticBinaries(t)
	dynamic, err := exec.LookPath("true") // a dynamically linked system binary
	if err != nil {
		t.Skip("no /bin/true to stand in for a dynamic binary")
	}
	for _, tc := range []struct {
		name string
		bins []platformBinary
		want string
	}{
		{"wrong architecture", []platformBinary{{"linux", "arm64", b["amd64"]}}, "built for EM_X86_64, not arm64"},
		{"dynamic", []platformBinary{{"linux", "amd64", dynamic}}, "dynamically linked"},
		{"not ELF", []platformBinary{{"linux", "amd64", "image_test.go"}}, "not an ELF binary"},
		{"platform twice", []platformBinary{{"linux", "amd64", b["amd64"]}, {"linux", "amd64", b["amd64"]}}, "linux/amd64 given twice"},
		{"unreleased platform", []platformBinary{{"linux", "riscv64", b["amd64"]}}, "released for linux/amd64 and linux/arm64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := buildIndex(testMeta(), tc.bins)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("buildIndex: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRunUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-out", "x.tar", "-version", "v", "-revision", "r", "linux/amd64=x"}, // no -epoch
		{"-out", "x.tar", "-version", "v", "-revision", "r", "-epoch", "0"},   // no binary
		{"-out", "x.tar", "-version", "v", "-revision", "r", "-epoch", "0", "amd64=x"},
	} {
		if code := run(args); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
	}
}
