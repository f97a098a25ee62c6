// Command sbomprobe stands in for the agent in sbom_test.go: a static binary
// that links modules (this module's own dependencies), so that its build
// info lists some for the SBOM to carry.
package main

import (
	"fmt"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

var version = "dev"

func main() {
	fmt.Println(version, cmp.Equal(1, 1), tarball.WithCompressedCaching != nil)
}
