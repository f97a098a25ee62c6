package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
)

// The SBOM: one SPDX 2.3 JSON document per platform, describing its binary
// from the build info the Go toolchain wrote into it (debug/buildinfo): the
// main module at the release's version, every module linked in with its
// version and go.sum hash, and the standard library at the Go version.
// Nothing is read from the network or the clock: the same binary and flags
// give the same bytes.

// spdxMediaType is the SBOM's media type, and the artifactType of the OCI
// artifact that carries it (the IANA registration for SPDX JSON).
const spdxMediaType = "application/spdx+json"

type (
	spdxDocument struct {
		SPDXVersion       string             `json:"spdxVersion"`
		DataLicense       string             `json:"dataLicense"`
		SPDXID            string             `json:"SPDXID"`
		Name              string             `json:"name"`
		DocumentNamespace string             `json:"documentNamespace"`
		CreationInfo      spdxCreationInfo   `json:"creationInfo"`
		Packages          []spdxPackage      `json:"packages"`
		Relationships     []spdxRelationship `json:"relationships"`
	}
	spdxCreationInfo struct {
		Created  string   `json:"created"`
		Creators []string `json:"creators"`
	}
	spdxPackage struct {
		SPDXID                string            `json:"SPDXID"`
		Name                  string            `json:"name"`
		VersionInfo           string            `json:"versionInfo,omitempty"`
		DownloadLocation      string            `json:"downloadLocation"`
		FilesAnalyzed         bool              `json:"filesAnalyzed"`
		PrimaryPackagePurpose string            `json:"primaryPackagePurpose,omitempty"`
		Checksums             []spdxChecksum    `json:"checksums,omitempty"`
		ExternalRefs          []spdxExternalRef `json:"externalRefs"`
		Comment               string            `json:"comment,omitempty"`
	}
	spdxChecksum struct {
		Algorithm     string `json:"algorithm"`
		ChecksumValue string `json:"checksumValue"`
	}
	spdxExternalRef struct {
		ReferenceCategory string `json:"referenceCategory"`
		ReferenceType     string `json:"referenceType"`
		ReferenceLocator  string `json:"referenceLocator"`
	}
	spdxRelationship struct {
		SPDXElementID      string `json:"spdxElementId"`
		RelationshipType   string `json:"relationshipType"`
		RelatedSPDXElement string `json:"relatedSpdxElement"`
	}
)

// spdxIDUnsafe matches what may not be in an SPDX identifier (letters,
// digits, '.' and '-' only).
var spdxIDUnsafe = regexp.MustCompile(`[^A-Za-z0-9.-]`)

func spdxID(kind, name string) string {
	return "SPDXRef-" + kind + "-" + spdxIDUnsafe.ReplaceAllString(name, "-")
}

// purl is the package URL of a Go module (github.com/package-url/purl-spec,
// type golang): the module path as namespace and name, then the version
// with its '+' (as in +incompatible) percent-encoded.
func purl(path, version string) string {
	return "pkg:golang/" + path + "@" + strings.ReplaceAll(version, "+", "%2B")
}

// h1Checksum turns a go.sum hash ("h1:" and base64 of a SHA-256) into an
// SPDX SHA256 checksum, as syft does; other forms are left out.
func h1Checksum(sum string) []spdxChecksum {
	b64, ok := strings.CutPrefix(sum, "h1:")
	if !ok {
		return nil
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != sha256.Size {
		return nil
	}
	return []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: hex.EncodeToString(raw)}}
}

// buildSBOM describes the binary bin, built for b, in SPDX 2.3 JSON.
func buildSBOM(m meta, b platformBinary, bin []byte) ([]byte, error) {
	info, err := buildinfo.Read(bytes.NewReader(bin))
	if err != nil {
		return nil, fmt.Errorf("%s: no Go build info, so no SBOM: %w", b.path, err)
	}
	plat := b.os + "/" + b.arch
	binSum := sha256.Sum256(bin)
	mainID := spdxID("Module", info.Main.Path)
	main := spdxPackage{
		SPDXID:                mainID,
		Name:                  info.Main.Path,
		VersionInfo:           m.version,
		DownloadLocation:      downloadLocation(m),
		PrimaryPackagePurpose: "APPLICATION",
		Checksums:             []spdxChecksum{{Algorithm: "SHA256", ChecksumValue: hex.EncodeToString(binSum[:])}},
		ExternalRefs:          []spdxExternalRef{purlRef(purl(info.Main.Path, m.version))},
		Comment: fmt.Sprintf("%s for %s at %s (revision %s), built with %s%s; the checksum is the binary's",
			info.Path, plat, binaryPath, m.revision, info.GoVersion, buildSettings(info)),
	}
	goVersion := strings.TrimPrefix(info.GoVersion, "go")
	goVersion, _, _ = strings.Cut(goVersion, " ") // "1.26.8 X:nodwarf5" → "1.26.8"
	std := spdxPackage{
		SPDXID:                "SPDXRef-Module-stdlib",
		Name:                  "stdlib",
		VersionInfo:           "go" + goVersion,
		DownloadLocation:      "https://go.dev/dl/",
		PrimaryPackagePurpose: "LIBRARY",
		ExternalRefs:          []spdxExternalRef{purlRef(purl("stdlib", "go"+goVersion))},
		Comment:               "the Go standard library and runtime linked into the binary",
	}
	pkgs := []spdxPackage{main, std}
	rels := []spdxRelationship{
		{"SPDXRef-DOCUMENT", "DESCRIBES", mainID},
		{mainID, "DEPENDS_ON", std.SPDXID},
	}
	deps := slices.Clone(info.Deps)
	slices.SortFunc(deps, func(x, y *debug.Module) int { return strings.Compare(x.Path, y.Path) })
	for _, d := range deps {
		p := depPackage(d)
		pkgs = append(pkgs, p)
		rels = append(rels, spdxRelationship{mainID, "DEPENDS_ON", p.SPDXID})
	}
	doc := spdxDocument{
		SPDXVersion: "SPDX-2.3",
		DataLicense: "CC0-1.0",
		SPDXID:      "SPDXRef-DOCUMENT",
		Name:        fmt.Sprintf("%s %s %s", title, m.version, plat),
		// Unique per binary and version, the same for the same bytes.
		DocumentNamespace: fmt.Sprintf("%s/spdx/%s/%s-%s/%x", strings.TrimSuffix(m.source, "/"),
			m.version, b.os, b.arch, binSum[:8]),
		CreationInfo: spdxCreationInfo{
			Created:  m.created.UTC().Format("2006-01-02T15:04:05Z"),
			Creators: []string{"Tool: marksplit-tools-image", "Organization: marksplit"},
		},
		Packages:      pkgs,
		Relationships: rels,
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// depPackage describes one module of the build info; a replaced module is
// described by what replaced it, which is what was compiled in.
func depPackage(d *debug.Module) spdxPackage {
	path, version, sum, comment := d.Path, d.Version, d.Sum, ""
	if r := d.Replace; r != nil {
		version, sum = r.Version, r.Sum
		comment = "replaced by " + r.Path
		if r.Version != "" {
			comment += " " + r.Version
		}
		if r.Version != "" && r.Path != d.Path {
			path = r.Path // the PURL names the module that was compiled
		}
	}
	p := spdxPackage{
		SPDXID:                spdxID("Module", d.Path),
		Name:                  d.Path,
		VersionInfo:           version,
		DownloadLocation:      "NOASSERTION",
		PrimaryPackagePurpose: "LIBRARY",
		Checksums:             h1Checksum(sum),
		ExternalRefs:          []spdxExternalRef{},
		Comment:               comment,
	}
	if version != "" {
		p.ExternalRefs = append(p.ExternalRefs, purlRef(purl(path, version)))
	}
	return p
}

func purlRef(locator string) spdxExternalRef {
	return spdxExternalRef{ReferenceCategory: "PACKAGE-MANAGER", ReferenceType: "purl", ReferenceLocator: locator}
}

// downloadLocation is where the main module's source is: the repository at
// the revision, in SPDX's VCS form, when the source is an https URL.
func downloadLocation(m meta) string {
	if !strings.HasPrefix(m.source, "https://") {
		return "NOASSERTION"
	}
	return "git+" + m.source + "@" + m.revision
}

// buildSettings lists the build settings that say how the binary was made.
func buildSettings(info *debug.BuildInfo) string {
	var s []string
	for _, kv := range info.Settings {
		switch kv.Key {
		case "GOOS", "GOARCH", "CGO_ENABLED", "-trimpath", "-buildmode":
			s = append(s, kv.Key+"="+kv.Value)
		}
	}
	if len(s) == 0 {
		return ""
	}
	return " (" + strings.Join(s, " ") + ")"
}

// buildSBOMs makes the SBOM of each binary, by "os/arch".
func buildSBOMs(m meta, bins []platformBinary) (map[string][]byte, error) {
	sboms := map[string][]byte{}
	for _, b := range bins {
		bin, err := os.ReadFile(b.path)
		if err != nil {
			return nil, err
		}
		sbom, err := buildSBOM(m, b, bin)
		if err != nil {
			return nil, err
		}
		sboms[b.os+"/"+b.arch] = sbom
	}
	return sboms, nil
}
