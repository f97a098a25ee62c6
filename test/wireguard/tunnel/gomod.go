package tunnel

import "strings"

// wireguardModule is the module whose main package is wireguard-go.
const wireguardModule = "golang.zx2c4.com/wireguard"

// requiredVersion returns the version go.mod requires of module, or "".
func requiredVersion(gomod []byte, module string) string {
	for line := range strings.SplitSeq(string(gomod), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == module {
			return f[1]
		}
	}
	return ""
}
