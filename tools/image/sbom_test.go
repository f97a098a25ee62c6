package main

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// probeBinaries builds testdata/sbomprobe, which links a few modules, for
// amd64 and arm64 the way `make release` builds the agent.
func probeBinaries(t *testing.T) []platformBinary {
	t.Helper()
	dir := t.TempDir()
	var pbs []platformBinary
	for _, arch := range []string{"amd64", "arm64"} {
		out := filepath.Join(dir, "sbomprobe-linux-"+arch)
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w -X main.version=v1.2.3", "-o", out, "./testdata/sbomprobe")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GOWORK=off")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build the probe for %s: %v\n%s", arch, err, b)
		}
		pbs = append(pbs, platformBinary{os: "linux", arch: arch, path: out})
	}
	return pbs
}

// layoutSBOMs reads the SBOM referrers back from an unpacked layout, as a
// registry client would find them: index.json's entries with artifactType
// application/spdx+json, each naming the image manifest it describes. It
// returns the SBOMs by the platform of their subject.
func layoutSBOMs(t *testing.T, dir string) map[string]spdxDocument {
	t.Helper()
	l, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := l.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	platformOf := map[v1.Hash]string{}
	for _, d := range im.Manifests {
		platformOf[d.Digest] = d.Platform.OS + "/" + d.Platform.Architecture
	}
	docs := map[string]spdxDocument{}
	for _, d := range tm.Manifests[1:] {
		if d.ArtifactType != spdxMediaType {
			continue
		}
		raw, err := l.Bytes(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		var m v1.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		if m.ArtifactType != spdxMediaType || m.Subject == nil || len(m.Layers) != 1 || m.Layers[0].MediaType != spdxMediaType {
			t.Fatalf("referrer %s: artifactType %q, subject %v, layers %v; want one %s layer and a subject", d.Digest, m.ArtifactType, m.Subject, m.Layers, spdxMediaType)
		}
		plat, ok := platformOf[m.Subject.Digest]
		if !ok || m.Subject.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Fatalf("referrer %s: subject %v is not an image of the index", d.Digest, m.Subject)
		}
		sbom, err := l.Bytes(m.Layers[0].Digest)
		if err != nil {
			t.Fatal(err)
		}
		var doc spdxDocument
		if err := json.Unmarshal(sbom, &doc); err != nil {
			t.Fatalf("%s SBOM: %v", plat, err)
		}
		docs[plat] = doc
	}
	return docs
}

// missingModules lists what of the binary's build info doc does not say:
// each module (and the main module and the standard library) by path,
// version and PURL. It is what the test below checks, and is itself tested
// on an SBOM with a module left out.
func missingModules(info *buildinfo.BuildInfo, version string, doc spdxDocument) []string {
	type key struct{ name, version, purl string }
	have := map[key]bool{}
	for _, p := range doc.Packages {
		for _, r := range p.ExternalRefs {
			if r.ReferenceType == "purl" {
				have[key{p.Name, p.VersionInfo, r.ReferenceLocator}] = true
			}
		}
	}
	goVersion, _, _ := strings.Cut(info.GoVersion, " ")
	want := []key{
		{info.Main.Path, version, "pkg:golang/" + info.Main.Path + "@" + version},
		{"stdlib", goVersion, "pkg:golang/stdlib@" + goVersion},
	}
	for _, d := range info.Deps {
		path, v := d.Path, d.Version
		if d.Replace != nil {
			path, v = d.Replace.Path, d.Replace.Version
		}
		want = append(want, key{d.Path, v, "pkg:golang/" + path + "@" + v})
	}
	var missing []string
	for _, k := range want {
		if !have[k] {
			missing = append(missing, fmt.Sprintf("%s %s (%s)", k.name, k.version, k.purl))
		}
	}
	return missing
}

// TestSBOM runs the tool as `make image` does on binaries built as `make
// release` builds the agent, reads each platform's SBOM back from the
// layout, and checks it names every module of that binary's build info.
func TestSBOM(t *testing.T) {
	pbs := probeBinaries(t)
	m := testMeta()
	out := filepath.Join(t.TempDir(), "image.tar")
	args := []string{"-out", out, "-version", m.version, "-revision", m.revision, "-epoch", fmt.Sprint(m.created.Unix())}
	for _, pb := range pbs {
		args = append(args, pb.os+"/"+pb.arch+"="+pb.path)
	}
	if code := run(args); code != 0 {
		t.Fatalf("run(%q) = %d", args, code)
	}
	archive, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	docs := layoutSBOMs(t, untar(t, archive, m.created.Time))
	if len(docs) != len(pbs) {
		t.Fatalf("%d SBOMs in the layout, want one per platform (%d)", len(docs), len(pbs))
	}

	for _, pb := range pbs {
		plat := pb.os + "/" + pb.arch
		t.Run(plat, func(t *testing.T) {
			doc, ok := docs[plat]
			if !ok {
				t.Fatalf("no SBOM refers to the %s image", plat)
			}
			info, err := buildinfo.ReadFile(pb.path)
			if err != nil {
				t.Fatal(err)
			}
			if len(info.Deps) == 0 {
				t.Fatal("the probe links no modules: it tests nothing")
			}
			if missing := missingModules(info, m.version, doc); len(missing) > 0 {
				t.Errorf("the SBOM leaves out:\n%s", strings.Join(missing, "\n"))
			}
			checkSPDX(t, doc, m)

			// The check above fails when the SBOM leaves a module out.
			short := doc
			short.Packages = slices.DeleteFunc(slices.Clone(doc.Packages), func(p spdxPackage) bool {
				return p.Name == info.Deps[len(info.Deps)-1].Path
			})
			if got := missingModules(info, m.version, short); len(got) != 1 {
				t.Errorf("an SBOM without %s: missing %q, want it alone", info.Deps[len(info.Deps)-1].Path, got)
			}
		})
	}
}

// checkSPDX checks what SPDX 2.3 requires of the document and what makes
// it reproducible.
func checkSPDX(t *testing.T, doc spdxDocument, m meta) {
	t.Helper()
	if doc.SPDXVersion != "SPDX-2.3" || doc.DataLicense != "CC0-1.0" || doc.SPDXID != "SPDXRef-DOCUMENT" {
		t.Errorf("header: %q %q %q", doc.SPDXVersion, doc.DataLicense, doc.SPDXID)
	}
	if doc.Name == "" || !strings.HasPrefix(doc.DocumentNamespace, "https://") {
		t.Errorf("name %q, namespace %q: want both, the namespace a URI", doc.Name, doc.DocumentNamespace)
	}
	if want := "2023-11-14T22:13:20Z"; doc.CreationInfo.Created != want || len(doc.CreationInfo.Creators) == 0 {
		t.Errorf("creationInfo %+v, want created %s (the epoch) and creators", doc.CreationInfo, want)
	}
	ids := map[string]bool{"SPDXRef-DOCUMENT": true}
	for _, p := range doc.Packages {
		if ids[p.SPDXID] || !strings.HasPrefix(p.SPDXID, "SPDXRef-") || p.Name == "" || p.DownloadLocation == "" {
			t.Errorf("package %+v: a repeated or malformed SPDXID, or no name or downloadLocation", p)
		}
		ids[p.SPDXID] = true
		for _, c := range p.Checksums {
			if c.Algorithm != "SHA256" || len(c.ChecksumValue) != 64 {
				t.Errorf("package %s: checksum %+v", p.Name, c)
			}
		}
	}
	var described, dependsOn int
	for _, r := range doc.Relationships {
		if !ids[r.SPDXElementID] || !ids[r.RelatedSPDXElement] {
			t.Errorf("relationship %+v names an element the document lacks", r)
		}
		switch r.RelationshipType {
		case "DESCRIBES":
			described++
		case "DEPENDS_ON":
			dependsOn++
		}
	}
	if described != 1 || dependsOn != len(doc.Packages)-1 {
		t.Errorf("%d DESCRIBES and %d DEPENDS_ON, want 1 and %d (the main module on each other package)", described, dependsOn, len(doc.Packages)-1)
	}
}

func TestPURL(t *testing.T) {
	for _, tc := range []struct{ path, version, want string }{
		{"github.com/google/go-cmp", "v0.7.0", "pkg:golang/github.com/google/go-cmp@v0.7.0"},
		{"example.com/m", "v2.0.0+incompatible", "pkg:golang/example.com/m@v2.0.0%2Bincompatible"},
	} {
		if got := purl(tc.path, tc.version); got != tc.want {
			t.Errorf("purl(%q, %q) = %q, want %q", tc.path, tc.version, got, tc.want)
		}
	}
	if diff := cmp.Diff([]spdxChecksum{{"SHA256", "c24f37f36113b2fe0961467022c9fa6296225a206c60b489893b320726d5b8df"}},
		h1Checksum("h1:wk8382ETsv4JYUZwIsn6YpYiWiBsYLSJiTsyBybVuN8=")); diff != "" { // go-cmp v0.7.0 in go.sum
		t.Errorf("h1Checksum (-want +got):\n%s", diff)
	}
}
