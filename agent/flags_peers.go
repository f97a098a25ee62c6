package main

import "errors"

// peersValue is --peers: auto, the only value, or empty for not set (so
// that a manifest can blank it from the environment).
type peersValue struct{ on *bool }

func (v peersValue) String() string {
	if v.on == nil || !*v.on {
		return ""
	}
	return "auto"
}

func (v peersValue) Set(s string) error {
	switch s {
	case "auto":
		*v.on = true
	case "":
		*v.on = false
	default:
		return errors.New("want auto (or empty for none)")
	}
	return nil
}

// readsPeers reports whether the command reads every CiliumNode: run, once
// and plan with --peers=auto, unless the mode is off (then nothing is
// split and no peer matters), and verify, which judges the answers by
// whether the address is an encrypting peer's. cleanup needs no API.
func (o options) readsPeers() bool {
	return o.policy.Peers && (o.cmd == cmdVerify || o.usesMode() && o.encryption != encOff)
}
