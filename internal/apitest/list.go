package apitest

import (
	"bufio"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// snapshot is the state a paginated list is cut from.
type snapshot struct {
	rv    uint64
	items []*object // sorted by name
}

const expiredContinue = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list."

// list answers a LIST: one page of a snapshot, taken now or named by the continue token.
func (s *Server) list(w http.ResponseWriter, r *http.Request, fieldName string) {
	q := r.URL.Query()
	limit := 0
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			writeStatus(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("invalid limit %q", l))
			return
		}
		limit = n
	}
	if m := s.opts.MaxPageSize; m > 0 && (limit == 0 || limit > m) {
		limit = m
	}

	s.mu.Lock()
	var (
		snapID uint64
		snap   *snapshot
		offset int
	)
	if c := q.Get("continue"); c != "" {
		id, off, ok := parseContinue(c)
		if snap = s.snapshots[id]; !ok || snap == nil {
			s.mu.Unlock()
			writeStatus(w, http.StatusGone, "Expired", expiredContinue)
			return
		}
		snapID, offset = id, off
	} else {
		snap = &snapshot{rv: s.rv}
		for _, name := range slices.Sorted(maps.Keys(s.nodes)) {
			if fieldName == "" || name == fieldName {
				snap.items = append(snap.items, s.nodes[name])
			}
		}
	}
	end := len(snap.items)
	if limit > 0 && offset+limit < end {
		end = offset + limit
	}
	page := snap.items[min(offset, end):end]
	endless := s.endless
	if endless && end == len(snap.items) {
		end = 0 // and round again
	}
	cont := ""
	if end < len(snap.items) || endless {
		if snapID == 0 {
			s.nextSnap++
			snapID = s.nextSnap
			s.snapshots[snapID] = snap
			for len(s.snapshots) > maxSnapshots {
				delete(s.snapshots, slices.MinFunc(slices.Collect(maps.Keys(s.snapshots)), cmp.Compare[uint64]))
			}
		}
		cont = makeContinue(snapID, end)
		if endless {
			s.pages++
			cont += "." + strconv.FormatUint(s.pages, 10) // a new token every page
		}
	} else if snapID != 0 {
		delete(s.snapshots, snapID) // the last page: the token is spent
	}
	s.mu.Unlock()

	meta := map[string]any{"resourceVersion": strconv.FormatUint(snap.rv, 10)}
	if cont != "" {
		meta["continue"] = cont
		meta["remainingItemCount"] = max(len(snap.items)-end, 1)
	}
	mj, _ := json.Marshal(meta)
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"apiVersion":"cilium.io/v2","kind":"CiliumNodeList","metadata":`)
	bw.Write(mj)
	bw.WriteString(`,"items":[`)
	for i, o := range page {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(o.json)
	}
	bw.WriteString("]}\n")
	bw.Flush()
}

func makeContinue(id uint64, offset int) string {
	return base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("apitest:%d:%d", id, offset)))
}

func parseContinue(c string) (id uint64, offset int, ok bool) {
	c, _, _ = strings.Cut(c, ".")
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return 0, 0, false
	}
	parts := strings.Split(string(b), ":")
	if len(parts) != 3 || parts[0] != "apitest" {
		return 0, 0, false
	}
	id, err1 := strconv.ParseUint(parts[1], 10, 64)
	offset, err2 := strconv.Atoi(parts[2])
	return id, offset, err1 == nil && err2 == nil && offset >= 0
}
