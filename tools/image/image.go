package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// What every image says; deploy/Dockerfile says the same (dockerfile_test.go).
const (
	binaryPath    = "/usr/local/bin/marksplit"
	user          = "0:0"
	defaultSource = "https://github.com/marksplit/marksplit"
	title         = "marksplit"
	description   = "Split one route into two MTUs by packet mark (Cilium WireGuard)"
	// defaultPath is the PATH a container runtime sets when the image has
	// none; written down so that the image says it, as BuildKit's do.
	defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// meta is what the command line says of the image.
type meta struct {
	version, revision, source string
	created                   v1.Time
}

// labels are the image's OCI labels (org.opencontainers.image.*).
func (m meta) labels() map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.version":     m.version,
		"org.opencontainers.image.revision":    m.revision,
		"org.opencontainers.image.source":      m.source,
	}
}

// elfMachines are the ELF machines of the architectures the agent is
// released for.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64,
	"arm64": elf.EM_AARCH64,
}

// buildIndex builds one image per binary and an OCI index over them, in
// the order given.
func buildIndex(m meta, bins []platformBinary) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	var adds []mutate.IndexAddendum
	for _, b := range bins {
		plat := b.os + "/" + b.arch
		if seen[plat] {
			return nil, fmt.Errorf("%s given twice", plat)
		}
		seen[plat] = true
		img, err := buildImage(m, b)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: b.os, Architecture: b.arch}},
		})
	}
	idx = mutate.AppendManifests(idx, adds...)
	return mutate.Annotations(idx, map[string]string{
		"org.opencontainers.image.version":  m.version,
		"org.opencontainers.image.revision": m.revision,
		"org.opencontainers.image.source":   m.source,
		"org.opencontainers.image.created":  m.created.UTC().Format("2006-01-02T15:04:05Z"),
	}).(v1.ImageIndex), nil
}

// buildImage puts b's binary on an empty base.
func buildImage(m meta, b platformBinary) (v1.Image, error) {
	bin, err := os.ReadFile(b.path)
	if err != nil {
		return nil, err
	}
	if err := checkStatic(b, bin); err != nil {
		return nil, err
	}
	layerTar, err := layerTar(bin, m.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   m.created,
			CreatedBy: "tools/image: COPY " + b.path + " " + binaryPath,
			Comment:   "the static binary from make release",
		},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = b.os, b.arch
	cfg.Created = m.created
	cfg.Config = v1.Config{
		Entrypoint: []string{binaryPath},
		User:       user,
		Env:        []string{defaultPath},
		Labels:     m.labels(),
	}
	return mutate.ConfigFile(img, cfg)
}

// checkStatic refuses a binary that is not a static ELF executable for b's
// architecture: on an empty base there is no dynamic loader and no libc.
func checkStatic(b platformBinary, bin []byte) error {
	want, ok := elfMachines[b.arch]
	if !ok || b.os != "linux" {
		return fmt.Errorf("%s/%s: the agent is released for linux/amd64 and linux/arm64", b.os, b.arch)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return fmt.Errorf("%s: not an ELF binary: %w", b.path, err)
	}
	defer f.Close()
	if f.Machine != want {
		return fmt.Errorf("%s: built for %s, not %s", b.path, f.Machine, b.arch)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("%s: %s, not an executable", b.path, f.Type)
	}
	if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		return fmt.Errorf("%s: dynamically linked (it names a program interpreter): build it with CGO_ENABLED=0 (make release)", b.path)
	}
	return nil
}

// layerTar is the layer's uncompressed content: the directories down to
// the binary and the binary itself, root-owned, every time t.
func layerTar(bin []byte, t v1.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(name string, typ byte, mode, size int64) *tar.Header {
		return &tar.Header{
			Typeflag: typ, Name: name, Mode: mode, Size: size,
			ModTime: t.Time, Uid: 0, Gid: 0, Uname: "root", Gname: "root",
			Format: tar.FormatPAX,
		}
	}
	for _, dir := range []string{"usr/", "usr/local/", "usr/local/bin/"} {
		if err := tw.WriteHeader(hdr(dir, tar.TypeDir, 0o755, 0)); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(hdr(binaryPath[1:], tar.TypeReg, 0o755, int64(len(bin)))); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
