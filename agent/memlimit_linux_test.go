//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCgroupMemoryLimit(t *testing.T) {
	tests := []struct {
		name, cgroup string
		files        map[string]string
		want         int64
	}{
		{"v2", "0::/kubepods/pod1/c1\n", map[string]string{"kubepods/pod1/c1/memory.max": "134217728\n"}, 128 << 20},
		{"v2 unlimited", "0::/x\n", map[string]string{"x/memory.max": "max\n"}, 0},
		{"v2 own namespace", "0::/\n", map[string]string{"memory.max": "134217728\n"}, 128 << 20},
		{"v2 host path, own mount", "0::/kubepods/c1\n", map[string]string{"memory.max": "67108864\n"}, 64 << 20},
		{"v1", "12:cpu,cpuacct:/a\n11:memory:/kubepods/c1\n", map[string]string{"memory/kubepods/c1/memory.limit_in_bytes": "134217728\n"}, 128 << 20},
		{"v1 unlimited", "11:memory:/\n", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
		{"no memory controller", "12:cpu:/a\n", map[string]string{"memory/a/memory.limit_in_bytes": "1000\n"}, 0},
		{"garbage", "11:memory:/c\n", map[string]string{"memory/c/memory.limit_in_bytes": "lots\n"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			root := filepath.Join(dir, "fs")
			for name, body := range tt.files {
				p := filepath.Join(root, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			pc := filepath.Join(dir, "cgroup")
			if err := os.WriteFile(pc, []byte(tt.cgroup), 0o644); err != nil {
				t.Fatal(err)
			}
			if got := cgroupMemoryLimit(pc, root); got != tt.want {
				t.Errorf("cgroupMemoryLimit = %d, want %d", got, tt.want)
			}
		})
	}
}
