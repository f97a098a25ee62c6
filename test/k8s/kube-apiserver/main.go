// Command kube-apiserver is the upstream Kubernetes API server, built from
// the Go module proxy for the test/k8s harness. It is not part of marksplit.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
