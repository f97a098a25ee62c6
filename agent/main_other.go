//go:build !linux

package main

import (
	"fmt"
	"io"
)

func run(_ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "marksplit: runs on Linux only (it edits the kernel's routes and rules over rtnetlink)")
	return exitFailure
}
