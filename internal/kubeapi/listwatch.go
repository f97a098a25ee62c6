package kubeapi

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// EndKind is how a watch ended, which says what the list-watch loop does next.
type EndKind int

// How a watch ends.
const (
	EndCanceled EndKind = iota // the loop's context ended: return
	EndResync                  // the resync is due: read again at once
	EndGone                    // 410: read again (logged at info)
	EndClosed                  // the server ended it cleanly, or it went silent: resume from RV
	EndFailed                  // an error: back off, then resume from RV
	EndCorrupt                 // an event that cannot be skipped: back off, then read again
)

// WatchEnd is how one watch ended.
type WatchEnd struct {
	Kind     EndKind
	RV       string // the last resourceVersion seen (the one the watch started from if none)
	Progress bool   // at least one event arrived
	Err      error  // why it ended; nil when the server ended it cleanly
}

// ListWatch is the list-watch loop every watcher of the agent runs, with the hooks that
// make it one: read the whole state, then watch from its resourceVersion; resume a watch
// that ends from the last resourceVersion seen; read again on 410, on an event that cannot
// be skipped and every Resync; back off after failures. The back-off is reset by a read,
// unless watches keep failing right after it without an event, and by a watch's events.
type ListWatch struct {
	// Read reads the whole state (a list, page by page, or a GET), takes it as the new
	// state and returns the resourceVersion to watch from.
	Read func(ctx context.Context) (rv string, err error)
	// ReadFailed logs a failed read, which is retried in d.
	ReadFailed func(err error, d time.Duration)
	// Watch watches from rv until resyncAt (zero: never), ctx ends or the watch ends,
	// applying events as they arrive.
	Watch func(ctx context.Context, rv string, resyncAt time.Time) WatchEnd
	// Resync is how often the state is read again while the watch is healthy; 0 never.
	Resync  time.Duration
	Backoff backoff.BackOff
	Logger  *slog.Logger
	// For messages: Prefix is the package ("ciliumnode"); What is watched, under the
	// log attribute Attr ("object", "ConfigMap kube-system/x"); Kept says what stands
	// on failures ("keeping the last mode"); Again what a read is ("listing again").
	Prefix, Attr, What string
	Kept               func() string
	Again              string
}

// Run reads and watches until ctx ends.
func (lw *ListWatch) Run(ctx context.Context) {
	b := lw.Backoff
	b.Reset()
	var (
		rv       string    // where the next watch starts; "" means read first
		resyncAt time.Time // when the next full read is due; zero with no resync
		// failing is set while watches fail without delivering an event, so that the
		// reads in between do not reset the back-off and a broken watch is not retried hot.
		failing bool
	)
	for ctx.Err() == nil {
		if rv == "" || !resyncAt.IsZero() && !time.Now().Before(resyncAt) {
			got, err := lw.Read(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				rv = ""
				d := NextBackOff(b)
				lw.ReadFailed(err, d)
				if !Sleep(ctx, d) {
					return
				}
				continue
			}
			rv = got
			if lw.Resync > 0 {
				resyncAt = time.Now().Add(lw.Resync)
			}
			if !failing {
				b.Reset()
			}
		}
		end := lw.Watch(ctx, rv, resyncAt)
		rv = end.RV
		if end.Progress {
			failing = false
			b.Reset()
		}
		if !lw.ended(ctx, end, &rv, &failing) {
			return
		}
	}
}

// ended handles the end of a watch: what to log, whether to read again (rv set to ""),
// and how long to wait. It reports whether ctx is still live.
func (lw *ListWatch) ended(ctx context.Context, end WatchEnd, rv *string, failing *bool) bool {
	log, b := lw.Logger, lw.Backoff
	switch end.Kind {
	case EndCanceled:
		return false
	case EndResync:
		log.Debug(lw.Prefix+": resync", lw.Attr, lw.What)
		*rv = ""
		return true
	case EndGone:
		log.Info(end.Err.Error() + "; " + lw.Again)
		*rv = ""
	case EndClosed:
		if end.Err != nil {
			log.Warn(end.Err.Error()+"; restarting it", "resource_version", *rv)
		} else {
			log.Debug(lw.Prefix+": watch ended; resuming", lw.Attr, lw.What, "resource_version", *rv)
		}
	case EndFailed, EndCorrupt:
		d := NextBackOff(b)
		if end.Kind == EndCorrupt {
			log.Warn(end.Err.Error()+"; "+lw.Kept()+" and "+lw.Again, "retry_in_s", d.Seconds())
			*rv = ""
		} else {
			log.Warn(end.Err.Error()+"; "+lw.Kept(), "retry_in_s", d.Seconds())
		}
		*failing = !end.Progress
		return Sleep(ctx, d)
	}
	if end.Progress {
		return true
	}
	*failing = true
	return Sleep(ctx, NextBackOff(b))
}

// Errors a watch's context is canceled with (see StartWatch).
var (
	errResync = errors.New("resync due")
	errSilent = errors.New("watch silent")
)

// Watch is the context of one watch: it ends when the loop's context ends, when the
// resync is due, or when no complete event arrived for the watch timeout.
type Watch struct {
	context.Context
	cancel  context.CancelCauseFunc
	resync  *time.Timer // nil with no resync
	silence *time.Timer
	timeout time.Duration
}

// StartWatch starts a watch's context; call Stop when the watch ends.
func StartWatch(ctx context.Context, resyncAt time.Time, timeout time.Duration) *Watch {
	wctx, cancel := context.WithCancelCause(ctx)
	w := &Watch{Context: wctx, cancel: cancel, timeout: timeout}
	if !resyncAt.IsZero() {
		w.resync = time.AfterFunc(time.Until(resyncAt), func() { cancel(errResync) })
	}
	// The silence timer is pushed back by complete events only, not by bytes: a server
	// that trickles bytes without ever completing an event is restarted all the same.
	w.silence = time.AfterFunc(timeout, func() { cancel(errSilent) })
	return w
}

// Event pushes the silence timer back: call it after each complete event.
func (w *Watch) Event() { w.silence.Reset(w.timeout) }

// Stop stops the timers and cancels the context.
func (w *Watch) Stop() {
	if w.resync != nil {
		w.resync.Stop()
	}
	w.silence.Stop()
	w.cancel(nil)
}

// ResyncDue reports whether the watch was ended because the resync is due.
func (w *Watch) ResyncDue() bool { return context.Cause(w.Context) == errResync }

// Silent reports whether the watch was ended because no complete event arrived for the
// watch timeout.
func (w *Watch) Silent() bool { return context.Cause(w.Context) == errSilent }
