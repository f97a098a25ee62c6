//go:build !linux

// Command bench compares netwatch with its peers in Linux network
// namespaces; see main.go. Elsewhere it only says so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "bench: needs Linux (network namespaces and rtnetlink)")
	os.Exit(1)
}
