// Command etcd is the upstream etcd server, built from the Go module proxy
// for the test/k8s harness (go.etcd.io/etcd/server/v3's own main). It is not
// part of marksplit.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
