//go:build !linux

package pathprobe

import (
	"context"
	"errors"
)

// Serve fails: the responder needs Linux (MSG_TRUNC).
func (r *Responder) Serve(ctx context.Context) error {
	return errors.New("pathprobe: the responder needs Linux")
}
