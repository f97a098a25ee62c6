package image

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// An OCI image layout's JSON, as much of it as the test reads.
type (
	descriptor struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
		Platform  *struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		} `json:"platform,omitempty"`
	}
	indexJSON struct {
		Manifests []descriptor `json:"manifests"`
	}
	manifestJSON struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	// imageConfig is the part of an image config the runtime uses.
	imageConfig struct {
		Architecture string `json:"architecture"`
		Config       struct {
			Entrypoint []string          `json:"Entrypoint"`
			Cmd        []string          `json:"Cmd"`
			Env        []string          `json:"Env"`
			User       string            `json:"User"`
			WorkingDir string            `json:"WorkingDir"`
			Labels     map[string]string `json:"Labels"`
		} `json:"config"`
	}
)

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// layoutArchive is an OCI image-layout tar archive read into memory.
type layoutArchive map[string][]byte

func readLayout(archive string) (layoutArchive, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	files := layoutArchive{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", archive, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		files[path.Clean(h.Name)] = b
	}
}

// blob returns the content of d, checking its digest and size.
func (l layoutArchive) blob(d descriptor) ([]byte, error) {
	hexDigest, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok {
		return nil, fmt.Errorf("digest %q: want sha256", d.Digest)
	}
	b, ok := l["blobs/sha256/"+hexDigest]
	if !ok {
		return nil, fmt.Errorf("blob %s missing", d.Digest)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != hexDigest || int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob %s: content does not match its descriptor", d.Digest)
	}
	return b, nil
}

func (l layoutArchive) decode(d descriptor, v any) error {
	b, err := l.blob(d)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// image finds the manifest for os/arch, through index.json and the image
// index it names.
func (l layoutArchive) image(osName, arch string) (manifestJSON, imageConfig, error) {
	var top indexJSON
	if err := json.Unmarshal(l["index.json"], &top); err != nil {
		return manifestJSON{}, imageConfig{}, fmt.Errorf("index.json: %w", err)
	}
	// index.json names the image index (tools/image tags it) and, after
	// it, the SBOM artifacts that refer to its images: follow the index.
	manifests := top.Manifests
	for {
		i := slices.IndexFunc(manifests, func(d descriptor) bool { return d.MediaType == mediaIndex })
		if i < 0 {
			break
		}
		var idx indexJSON
		if err := l.decode(manifests[i], &idx); err != nil {
			return manifestJSON{}, imageConfig{}, err
		}
		manifests = idx.Manifests
	}
	for _, d := range manifests {
		if d.MediaType != mediaManifest || d.Platform == nil || d.Platform.OS != osName || d.Platform.Architecture != arch {
			continue
		}
		var m manifestJSON
		if err := l.decode(d, &m); err != nil {
			return manifestJSON{}, imageConfig{}, err
		}
		var cfg imageConfig
		if err := l.decode(m.Config, &cfg); err != nil {
			return manifestJSON{}, imageConfig{}, err
		}
		return m, cfg, nil
	}
	return manifestJSON{}, imageConfig{}, fmt.Errorf("no %s/%s image in the index", osName, arch)
}

// unpack extracts m's layers in order into dir. The agent's layers hold
// directories and regular files only; anything else is refused rather than
// half-handled.
func (l layoutArchive) unpack(m manifestJSON, dir string) error {
	for _, d := range m.Layers {
		if d.MediaType != mediaLayerGz {
			return fmt.Errorf("layer %s: media type %s not handled", d.Digest, d.MediaType)
		}
		b, err := l.blob(d)
		if err != nil {
			return err
		}
		if err := untarLayer(b, dir); err != nil {
			return fmt.Errorf("layer %s: %w", d.Digest, err)
		}
	}
	return nil
}

func untarLayer(gz []byte, dir string) error {
	zr, err := gzip.NewReader(strings.NewReader(string(gz)))
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		if strings.HasPrefix(path.Base(name), ".wh.") {
			return fmt.Errorf("%s: whiteouts not handled", h.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode).Perm()); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, os.FileMode(h.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: entry type %q not handled", h.Name, h.Typeflag)
		}
		if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
			return err
		}
	}
}
