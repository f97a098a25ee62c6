package kubewatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/marksplit/marksplit/internal/kubeapi"
)

// wireObject is what is decoded of the object, of a list's item and of a watch event's
// object. The fields of a Status (an ERROR event's object) share it.
type wireObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	// Data is a ConfigMap's data, undecoded: only Config.Key is ever read from it.
	Data json.RawMessage `json:"data"`

	// Of a Status.
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// wireItems keeps the first two items of a list and counts them all, decoding one item
// at a time.
type wireItems struct {
	first []wireObject
	n     int
}

func (it *wireItems) UnmarshalJSON(data []byte) error {
	*it = wireItems{}
	if string(data) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return errors.New("items: not an array")
	}
	for dec.More() {
		var o wireObject
		if err := dec.Decode(&o); err != nil {
			return fmt.Errorf("item %d: %w", it.n, err)
		}
		if it.n++; len(it.first) < 2 {
			it.first = append(it.first, o)
		}
	}
	return nil
}

// list reads the list of the one name: its resourceVersion, and whether the object is in
// it.
func (w *Watcher) list(ctx context.Context) (rv string, s Reading, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("kubewatch: list %s: %w", w.what, err)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
	defer cancel()
	resp, err := w.get(ctx, w.listURL)
	if err != nil {
		return "", Reading{}, err
	}
	defer resp.Body.Close()
	body, err := readLimited(resp.Body, MaxBody)
	if err == nil {
		err = context.Cause(ctx) // a body cut by the timeout may read as complete
	}
	if err != nil {
		return "", Reading{}, fmt.Errorf("read body: %w", err)
	}
	var l struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items wireItems `json:"items"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return "", Reading{}, fmt.Errorf("decode %sList: %w", w.cfg.Kind, err)
	}
	switch {
	case l.APIVersion != w.cfg.APIVersion || l.Kind != w.cfg.Kind+"List":
		return "", Reading{}, fmt.Errorf("got %q %q, want %s %sList", kubeapi.OneLine(l.APIVersion), kubeapi.OneLine(l.Kind), w.cfg.APIVersion, w.cfg.Kind)
	case l.Metadata.ResourceVersion == "":
		return "", Reading{}, fmt.Errorf("%sList without metadata.resourceVersion", w.cfg.Kind)
	case l.Items.n > 1:
		return "", Reading{}, fmt.Errorf("%d items for one name", l.Items.n)
	case l.Items.n == 0:
		return l.Metadata.ResourceVersion, Reading{State: Absent}, nil
	}
	if err := w.check(&l.Items.first[0], true); err != nil {
		return "", Reading{}, err
	}
	r, err := w.present(&l.Items.first[0])
	if err != nil {
		return "", Reading{}, err
	}
	return l.Metadata.ResourceVersion, r, nil
}

// present is the reading of an object that exists: its Config.Key, if any.
func (w *Watcher) present(o *wireObject) (Reading, error) {
	r := Reading{State: Present}
	if w.cfg.Key == "" || len(o.Data) == 0 || string(o.Data) == "null" {
		return r, nil
	}
	var data map[string]json.RawMessage
	if err := json.Unmarshal(o.Data, &data); err != nil {
		return Reading{}, fmt.Errorf("data: %w", err)
	}
	v, ok := data[w.cfg.Key]
	if !ok {
		return r, nil
	}
	if err := json.Unmarshal(v, &r.Value); err != nil {
		return Reading{}, fmt.Errorf("data[%q]: not a string: %s", w.cfg.Key, kubeapi.OneLine(string(v)))
	}
	r.HasKey = true
	return r, nil
}

// check checks an object: its name, and its apiVersion and kind when it has them (a
// list's items may omit them).
func (w *Watcher) check(o *wireObject, lax bool) error {
	if !(lax && o.APIVersion == "" && o.Kind == "") && (o.APIVersion != w.cfg.APIVersion || o.Kind != w.cfg.Kind) {
		return fmt.Errorf("got %q %q, want %s %s", kubeapi.OneLine(o.APIVersion), kubeapi.OneLine(o.Kind), w.cfg.APIVersion, w.cfg.Kind)
	}
	if o.Metadata.Name != w.cfg.Name {
		return fmt.Errorf("got %s %q, want %q", w.cfg.Kind, kubeapi.OneLine(o.Metadata.Name), w.cfg.Name)
	}
	return nil
}

// readLimited reads r whole, failing beyond max bytes.
func readLimited(r io.Reader, max int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("answer larger than %d bytes", max)
	}
	return b, err
}

// watch watches from rv until the resync is due, ctx ends or the watch ends, calling set
// with the state each change event says.
func (w *Watcher) watch(ctx context.Context, rv string, resyncAt time.Time, set func(Reading)) kubeapi.WatchEnd {
	end := kubeapi.WatchEnd{RV: rv}
	wctx := kubeapi.StartWatch(ctx, resyncAt, w.cfg.WatchTimeout)
	defer wctx.Stop()

	fail := func(kind kubeapi.EndKind, err error) kubeapi.WatchEnd {
		switch {
		case ctx.Err() != nil:
			end.Kind = kubeapi.EndCanceled
		case wctx.ResyncDue():
			end.Kind = kubeapi.EndResync
		case wctx.Silent():
			end.Kind = kubeapi.EndClosed
			end.Err = fmt.Errorf("kubewatch: watch %s: no complete event for %v", w.what, w.cfg.WatchTimeout)
		default:
			end.Kind = kind
			end.Err = fmt.Errorf("kubewatch: watch %s from resourceVersion %s: %w", w.what, kubeapi.OneLine(rv), err)
		}
		return end
	}

	resp, err := w.get(wctx, w.listURL+"&watch=1&allowWatchBookmarks=true&resourceVersion="+url.QueryEscape(rv))
	if err != nil {
		var se *kubeapi.StatusError
		if errors.As(err, &se) && se.Code == http.StatusGone {
			return fail(kubeapi.EndGone, err)
		}
		return fail(kubeapi.EndFailed, err)
	}
	defer resp.Body.Close()
	lim := &eventLimit{r: resp.Body}
	dec := json.NewDecoder(lim)
	for {
		var ev struct {
			Type   string     `json:"type"`
			Object wireObject `json:"object"`
		}
		start := dec.InputOffset()
		err := dec.Decode(&ev)
		lim.n = 0
		switch {
		case wctx.Err() != nil:
			return fail(kubeapi.EndFailed, err)
		case err == io.EOF:
			end.Kind = kubeapi.EndClosed
			return end
		case err == nil && dec.InputOffset()-start > MaxBody, lim.tooLarge:
			return fail(kubeapi.EndFailed, fmt.Errorf("an event larger than %d bytes", MaxBody))
		case err != nil:
			var typeErr *json.UnmarshalTypeError
			if errors.As(err, &typeErr) {
				return fail(kubeapi.EndCorrupt, fmt.Errorf("decode event: %w", err)) // a whole value: not to be trusted
			}
			return fail(kubeapi.EndFailed, fmt.Errorf("decode event: %w", err))
		}
		wctx.Event()
		if err := w.event(ev.Type, &ev.Object, set); err != nil {
			switch {
			case ev.Type != "ERROR":
				return fail(kubeapi.EndCorrupt, err)
			case ev.Object.Code == http.StatusGone:
				return fail(kubeapi.EndGone, err)
			}
			return fail(kubeapi.EndFailed, err)
		}
		end.RV, end.Progress = ev.Object.Metadata.ResourceVersion, true
	}
}

// event applies one watch event.
func (w *Watcher) event(typ string, o *wireObject, set func(Reading)) error {
	switch typ {
	case "ADDED", "MODIFIED", "DELETED":
		if err := w.check(o, false); err != nil {
			return fmt.Errorf("%s event: %w", typ, err)
		}
		if o.Metadata.ResourceVersion == "" {
			return fmt.Errorf("%s event without metadata.resourceVersion", typ)
		}
		if typ == "DELETED" {
			set(Reading{State: Absent})
			break
		}
		r, err := w.present(o)
		if err != nil {
			return fmt.Errorf("%s event: %w", typ, err)
		}
		set(r)
	case "BOOKMARK":
		if o.Metadata.ResourceVersion == "" {
			return errors.New("BOOKMARK event without metadata.resourceVersion")
		}
	case "ERROR":
		if o.Kind != "Status" {
			return errors.New("ERROR event without a Status")
		}
		return fmt.Errorf("ERROR event: %d %s: %s", o.Code, kubeapi.OneLine(o.Reason), kubeapi.OneLine(o.Message))
	default:
		return fmt.Errorf("unknown event type %q", kubeapi.OneLine(typ))
	}
	return nil
}

// eventLimit fails a read once more than 2*MaxBody bytes were read for one event (the
// decoder reads ahead up to its buffer): an endless event does not fill memory.
type eventLimit struct {
	r        io.Reader
	n        int
	tooLarge bool
}

func (l *eventLimit) Read(p []byte) (int, error) {
	if l.n > 2*MaxBody {
		l.tooLarge = true
		return 0, errors.New("event too large")
	}
	n, err := l.r.Read(p)
	l.n += n
	return n, err
}
