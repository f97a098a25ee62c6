package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// blobs are an archive's content-addressed files by digest.
type blobs map[v1.Hash][]byte

func (b blobs) add(h v1.Hash, data []byte) error {
	if got := sha256Of(data); got != h {
		return fmt.Errorf("blob %s has digest %s", h, got)
	}
	b[h] = data
	return nil
}

func sha256Of(data []byte) v1.Hash {
	h, _, _ := v1.SHA256(bytes.NewReader(data))
	return h
}

// writeArchive writes idx as an OCI image layout in a tar archive at path:
// oci-layout, index.json, and every blob idx reaches. index.json's first
// entry is idx, tagged m.version; after it, for each image of idx whose
// platform ("os/arch") sboms has, an untagged OCI artifact (artifactType
// application/spdx+json) whose subject is that image's manifest and whose
// one layer is the SBOM: a referrer, as `oras attach --oci-layout` would
// add it, which `oras discover --oci-layout` and `oras cp -r` find. It
// returns a summary for people.
func writeArchive(path string, m meta, idx v1.ImageIndex, sboms map[string][]byte) (string, error) {
	b := blobs{}
	var summary strings.Builder
	rawIdx, err := idx.RawManifest()
	if err != nil {
		return "", err
	}
	idxDigest := sha256Of(rawIdx)
	b[idxDigest] = rawIdx
	im, err := idx.IndexManifest()
	if err != nil {
		return "", err
	}
	var referrers []v1.Descriptor
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return "", err
		}
		line, err := addImage(b, img)
		if err != nil {
			return "", err
		}
		plat := desc.Platform.OS + "/" + desc.Platform.Architecture
		fmt.Fprintf(&summary, "  %-12s %s\n", plat, line)
		if sbom, ok := sboms[plat]; ok {
			ref, err := addSBOM(b, m, desc, plat, sbom)
			if err != nil {
				return "", err
			}
			referrers = append(referrers, ref)
			fmt.Fprintf(&summary, "  %-12s SBOM %s (SPDX 2.3, %d bytes), referrer %s\n", "", sha256Of(sbom), len(sbom), ref.Digest)
		}
	}

	top := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: append([]v1.Descriptor{{
			MediaType: types.OCIImageIndex,
			Digest:    idxDigest,
			Size:      int64(len(rawIdx)),
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": m.version,
				"io.containerd.image.name":          "marksplit:" + m.version,
			},
		}}, referrers...),
	}
	indexJSON, err := json.Marshal(top)
	if err != nil {
		return "", err
	}
	size, err := writeTar(path, m.created, indexJSON, b)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: OCI image layout, %.1f MB, index %s tagged %s\n%s",
		path, float64(size)/1e6, idxDigest, m.version, summary.String()), nil
}

// The OCI empty descriptor: the config of an artifact that has none.
var emptyJSON = []byte("{}")

// addSBOM adds to b an OCI artifact manifest that carries sbom and refers
// to the image manifest subject, and returns its descriptor for index.json.
func addSBOM(b blobs, m meta, subject v1.Descriptor, plat string, sbom []byte) (v1.Descriptor, error) {
	emptyDigest := sha256Of(emptyJSON)
	b[emptyDigest] = emptyJSON
	sbomDigest := sha256Of(sbom)
	b[sbomDigest] = sbom
	name := "marksplit-" + strings.ReplaceAll(plat, "/", "-") + ".spdx.json"
	annotations := map[string]string{
		"org.opencontainers.image.created": m.created.UTC().Format("2006-01-02T15:04:05Z"),
		"org.opencontainers.image.title":   name,
	}
	manifest := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  spdxMediaType,
		Config: v1.Descriptor{
			MediaType: "application/vnd.oci.empty.v1+json",
			Digest:    emptyDigest,
			Size:      int64(len(emptyJSON)),
			Data:      emptyJSON,
		},
		Layers: []v1.Descriptor{{
			MediaType:   spdxMediaType,
			Digest:      sbomDigest,
			Size:        int64(len(sbom)),
			Annotations: map[string]string{"org.opencontainers.image.title": name},
		}},
		Subject:     &v1.Descriptor{MediaType: subject.MediaType, Digest: subject.Digest, Size: subject.Size},
		Annotations: annotations,
	}
	raw, err := json.Marshal(manifest)
	if err != nil {
		return v1.Descriptor{}, err
	}
	digest := sha256Of(raw)
	b[digest] = raw
	return v1.Descriptor{
		MediaType:    types.OCIManifestSchema1,
		ArtifactType: spdxMediaType,
		Digest:       digest,
		Size:         int64(len(raw)),
		Annotations:  annotations,
	}, nil
}

// addImage adds img's manifest, config and layers to b and describes it.
func addImage(b blobs, img v1.Image) (string, error) {
	raw, err := img.RawManifest()
	if err != nil {
		return "", err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	if err := b.add(digest, raw); err != nil {
		return "", err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return "", err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return "", err
	}
	if err := b.add(cfgName, cfg); err != nil {
		return "", err
	}
	layers, err := img.Layers()
	if err != nil {
		return "", err
	}
	var total int64
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return "", err
		}
		rc, err := l.Compressed()
		if err != nil {
			return "", err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return "", err
		}
		if err := b.add(d, data); err != nil {
			return "", err
		}
		total += int64(len(data))
	}
	return fmt.Sprintf("manifest %s, %d layer(s) %.1f MB compressed", digest, len(layers), float64(total)/1e6), nil
}

// writeTar writes the layout to path (through a temporary file beside it)
// in a fixed order, every entry root-owned and stamped t; it returns the
// archive's size.
func writeTar(path string, t v1.Time, indexJSON []byte, b blobs) (int64, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return 0, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if err := tmp.Chmod(0o644); err != nil {
		return 0, err
	}

	tw := tar.NewWriter(tmp)
	entry := func(name string, data []byte) error {
		typ, mode := byte(tar.TypeReg), int64(0o644)
		if strings.HasSuffix(name, "/") {
			typ, mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: typ, Name: name, Mode: mode, Size: int64(len(data)),
			ModTime: t.Time, Uname: "root", Gname: "root", Format: tar.FormatPAX,
		}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := entry("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return 0, err
	}
	if err := entry("index.json", indexJSON); err != nil {
		return 0, err
	}
	if err := entry("blobs/", nil); err != nil {
		return 0, err
	}
	if err := entry("blobs/sha256/", nil); err != nil {
		return 0, err
	}
	digests := make([]v1.Hash, 0, len(b))
	for h := range b {
		digests = append(digests, h)
	}
	slices.SortFunc(digests, func(x, y v1.Hash) int { return strings.Compare(x.Hex, y.Hex) })
	for _, h := range digests {
		if err := entry("blobs/"+h.Algorithm+"/"+h.Hex, b[h]); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	if err := tmp.Close(); err != nil {
		return 0, err
	}
	return size, os.Rename(tmp.Name(), path)
}
