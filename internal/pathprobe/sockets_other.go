//go:build !linux

package pathprobe

import "errors"

// NewProber fails: probes need Linux (IP_PMTUDISC_PROBE, SO_MARK).
func NewProber(cfg Config) (*Prober, error) {
	if _, err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	return nil, errors.New("pathprobe: probing needs Linux")
}
