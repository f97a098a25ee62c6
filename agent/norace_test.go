//go:build !race

package main

// raceEnabled reports whether the race detector is on: it multiplies memory.
const raceEnabled = false
