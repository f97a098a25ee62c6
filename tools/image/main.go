// Command image builds the marksplit agent's container image without a
// container daemon and without pulling anything: the static binaries that
// `make release` built, each on an empty base, one image per platform and an
// OCI index over them, written as an OCI image-layout tar archive.
//
//	go run . -out ../../bin/marksplit-image.tar -version v0.2.0 -revision $(git rev-parse HEAD) \
//	    -epoch $(git log -1 --format=%ct) \
//	    linux/amd64=../../bin/marksplit-linux-amd64 linux/arm64=../../bin/marksplit-linux-arm64
//
// `make image` runs it so. Each image holds one file, /usr/local/bin/marksplit
// (owned by 0:0, mode 0755), and says: entrypoint that file, user 0:0, the
// OCI labels title, description, version, revision and source. Every
// timestamp — the layer's files, the config's created and history — is
// -epoch (SOURCE_DATE_EPOCH: the commit's time), and the archive itself is
// written in a fixed order with fixed metadata, so the same binaries and
// flags give the same bytes.
//
// Beside each image the layout holds its SBOM: an SPDX 2.3 JSON document
// made from the binary's Go build info (every module and version linked in,
// sbom.go), carried by an OCI artifact (artifactType application/spdx+json)
// whose subject is that image's manifest, listed in index.json after the
// tagged index. deploy/Dockerfile builds the same image with
// Docker; dockerfile_test.go keeps the two in step.
//
// It is a module of its own (go-containerregistry builds the images and the
// index) so that the library's go.mod stays small.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var m meta
	out := fs.String("out", "", "the OCI image-layout tar `archive` to write")
	fs.StringVar(&m.version, "version", "", "the image's version (label and tag)")
	fs.StringVar(&m.revision, "revision", "", "the source revision (git commit) it was built from")
	fs.StringVar(&m.source, "source", defaultSource, "the source repository's `URL`")
	epoch := fs.Int64("epoch", -1, "every timestamp in the image, in `seconds` since 1970 (SOURCE_DATE_EPOCH)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: image -out ARCHIVE -version V -revision R -epoch S OS/ARCH=BINARY...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "image: "+format+"\n", a...)
		return 2
	}
	switch {
	case *out == "":
		return usage("-out is required")
	case m.version == "":
		return usage("-version is required")
	case m.revision == "":
		return usage("-revision is required")
	case *epoch < 0:
		return usage("-epoch is required (seconds since 1970, e.g. $(git log -1 --format=%%ct))")
	case fs.NArg() == 0:
		return usage("name at least one OS/ARCH=BINARY")
	}
	m.created = v1.Time{Time: time.Unix(*epoch, 0).UTC()}

	var bins []platformBinary
	for _, a := range fs.Args() {
		pb, err := parsePlatformBinary(a)
		if err != nil {
			return usage("%v", err)
		}
		bins = append(bins, pb)
	}
	idx, err := buildIndex(m, bins)
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		return 1
	}
	sboms, err := buildSBOMs(m, bins)
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		return 1
	}
	sum, err := writeArchive(*out, m, idx, sboms)
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		return 1
	}
	fmt.Print(sum)
	return 0
}

// platformBinary is one OS/ARCH=BINARY argument.
type platformBinary struct {
	os, arch string
	path     string
}

func parsePlatformBinary(s string) (platformBinary, error) {
	plat, path, ok := strings.Cut(s, "=")
	osName, arch, ok2 := strings.Cut(plat, "/")
	if !ok || !ok2 || osName == "" || arch == "" || path == "" {
		return platformBinary{}, fmt.Errorf("%q: want OS/ARCH=BINARY (linux/amd64=bin/marksplit-linux-amd64)", s)
	}
	return platformBinary{os: osName, arch: arch, path: path}, nil
}
