package main

import (
	"fmt"
	"strconv"

	"github.com/marksplit/marksplit/internal/kubeapi"
	"github.com/marksplit/marksplit/internal/kubewatch"
)

// encryptNodeKey is the key of cilium-config that turns node encryption on
// (Helm's encryption.nodeEncryption).
const encryptNodeKey = "encrypt-node"

// nodeEncState is what the agent knows of node encryption from
// cilium-config.
type nodeEncState int32

const (
	nodeEncUnused      nodeEncState = iota // not followed (--encryption=on or off, or a command without a mode)
	nodeEncWaiting                         // not read yet: nothing is planned
	nodeEncUnreadable                      // the first read failed: nothing is planned until one succeeds
	nodeEncOn                              // encrypt-node is true
	nodeEncOff                             // encrypt-node is false: standing down
	nodeEncKeyMissing                      // cilium-config has no encrypt-node: standing down
	nodeEncNoConfigMap                     // cilium-config does not exist: standing down
	nodeEncInvalid                         // encrypt-node is not a boolean: standing down, as Cilium reads it false
)

// nodeEncLabels are the values of marksplit_node_encryption's state label.
var nodeEncLabels = map[nodeEncState]string{
	nodeEncWaiting:     "unknown",
	nodeEncUnreadable:  "unknown",
	nodeEncOn:          "on",
	nodeEncOff:         "off",
	nodeEncKeyMissing:  "key_missing",
	nodeEncNoConfigMap: "configmap_missing",
	nodeEncInvalid:     "invalid",
}

// standsDown reports whether the state makes the agent stand down.
func (s nodeEncState) standsDown() bool {
	return s == nodeEncOff || s == nodeEncKeyMissing || s == nodeEncNoConfigMap || s == nodeEncInvalid
}

// nodeEncFacts is what the loop keeps of node encryption: the state, and
// the text that says why, for the log, the condition and the Event.
type nodeEncFacts struct {
	state nodeEncState
	why   string
}

// judge turns a reading of cilium-config into the state and its reason.
func judge(r kubewatch.Reading, what string) nodeEncFacts {
	switch {
	case r.State == kubewatch.Unknown:
		return nodeEncFacts{nodeEncUnreadable, "ConfigMap " + what + " could not be read (see the log): node encryption is not known, so nothing is changed until it is read"}
	case r.State == kubewatch.Absent:
		return nodeEncFacts{nodeEncNoConfigMap, "ConfigMap " + what + " does not exist (Cilium is not installed there, or --cilium-namespace and --cilium-configmap name another place): node encryption is not on"}
	case !r.HasKey:
		return nodeEncFacts{nodeEncKeyMissing, "ConfigMap " + what + " has no " + encryptNodeKey + ": node encryption is not configured (or Cilium removed it, as 1.22 plans)"}
	}
	// Cilium reads the value with viper's GetBool: strconv.ParseBool's
	// forms, anything else false.
	on, err := strconv.ParseBool(r.Value)
	switch {
	case err != nil:
		return nodeEncFacts{nodeEncInvalid, fmt.Sprintf("%s is %q in ConfigMap %s, not a boolean: Cilium reads it as false, so node encryption is off", encryptNodeKey, kubeapi.OneLine(r.Value), what)}
	case !on:
		return nodeEncFacts{nodeEncOff, fmt.Sprintf("%s is %q in ConfigMap %s: node encryption is off", encryptNodeKey, r.Value, what)}
	}
	return nodeEncFacts{nodeEncOn, fmt.Sprintf("%s is %q in ConfigMap %s: node encryption is on", encryptNodeKey, r.Value, what)}
}
