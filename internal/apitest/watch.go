package apitest

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"time"
)

// watcher is one open watch.
type watcher struct {
	name      string // of a field selector; "" for every node
	bookmarks bool
	ctl       chan control
}

type controlKind int

const (
	ctlEnd      controlKind = iota // end cleanly
	ctlDrop                        // break the connection
	ctlExpire                      // ERROR 410, then end
	ctlRaw                         // write data
	ctlBookmark                    // send a bookmark
)

type control struct {
	kind controlKind
	data []byte
}

// watch answers a WATCH: the history after its resourceVersion, then every change as it
// happens, until the deadline, a control, the client or the server ends it.
func (s *Server) watch(w http.ResponseWriter, r *http.Request, fieldName string) {
	q := r.URL.Query()
	var deadline time.Duration
	if ts := q.Get("timeoutSeconds"); ts != "" {
		n, err := strconv.Atoi(ts)
		if err != nil || n < 0 {
			writeStatus(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("invalid timeoutSeconds %q", ts))
			return
		}
		deadline = time.Duration(n) * time.Second
	} else if m := s.opts.MinRequestTimeout; m > 0 {
		deadline = time.Duration(float64(m) * (1 + rand.Float64()))
	}
	wt := &watcher{name: fieldName, bookmarks: q.Get("allowWatchBookmarks") == "true", ctl: make(chan control, 16)}

	s.mu.Lock()
	var (
		pos     uint64
		initial [][]byte
	)
	switch rv := q.Get("resourceVersion"); rv {
	case "", "0":
		// Start at the most recent state: one ADDED event per object.
		pos = s.rv
		for _, name := range slices.Sorted(maps.Keys(s.nodes)) {
			if fieldName == "" || name == fieldName {
				initial = append(initial, newEvent("ADDED", s.nodes[name]).line)
			}
		}
	default:
		v, err := strconv.ParseUint(rv, 10, 64)
		if err != nil {
			s.mu.Unlock()
			writeStatus(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("invalid resource version %q", rv))
			return
		}
		if v > s.rv {
			cur := s.rv
			s.mu.Unlock()
			writeStatus(w, http.StatusGatewayTimeout, "Timeout", fmt.Sprintf("Too large resource version: %d, current: %d", v, cur))
			return
		}
		pos = v
	}
	s.watchers[wt] = struct{}{}
	s.wakeLocked()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, wt)
		s.wakeLocked()
		s.mu.Unlock()
	}()

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	for _, line := range initial {
		w.Write(line)
	}
	w.(http.Flusher).Flush()

	var bookmarkC, deadlineC <-chan time.Time
	if wt.bookmarks && s.opts.BookmarkInterval > 0 {
		t := time.NewTicker(s.opts.BookmarkInterval)
		defer t.Stop()
		bookmarkC = t.C
	}
	if deadline > 0 {
		t := time.NewTimer(deadline)
		defer t.Stop()
		deadlineC = t.C
	}
	write := func(b []byte) {
		w.Write(b)
		w.(http.Flusher).Flush()
	}
	bookmark := func(hang bool) {
		if wt.bookmarks && !hang {
			write(bookmarkLine(pos))
		}
	}
	for {
		s.mu.Lock()
		expired := pos < s.compacted
		var lines [][]byte
		if !expired && !s.hang {
			i := sort.Search(len(s.events), func(i int) bool { return s.events[i].rv > pos })
			for _, ev := range s.events[i:] {
				if fieldName == "" || ev.name == fieldName {
					lines = append(lines, ev.line)
				}
			}
			pos = s.rv
		}
		changed, hang := s.changed, s.hang
		s.mu.Unlock()
		if expired && !hang {
			write(errorLine(http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d (%d)", pos, s.compactedRV())))
			return
		}
		if len(lines) > 0 {
			for _, line := range lines {
				w.Write(line)
			}
			w.(http.Flusher).Flush()
		}
		select {
		case <-changed:
		case c := <-wt.ctl:
			switch c.kind {
			case ctlEnd:
				return
			case ctlDrop:
				panic(http.ErrAbortHandler)
			case ctlExpire:
				write(errorLine(http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d (%d)", pos, s.compactedRV())))
				return
			case ctlRaw:
				write(c.data)
			case ctlBookmark:
				bookmark(hang)
			}
		case <-bookmarkC:
			bookmark(hang)
		case <-deadlineC:
			bookmark(hang)
			return
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		}
	}
}

func (s *Server) compactedRV() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.compacted
}

// wakeLocked wakes every watch and every AwaitWatches.
func (s *Server) wakeLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// signal sends c to every open watch and returns how many there were.
func (s *Server) signal(c control) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for wt := range s.watchers {
		select {
		case wt.ctl <- c:
		default: // 16 controls behind: it is not reading them anyway
		}
	}
	return len(s.watchers)
}

// ExpireWatches sends every open watch an ERROR event 410 ("too old resource version") and
// ends it, and returns how many there were.
func (s *Server) ExpireWatches() int { return s.signal(control{kind: ctlExpire}) }

// DropWatches breaks every open watch mid-stream (the connection closed, or the HTTP/2
// stream reset) and returns how many there were.
func (s *Server) DropWatches() int { return s.signal(control{kind: ctlDrop}) }

// EndWatches ends every open watch cleanly, as the server's timeout does, and returns how
// many there were.
func (s *Server) EndWatches() int { return s.signal(control{kind: ctlEnd}) }

// SendRaw writes data as it is to every open watch (garbage, half an event) and returns
// how many there were.
func (s *Server) SendRaw(data string) int { return s.signal(control{kind: ctlRaw, data: []byte(data)}) }

// Bookmark sends a BOOKMARK now to every open watch that asked for bookmarks, and returns
// how many watches are open.
func (s *Server) Bookmark() int { return s.signal(control{kind: ctlBookmark}) }

// HangWatches, while on, makes every watch, open or new, send nothing: no events, no
// bookmarks, no ERROR. Events are kept and flow again when it is turned off (to the watches
// whose client has not given up yet).
func (s *Server) HangWatches(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hang = on
	s.wakeLocked()
}

// OpenWatches returns the number of open watches.
func (s *Server) OpenWatches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watchers)
}

// AwaitWatches waits until at least n watches are open, or ctx ends.
func (s *Server) AwaitWatches(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		open, changed := len(s.watchers), s.changed
		s.mu.Unlock()
		if open >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("apitest: %d watches open, want %d: %w", open, n, context.Cause(ctx))
		case <-s.closing:
			return fmt.Errorf("apitest: server closed with %d watches open, want %d", open, n)
		}
	}
}
