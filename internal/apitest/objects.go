package apitest

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
)

// Node is a CiliumNode as a test describes it.
type Node struct {
	// Name is metadata.name.
	Name string
	// InternalIPs are spec.addresses of type InternalIP, as written (a test may put an
	// invalid one). Every node also gets a CiliumInternalIP, which readers must ignore.
	InternalIPs []string
	// Key is spec.encryption.key: 255 on an encrypting node in a Cilium cluster; 0 (the key
	// left out, as Cilium does) on a node opted out of node encryption.
	Key int64
	// Patch, if set, edits the rendered object (a map decoded from its JSON) before it is
	// served: for objects the fields above cannot describe, such as a key of the wrong
	// type. metadata.resourceVersion is set after Patch.
	Patch func(obj map[string]any)
}

func (n Node) clone() Node {
	n.InternalIPs = slices.Clone(n.InternalIPs)
	return n
}

// object is a stored CiliumNode: immutable once made.
type object struct {
	node Node
	rv   uint64
	json []byte // the rendered object, with rv
}

// event is one entry of the watch history.
type event struct {
	typ  string // ADDED, MODIFIED, DELETED
	rv   uint64
	name string
	line []byte // {"type":...,"object":...}\n
}

func newEvent(typ string, o *object) event {
	line := make([]byte, 0, len(o.json)+32)
	line = append(line, `{"type":"`...)
	line = append(line, typ...)
	line = append(line, `","object":`...)
	line = append(line, o.json...)
	line = append(line, "}\n"...)
	return event{typ: typ, rv: o.rv, name: o.node.Name, line: line}
}

// render returns the JSON of n at resourceVersion rv, shaped like a Cilium 1.19 cluster's
// CiliumNode.
func render(n Node, rv uint64) ([]byte, error) {
	h := fnv.New32a()
	h.Write([]byte(n.Name))
	id := h.Sum32()
	third, fourth := (id>>8)&0xff, id&0xff
	addrs := []any{}
	for _, ip := range n.InternalIPs {
		addrs = append(addrs, map[string]any{"type": "InternalIP", "ip": ip})
	}
	addrs = append(addrs, map[string]any{"type": "CiliumInternalIP", "ip": fmt.Sprintf("10.244.%d.%d", third, fourth)})
	enc := map[string]any{}
	if n.Key != 0 {
		enc["key"] = n.Key
	}
	obj := map[string]any{
		"apiVersion": "cilium.io/v2",
		"kind":       "CiliumNode",
		"metadata": map[string]any{
			"name":              n.Name,
			"uid":               fmt.Sprintf("%08x-3f52-4a7e-9a53-1d2f0f4b6c11", id),
			"generation":        3,
			"creationTimestamp": "2025-06-02T09:14:11Z",
			"labels": map[string]any{
				"kubernetes.io/arch":     "amd64",
				"kubernetes.io/hostname": n.Name,
				"kubernetes.io/os":       "linux",
			},
			"annotations": map[string]any{
				"network.cilium.io/wg-pub-key": "hV2a7m1yqk7wEe0y2m8bq3M0X1xv8cJ9l1rZ7j0kqGo=",
			},
			"ownerReferences": []any{map[string]any{
				"apiVersion": "v1", "kind": "Node", "name": n.Name,
				"uid": fmt.Sprintf("%08x-6a3f-4f0e-8d51-2d1f3c9a7e20", id),
			}},
		},
		"spec": map[string]any{
			"addresses":     addrs,
			"alibaba-cloud": map[string]any{},
			"azure":         map[string]any{},
			"bootid":        fmt.Sprintf("%08x-1d7a-4b8e-9d0c-5a1b2c3d4e5f", id),
			"encryption":    enc,
			"eni":           map[string]any{},
			"health":        map[string]any{"ipv4": fmt.Sprintf("10.244.%d.23", third)},
			"ingress":       map[string]any{},
			"ipam": map[string]any{
				"podCIDRs": []any{fmt.Sprintf("10.244.%d.0/24", third)},
				"pools":    map[string]any{},
			},
		},
		"status": map[string]any{
			"alibaba-cloud": map[string]any{},
			"azure":         map[string]any{},
			"eni":           map[string]any{},
			"ipam":          map[string]any{"operator-status": map[string]any{}},
		},
	}
	if n.Patch != nil {
		n.Patch(obj)
	}
	if md, ok := obj["metadata"].(map[string]any); ok {
		md["resourceVersion"] = strconv.FormatUint(rv, 10)
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("apitest: render CiliumNode %q: %w", n.Name, err)
	}
	return b, nil
}

// bookmarkLine is a BOOKMARK event at rv.
func bookmarkLine(rv uint64) []byte {
	return []byte(`{"type":"BOOKMARK","object":{"kind":"CiliumNode","apiVersion":"cilium.io/v2","metadata":{"resourceVersion":"` +
		strconv.FormatUint(rv, 10) + `","creationTimestamp":null}}}` + "\n")
}

// errorLine is an ERROR event holding a Status.
func errorLine(code int, reason, message string) []byte {
	return []byte(`{"type":"ERROR","object":` + statusJSON(code, reason, message) + "}\n")
}

// statusJSON is a Status object as kube-apiserver sends in error answers and ERROR events.
func statusJSON(code int, reason, message string) string {
	b, _ := json.Marshal(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": message, "reason": reason, "code": code,
	})
	return string(b)
}
