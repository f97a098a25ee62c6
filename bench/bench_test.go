//go:build linux

package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// kernelTestsEnv turns a skipped real-kernel test into a failed one: CI
// sets it to 1.
const kernelTestsEnv = "MARKSPLIT_KERNEL_TESTS"

func requireKernel(t *testing.T) {
	t.Helper()
	if reason := kernelUnavailable(); reason != "" {
		if os.Getenv(kernelTestsEnv) == "1" {
			t.Fatalf("real-kernel test cannot run (%s) but %s=1", reason, kernelTestsEnv)
		}
		t.Skipf("skipping real-kernel test: %s (set %s=1 to fail instead)", reason, kernelTestsEnv)
	}
}

// TestKernelQuick builds the command, runs it with -quick in fresh network
// namespaces and checks that the report it writes is complete and
// well-formed Markdown.
func TestKernelQuick(t *testing.T) {
	requireKernel(t)
	if testing.Short() {
		t.Skip("-short: the quick run takes about a minute")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	agent := filepath.Join(dir, "marksplit")
	build := exec.Command("go", "build", "-o", agent, "./agent")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./agent: %v\n%s", err, out)
	}

	// A hang, not a slow machine, reaches this: on a quiet one the run
	// takes about a minute.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	report := filepath.Join(dir, "BENCHMARKS.md")
	cmd := exec.CommandContext(ctx, bin, "-quick", "-agent", agent, "-out", report)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench -quick: %v\n%s", err, stderr.String())
	}
	t.Logf("bench -quick took %v", time.Since(start).Round(time.Second))
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	md := string(b)
	checkReport(t, md)
	if t.Failed() {
		t.Logf("report:\n%s\nlog:\n%s", md, stderr.String())
	}
}

// checkReport checks the sections, the tables' shape and the rows that
// must be there, and that no figure is missing or absurd.
func checkReport(t *testing.T, md string) {
	t.Helper()
	for _, h := range []string{"# Benchmarks", "## Headline", "## Machine", "## Method", "## Initial sync", "### 10,000 routes",
		"## Event ingest", "### Ingest", "### Overflow", "## Repair latency", "## What would move the figures"} {
		if !strings.Contains(md, "\n"+h) && !strings.HasPrefix(md, h) {
			t.Errorf("no %q heading", h)
		}
	}
	for _, bad := range []string{"NaN", "Inf", "%!", "<no value>", "not measured"} {
		if strings.Contains(md, bad) {
			t.Errorf("the report contains %q", bad)
		}
	}
	tables := markdownTables(md)
	if len(tables) < 5 {
		t.Fatalf("%d tables, want at least 5 (machine, sync, ingest, overflow, repair)", len(tables))
	}
	for _, tb := range tables {
		cols := cells(tb[0])
		if !regexp.MustCompile(`^\|(\s*-+:?\s*\|)+$`).MatchString(strings.ReplaceAll(tb[1], " ", "")) || len(cells(tb[1])) != len(cols) {
			t.Errorf("table %q: bad separator %q", tb[0], tb[1])
		}
		for _, row := range tb[2:] {
			if got := len(cells(row)); got != len(cols) {
				t.Errorf("table %q: row %q has %d cells, want %d", tb[0], row, got, len(cols))
			}
		}
	}
	for _, row := range []string{"raw dump, no decoding (floor)", "**netwatch** Watcher until Synced", "vishvananda `RouteListFiltered`",
		"vishvananda `RouteSubscribeWithOptions` ListExisting", "jsimonetti/rtnetlink `Route.List()`", "`ip -j route show table all`",
		"**netwatch** Watcher (Notify + Stats)", "`ip monitor route`", "**marksplit agent**", "shell loop polling every 2s"} {
		if !strings.Contains(md, "| "+row+" |") {
			t.Errorf("no row %q", row)
		}
	}
	// netwatch never ends apart from the kernel: not after its ingest,
	// not after an overflow.
	for _, tb := range tables {
		for _, row := range tb[2:] {
			if strings.Contains(row, "**netwatch** Watcher (Notify") && !strings.Contains(row, "| equal |") {
				t.Errorf("netwatch did not end equal to the kernel: %s", row)
			}
		}
	}
	if !regexp.MustCompile(`\| \*\*marksplit agent\*\* \| 5 \| [0-9.]+ (µs|ms) \|`).MatchString(md) {
		t.Errorf("the agent's repair row lacks 5 trials with a sub-second median")
	}
}

// markdownTables returns each table's lines.
func markdownTables(md string) [][]string {
	var tables [][]string
	var cur []string
	for l := range strings.Lines(md) {
		l = strings.TrimRight(l, "\n")
		if strings.HasPrefix(l, "|") {
			cur = append(cur, l)
			continue
		}
		if len(cur) > 0 {
			tables = append(tables, cur)
			cur = nil
		}
	}
	if len(cur) > 0 {
		tables = append(tables, cur)
	}
	return tables
}

// cells splits a table row, ignoring pipes inside code spans.
func cells(row string) []string {
	var out []string
	inCode := false
	start := 1
	for i := 1; i < len(row); i++ {
		switch row[i] {
		case '`':
			inCode = !inCode
		case '|':
			if !inCode {
				out = append(out, strings.TrimSpace(row[start:i]))
				start = i + 1
			}
		}
	}
	return out
}
