package ciliumnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
)

// reader is what a source plugs into the list-watch loop: how to read the whole state and
// how to apply one event.
type reader interface {
	// read reads the whole state (a GET of one object, or a list of every object, page by
	// page), takes it as the new state and returns the resourceVersion to watch from. An
	// error wrapping errNotFound is logged at info level, others at warn level.
	read(ctx context.Context) (rv string, err error)
	// event applies one ADDED, MODIFIED or DELETED event whose object has a
	// resourceVersion. decodeErr is set when the object decoded only in part (a field of
	// the wrong type, or larger than maxBody): o holds what did. An error means the object
	// cannot be skipped: the state is read again.
	event(typ string, o *wireObject, decodeErr error) error
}

// listWatch is the one list-watch loop of both sources: read, then watch from the
// resourceVersion with bookmarks; resume a watch that ends from the last resourceVersion
// seen; read again on 410, on an object that cannot be skipped and every resync; restart a
// watch that completes no event for WatchTimeout; back off after failures.
type listWatch struct {
	cfg      Config // settled
	client   *http.Client
	watchURL string        // without the resourceVersion value, which is appended
	what     string        // what is watched, for messages: a node's name, or "CiliumNodes"
	kept     string        // what stands on failures, for messages: "the last mode"
	again    string        // what a read is, for messages: "reading the object again"
	resync   time.Duration // read again this often while the watch is healthy; 0 never
	count    func(outcome)
	r        reader
	// ownClient is set when the client was made for this source: its idle connections
	// are closed when Run returns.
	ownClient bool
	running   atomic.Bool
}

// newListWatch settles cfg (checks it and fills in its defaults) and makes the client, for
// a source to complete the loop with its URLs, messages and reader. It returns the server's
// URL without a trailing slash.
func newListWatch(cfg Config) (lw *listWatch, server string, err error) {
	if server, err = settle(&cfg); err != nil {
		return nil, "", err
	}
	client, own, err := httpClient(cfg)
	if err != nil {
		return nil, "", err
	}
	return &listWatch{cfg: cfg, client: client, ownClient: own}, server, nil
}

// start is a source's Run: it refuses a nil report func and a second Run at a time, calls
// begin, then runs the loop until ctx ends.
func (lw *listWatch) start(ctx context.Context, nilReport bool, begin func()) error {
	if nilReport {
		return errors.New("ciliumnode: Run: nil report func")
	}
	if !lw.running.CompareAndSwap(false, true) {
		return errors.New("ciliumnode: Run: already running")
	}
	defer lw.running.Store(false)
	if lw.ownClient {
		defer lw.client.CloseIdleConnections()
	}
	begin()
	lw.run(ctx)
	return nil
}

// run reads and watches until ctx ends, in the one list-watch loop.
func (lw *listWatch) run(ctx context.Context) {
	log := lw.cfg.Logger
	loop := kubeapi.ListWatch{
		Read: lw.r.read,
		ReadFailed: func(err error, d time.Duration) {
			if errors.Is(err, errNotFound) {
				log.Info(err.Error(), "retry_in_s", d.Seconds())
			} else {
				log.Warn(err.Error(), "retry_in_s", d.Seconds())
			}
		},
		Watch:   lw.watch,
		Resync:  lw.resync,
		Backoff: lw.cfg.Backoff,
		Logger:  log,
		Prefix:  "ciliumnode", Attr: "watch", What: lw.what,
		Kept:  func() string { return "keeping " + lw.kept },
		Again: lw.again,
	}
	loop.Run(ctx)
}

// watchEvent is one event of a watch.
type watchEvent struct {
	Type   string     `json:"type"`
	Object wireObject `json:"object"`
}

// watch watches from resourceVersion rv until the resync is due, ctx ends or the watch
// ends, applying events as they arrive.
func (lw *listWatch) watch(ctx context.Context, rv string, resyncAt time.Time) kubeapi.WatchEnd {
	end := kubeapi.WatchEnd{RV: rv}
	wctx := kubeapi.StartWatch(ctx, resyncAt, lw.cfg.WatchTimeout)
	defer wctx.Stop()

	fail := func(kind kubeapi.EndKind, o outcome, err error) kubeapi.WatchEnd {
		switch {
		case ctx.Err() != nil:
			end.Kind = kubeapi.EndCanceled
		case wctx.ResyncDue():
			lw.count(outcomeOK)
			end.Kind = kubeapi.EndResync
		case wctx.Silent():
			lw.count(outcomeWatchRestart)
			end.Kind = kubeapi.EndClosed
			end.Err = fmt.Errorf("ciliumnode: watch %s: no complete event for %v", lw.what, lw.cfg.WatchTimeout)
		default:
			lw.count(o)
			end.Kind = kind
			if o == outcomeGone {
				end.Kind = kubeapi.EndGone
			}
			end.Err = fmt.Errorf("ciliumnode: watch %s from resourceVersion %s: %w", lw.what, rv, err)
		}
		return end
	}

	resp, o, err := do(wctx, lw.client, lw.cfg.TokenFile, lw.watchURL+url.QueryEscape(rv))
	if err != nil {
		return fail(kubeapi.EndFailed, o, err)
	}
	defer resp.Body.Close()
	lim := &objectLimit{r: resp.Body}
	dec := json.NewDecoder(lim)
	for {
		var ev watchEvent
		err := decodeBounded(dec, lim, &ev)
		switch {
		case err == nil, skippable(err) && isChange(ev.Type):
		case skippable(err) && ev.Type == "ERROR":
			return fail(kubeapi.EndFailed, outcomeDecodeError, errors.New("ERROR event without a Status"))
		case wctx.Err() != nil:
			// Canceled: by Run's context, the resync or the silence timer. Over HTTP/1.1
			// the cut body may even read as a clean io.EOF.
			return fail(kubeapi.EndFailed, outcomeNone, err)
		case err == io.EOF:
			lw.count(outcomeWatchRestart)
			end.Kind = kubeapi.EndClosed
			return end
		case skippable(err):
			return fail(kubeapi.EndCorrupt, outcomeDecodeError, fmt.Errorf("%s event: %w", kubeapi.OneLine(ev.Type), err))
		case errors.Is(lim.err, errObjectTooLarge):
			return fail(kubeapi.EndFailed, outcomeDecodeError, fmt.Errorf("decode event: %w", errObjectTooLarge))
		case lim.err != nil && lim.err != io.EOF, errors.Is(err, io.ErrUnexpectedEOF):
			return fail(kubeapi.EndFailed, outcomeNetworkError, err)
		default:
			return fail(kubeapi.EndFailed, outcomeDecodeError, fmt.Errorf("decode event: %w", err))
		}
		wctx.Event()
		ek, oc, err := lw.apply(&ev, err)
		if err != nil {
			return fail(ek, oc, err)
		}
		end.RV, end.Progress = ev.Object.Metadata.ResourceVersion, true
	}
}

func isChange(typ string) bool { return typ == "ADDED" || typ == "MODIFIED" || typ == "DELETED" }

// apply checks one decoded event and hands a change to the reader. An error ends the watch
// as kind, counted as o.
func (lw *listWatch) apply(ev *watchEvent, decodeErr error) (end kubeapi.EndKind, o outcome, err error) {
	obj := &ev.Object
	switch {
	case isChange(ev.Type):
		if obj.Metadata.ResourceVersion == "" {
			return kubeapi.EndCorrupt, outcomeDecodeError, fmt.Errorf("%s event: %s without metadata.resourceVersion", ev.Type, kind)
		}
		if err := lw.r.event(ev.Type, obj, decodeErr); err != nil {
			return kubeapi.EndCorrupt, outcomeDecodeError, fmt.Errorf("%s event: %w", ev.Type, err)
		}
	case ev.Type == "BOOKMARK":
		if err := obj.checkKind(true); err != nil {
			return kubeapi.EndCorrupt, outcomeDecodeError, fmt.Errorf("BOOKMARK event: %w", err)
		}
		if obj.Metadata.ResourceVersion == "" {
			return kubeapi.EndCorrupt, outcomeDecodeError, fmt.Errorf("BOOKMARK event: %s without metadata.resourceVersion", kind)
		}
	case ev.Type == "ERROR":
		if obj.Kind != "Status" {
			return kubeapi.EndFailed, outcomeDecodeError, errors.New("ERROR event without a Status")
		}
		o = outcomeHTTPError
		if obj.Code == http.StatusGone {
			o = outcomeGone
		}
		return kubeapi.EndFailed, o, fmt.Errorf("ERROR event: %d %s: %s", obj.Code, obj.Reason, kubeapi.OneLine(obj.Message))
	default:
		return kubeapi.EndFailed, outcomeDecodeError, fmt.Errorf("unknown event type %q", kubeapi.OneLine(ev.Type))
	}
	return 0, outcomeNone, nil
}
