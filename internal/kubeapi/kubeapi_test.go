package kubeapi

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/marksplit/marksplit/internal/apitest"
)

func TestOneLine(t *testing.T) {
	long := strings.Repeat("é", MaxLogChars)
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "etcdserver: request timed out", "etcdserver: request timed out"},
		{"newlines and tabs", " a\n\tb\r\n c \x1b[31m", "a b c [31m"},
		{"long multibyte", long, strings.Repeat("é", MaxLogChars/2) + "…"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := OneLine(tc.in); got != tc.want {
				t.Errorf("OneLine(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseServer(t *testing.T) {
	for in, want := range map[string]string{
		"https://10.0.0.1:6443/": "https://10.0.0.1:6443",
		"https://[fd00::1]:443":  "https://[fd00::1]:443",
		"http://10.0.0.1:6443":   "",
		"https://":               "",
		"https://h:1/?a=b":       "",
		"":                       "",
	} {
		got, err := ParseServer(in)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("ParseServer(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestDo checks a JSON round trip, the token read per request, the body bound, and
// that an error answer and a redirect are StatusErrors (the redirect not followed).
func TestDo(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	srv := apitest.New(t, apitest.Options{})
	var got []string
	for _, path := range []string{"/ok", "/big", "/denied", "/moved"} {
		srv.Handle(path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization")+" "+r.Header.Get("Content-Type"))
			switch r.URL.Path {
			case "/ok":
				w.Write([]byte(`{"n": 7}`))
			case "/big":
				w.Write([]byte(`{"n": 7, "pad": "` + strings.Repeat("x", 100) + `"}`))
			case "/denied":
				w.WriteHeader(http.StatusForbidden)
				w.Write([]byte(`{"kind":"Status","reason":"Forbidden","message":"no\nway","code":403}`))
			case "/moved":
				http.Redirect(w, r, "http://elsewhere/ok", http.StatusFound)
			}
		}))
	}
	c := &Client{Server: srv.URL(), TokenFile: token, HTTP: NoRedirects(srv.Client())}
	ctx := context.Background()

	if err := c.Do(ctx, "GET", "/ok", nil, nil, 1<<10); err == nil || !strings.Contains(err.Error(), "read token") {
		t.Fatalf("no token file: %v, want a read token error", err)
	}
	for i, tok := range []string{"one\n", "two"} {
		if err := os.WriteFile(token, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		srv.SetToken(strings.TrimSpace(tok))
		var out struct{ N int }
		if err := c.Do(ctx, "POST", "/ok", map[string]int{"i": i}, &out, 1<<10); err != nil || out.N != 7 {
			t.Fatalf("POST /ok: %v, %+v", err, out)
		}
	}
	want := []string{"POST /ok Bearer one application/json", "POST /ok Bearer two application/json"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("requests %q, want %q", got, want)
	}
	if err := c.Do(ctx, "GET", "/big", nil, nil, 50); err == nil || !strings.Contains(err.Error(), "larger than 50 bytes") {
		t.Errorf("GET /big with a 50-byte bound: %v", err)
	}
	var se *StatusError
	if err := c.Do(ctx, "GET", "/denied", nil, nil, 1<<10); !errors.As(err, &se) || se.Code != 403 || se.Reason != "Forbidden" ||
		err.Error() != "403 Forbidden: no way" {
		t.Errorf("GET /denied: %v (%+v)", err, se)
	}
	if err := c.Do(ctx, "GET", "/moved", nil, nil, 1<<10); !errors.As(err, &se) || se.Code != 302 ||
		!strings.Contains(err.Error(), "not followed") || len(got) != 5 {
		t.Errorf("GET /moved: %v (%d requests, want 5: the redirect not followed)", err, len(got))
	}
}
