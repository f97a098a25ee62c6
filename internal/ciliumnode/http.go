package ciliumnode

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/marksplit/marksplit/internal/kubeapi"
)

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
