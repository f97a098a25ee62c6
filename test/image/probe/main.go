//go:build linux

// Command probe reports, as one JSON object on stdout, what a container's
// process may do: its ids, its capability sets, no-new-privileges and
// seccomp mode (from /proc/self/status), and the errors of a write to the
// root filesystem, a write to the agent's binary, and a get_mempolicy(2),
// harmless, which containerd's default seccomp profile refuses without
// CAP_SYS_NICE. The image tests run it in a container configured as the
// agent's is.
package main

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Report is what probe prints; an empty error string means it succeeded.
type Report struct {
	UID, GID     int
	Status       map[string]string // CapInh … CapAmb, NoNewPrivs, Seccomp
	WriteRoot    string            // create /probe-write
	WriteBinary  string            // open /usr/local/bin/marksplit for writing
	GetMempolicy string            // get_mempolicy(NULL, NULL, 0, NULL, 0)
}

func main() {
	r := Report{UID: os.Getuid(), GID: os.Getgid(), Status: map[string]string{}}
	if f, err := os.Open("/proc/self/status"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && (strings.HasPrefix(k, "Cap") || k == "NoNewPrivs" || k == "Seccomp") {
				r.Status[k] = strings.TrimSpace(v)
			}
		}
		f.Close()
	}
	r.WriteRoot = errString(os.WriteFile("/probe-write", []byte("x"), 0o644))
	if f, err := os.OpenFile("/usr/local/bin/marksplit", os.O_WRONLY, 0); err != nil {
		r.WriteBinary = err.Error()
	} else {
		f.Close()
	}
	if _, _, errno := unix.Syscall6(unix.SYS_GET_MEMPOLICY, 0, 0, 0, 0, 0, 0); errno != 0 {
		r.GetMempolicy = errno.Error()
	}
	json.NewEncoder(os.Stdout).Encode(r)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
