package kubewatch

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

// keyRun is a running Watcher with a Key and what it reported.
type keyRun struct {
	readings chan Reading
	log      *syncLog
}

func startKeyWatcher(t *testing.T, f *fakeAPI, key string) *keyRun {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("tok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &keyRun{readings: make(chan Reading, 100), log: &syncLog{}}
	client := f.srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	w, err := New(Config{
		Client:       kubeapi.Client{Server: f.srv.URL(), TokenFile: tok, HTTP: client},
		APIVersion:   "v1",
		Kind:         "ConfigMap",
		Collection:   testCollection,
		Name:         testName,
		Key:          key,
		WatchTimeout: 5 * time.Second,
		Backoff:      backoff.NewConstantBackOff(10 * time.Millisecond),
		Logger:       slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.RunKey(ctx, func(rd Reading) { r.readings <- rd }) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("RunKey: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Error("RunKey did not return within 2 min of its context's end")
		}
		if t.Failed() {
			t.Logf("log:\n%s", r.log)
		}
	})
	return r
}

func (r *keyRun) next(t *testing.T) Reading {
	t.Helper()
	select {
	case rd := <-r.readings:
		return rd
	case <-time.After(2 * time.Minute):
		t.Fatal("no reading within 2 min")
		return Reading{}
	}
}

// TestKeyFollowsValue follows one key of a ConfigMap through every change: added,
// changed, removed, a change elsewhere in the data (nothing reported), a value that is
// not a string (the last reading stands), the ConfigMap deleted.
func TestKeyFollowsValue(t *testing.T) {
	f := newFakeAPI(t)
	f.exists = true
	f.data = `{"encrypt-node":"true","enable-wireguard":"true"}`
	r := startKeyWatcher(t, f, "encrypt-node")
	want := func(step string, w Reading) {
		t.Helper()
		if got := r.next(t); got != w {
			t.Fatalf("%s: reported %+v, want %+v", step, got, w)
		}
	}
	want("first list", Reading{State: Present, Value: "true", HasKey: true})
	waitFor(t, "a watch", func() bool { return f.watching() == 1 })
	f.modify(`{"encrypt-node":"false","enable-wireguard":"true"}`)
	want("turned off", Reading{State: Present, Value: "false", HasKey: true})
	f.modify(`{"enable-wireguard":"true"}`)
	want("key removed", Reading{State: Present})
	f.modify(`{"enable-wireguard":"false"}`) // another key: nothing to report
	f.modify(`{"encrypt-node":"yes please"}`)
	want("not a boolean is still a string", Reading{State: Present, Value: "yes please", HasKey: true})
	// A value that is not a string cannot come from a real API server: the event is not
	// trusted, the list it leads to fails, and the last reading stands.
	lists := f.count("list")
	f.modify(`{"encrypt-node":true}`)
	waitFor(t, "two lists more", func() bool { return f.count("list") >= lists+2 })
	if !strings.Contains(r.log.String(), `data["encrypt-node"]: not a string: true`) {
		t.Errorf("no line names the value that is not a string:\n%s", r.log)
	}
	f.mu.Lock()
	f.data = `{"encrypt-node":"true"}`
	f.mu.Unlock()
	want("good again", Reading{State: Present, Value: "true", HasKey: true})
	waitFor(t, "a watch", func() bool { return f.watching() == 1 })
	f.set(false)
	want("deleted", Reading{State: Absent})
	select {
	case rd := <-r.readings:
		t.Fatalf("reported %+v more, want nothing", rd)
	default:
	}
}

func TestNewRefusesBadKey(t *testing.T) {
	for _, key := range []string{"encrypt node", "a/b", strings.Repeat("k", 254)} {
		f := newFakeAPI(t)
		_, err := New(Config{
			Client:     kubeapi.Client{Server: f.srv.URL(), TokenFile: "/tok", HTTP: f.srv.Client()},
			APIVersion: "v1", Kind: "ConfigMap", Collection: testCollection, Name: testName, Key: key,
		})
		if err == nil || !strings.Contains(err.Error(), "invalid key") {
			t.Errorf("key %.20q: %v, want an invalid key error", key, err)
		}
	}
}
