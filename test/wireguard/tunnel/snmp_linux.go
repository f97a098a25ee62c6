package tunnel

import (
	"fmt"
	"os"
)

// ReadFrag reads the fragmentation counters of the namespace ns.
func ReadFrag(ns string) (Frag, error) {
	var b []byte
	err := In(ns, func() error {
		var err error
		b, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return Frag{}, fmt.Errorf("tunnel: read snmp in %s: %w", ns, err)
	}
	return parseFrag(string(b))
}
