package apitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ConfigMaps: the server keeps ConfigMaps by namespace and name and serves, under
// /api/v1/namespaces/NS/configmaps, a list narrowed by fieldSelector=metadata.name=NAME
// and a watch of the same selection from a resourceVersion, as kube-apiserver does. The
// requests count as KindHandled (a test's Handle of a longer path wins). A new server
// holds Cilium's kube-system/cilium-config with encrypt-node "true", as a cluster with
// node encryption has (Options.NoCiliumConfig: none).

const configMapsPrefix = "/api/v1/namespaces/"

// configMap is one ConfigMap; deleted ones stay as tombstones for the watches.
type configMap struct {
	data    map[string]string
	rv      uint64
	deleted bool
}

// CiliumConfigData is the data of the cilium-config a new server holds.
func CiliumConfigData() map[string]string {
	return map[string]string{"enable-wireguard": "true", "encrypt-node": "true", "routing-mode": "native"}
}

// SetConfigMap creates or replaces the ConfigMap namespace/name with data and returns
// its resourceVersion; open watches see it as ADDED or MODIFIED.
func (s *Server) SetConfigMap(namespace, name string, data map[string]string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	d := make(map[string]string, len(data))
	for k, v := range data {
		d[k] = v
	}
	s.configMaps[namespace+"/"+name] = &configMap{data: d, rv: s.rv}
	s.configMapsChangedLocked()
	return strconv.FormatUint(s.rv, 10)
}

// DeleteConfigMap deletes the ConfigMap namespace/name; it reports whether it existed.
func (s *Server) DeleteConfigMap(namespace, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	cm := s.configMaps[namespace+"/"+name]
	if cm == nil || cm.deleted {
		return false
	}
	s.rv++
	s.configMaps[namespace+"/"+name] = &configMap{rv: s.rv, deleted: true}
	s.configMapsChangedLocked()
	return true
}

func (s *Server) configMapsChangedLocked() {
	close(s.cmChanged)
	s.cmChanged = make(chan struct{})
}

func configMapJSON(ns, name string, cm *configMap) string {
	data, _ := json.Marshal(cm.data)
	return fmt.Sprintf(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":%q,"namespace":%q,"resourceVersion":"%d"},"data":%s}`,
		name, ns, cm.rv, data)
}

// serveConfigMaps answers a list or watch of one ConfigMap.
func (s *Server) serveConfigMaps(w http.ResponseWriter, r *http.Request) {
	rest, _ := strings.CutPrefix(r.URL.Path, configMapsPrefix)
	ns, coll, ok := strings.Cut(rest, "/")
	q := r.URL.Query()
	name, named := strings.CutPrefix(q.Get("fieldSelector"), "metadata.name=")
	if !ok || coll != "configmaps" || ns == "" || !named || name == "" || r.Method != http.MethodGet {
		writeStatus(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
		return
	}
	key := ns + "/" + name
	w.Header().Set("Content-Type", "application/json")
	if q.Get("watch") != "1" && q.Get("watch") != "true" {
		s.mu.Lock()
		items := ""
		if cm := s.configMaps[key]; cm != nil && !cm.deleted {
			items = configMapJSON(ns, name, cm)
		}
		rv := s.rv
		s.mu.Unlock()
		fmt.Fprintf(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"%d"},"items":[%s]}`, rv, items)
		return
	}
	from, err := strconv.ParseUint(q.Get("resourceVersion"), 10, 64)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "a watch of a ConfigMap needs a resourceVersion")
		return
	}
	timeout := time.Duration(5+time.Now().UnixNano()%5) * time.Minute
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	last := from
	for {
		s.mu.Lock()
		cm := s.configMaps[key]
		changed := s.cmChanged
		s.mu.Unlock()
		if cm != nil && cm.rv > last {
			typ := "MODIFIED"
			obj := configMapJSON(ns, name, cm)
			if cm.deleted {
				typ = "DELETED"
				obj = configMapJSON(ns, name, &configMap{rv: cm.rv})
			}
			if _, err := fmt.Fprintf(w, `{"type":%q,"object":%s}`+"\n", typ, obj); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			last = cm.rv
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		case <-deadline.C:
			fmt.Fprintf(w, `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"%d"}}}`+"\n", last)
			return
		}
	}
}
