//go:build !linux

package main

import (
	"context"
	"fmt"
	"io"
)

func runHealth(_ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "marksplit: runs on Linux only")
	return exitFailure
}

func execute(_ context.Context, _ options, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "marksplit: runs on Linux only (it edits the kernel's routes and rules over rtnetlink)")
	return exitFailure
}
