//go:build !linux

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "watch: runs on Linux only (it reads the kernel's state over rtnetlink)")
	os.Exit(1)
}
