package ciliumnode

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/marksplit/marksplit/internal/kubeapi"
)

// nextBackOff returns b's next delay; a policy that gives up is started over.
func nextBackOff(b backoff.BackOff) time.Duration {
	d := b.NextBackOff()
	if d == backoff.Stop {
		b.Reset()
		if d = b.NextBackOff(); d == backoff.Stop {
			d = time.Minute
		}
	}
	return d
}

// sleep waits for d and reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// do sends a GET of u with client and returns the response of a 200 answer, for the
// caller to read and close. Any other answer is read (its first kubeapi.MaxErrBody bytes), closed
// and returned as an error, with its outcome: NotFound, Gone or HTTPError. A redirect is
// such an answer: the client never follows one (see kubeapi.NoRedirects).
func do(ctx context.Context, client *http.Client, tokenFile, u string) (*http.Response, outcome, error) {
	req, err := kubeapi.NewRequest(ctx, tokenFile, http.MethodGet, u, nil)
	if err != nil {
		return nil, outcomeNone, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, outcomeNetworkError, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, outcomeOK, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, kubeapi.MaxErrBody))
	if err != nil {
		return nil, outcomeNetworkError, fmt.Errorf("%s: read body: %w", resp.Status, err)
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil, outcomeNotFound, kubeapi.NewStatusError(resp, body)
	case http.StatusGone:
		return nil, outcomeGone, kubeapi.NewStatusError(resp, body)
	}
	return nil, outcomeHTTPError, kubeapi.NewStatusError(resp, body)
}
