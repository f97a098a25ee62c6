//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "vpnbypass: runs on Linux only (it edits the kernel's routes and rules over rtnetlink)")
	os.Exit(1)
}
