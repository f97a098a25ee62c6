package metricsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Probes serves metrics at /metrics, and healthy and ready at /healthz and
// /readyz: 200 "ok" when the check returns nil, else 503 and the error.
func Probes(metrics http.Handler, healthy, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(err.Error() + "\n"))
				return
			}
			w.Write([]byte("ok\n"))
		}
	}
	mux.Handle("/healthz", probe(healthy))
	mux.Handle("/readyz", probe(ready))
	return mux
}

// Serve serves h on ln within lim until ctx ends; over TLS (HTTP/1.1 only)
// when tlsConfig is not nil. It closes ln.
func Serve(ctx context.Context, ln net.Listener, lim Limits, h http.Handler, tlsConfig *tls.Config, log *slog.Logger) {
	sl := NewShedListener(ln, lim.MaxConns)
	srv := &http.Server{
		Handler:           sl.Handler(h),
		ReadHeaderTimeout: lim.ReadHeader,
		ReadTimeout:       lim.Read,
		WriteTimeout:      lim.Write,
		IdleTimeout:       lim.Idle,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ConnState:         sl.ConnState,
		ConnContext:       sl.ConnContext,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		if tlsConfig != nil {
			// HTTP/1.1 alone: one request at a time per connection, so that
			// MaxConns bounds the requests too (HTTP/2 would allow 250 each).
			srv.TLSConfig = tlsConfig
			srv.Protocols = new(http.Protocols)
			srv.Protocols.SetHTTP1(true)
			err = srv.ServeTLS(sl, "", "")
		} else {
			err = srv.Serve(sl)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		srv.Close()
	}
	<-done
}
