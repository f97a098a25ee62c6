// Command k8sdeps builds what the Kubernetes tests run — etcd and
// kube-apiserver from their pinned Go modules — into the cache the tests
// read (${MARKSPLIT_CACHE:-/var/cache/marksplit}), printing its progress.
// `make test` runs it before the tests, so that a first build (minutes) is
// seen to move; a cached one prints one line per program and takes no time.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/marksplit/marksplit/test/k8s/depbuild"
)

func main() {
	os.Exit(run())
}

func run() int {
	for _, p := range depbuild.Programs(".") {
		bin, err := p.Build(os.Stdout, 30*time.Second)
		if err != nil {
			fmt.Fprintf(os.Stderr, "k8sdeps: %v\n", err)
			return 1
		}
		fmt.Printf("%s: %s\n", p.Name, bin)
	}
	return 0
}
