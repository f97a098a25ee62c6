//go:build linux

package pathprobe

import (
	"strconv"
	"syscall"
)

type syscallRawConn = syscall.RawConn

func itoa(n int) string { return strconv.Itoa(n) }
