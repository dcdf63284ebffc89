package backend

import (
	"context"
	"errors"
)

// NewTOS returns a Store for a Volcengine TOS bucket.
func NewTOS(ctx context.Context, bucket string, cfg Config) (Store, error) {
	return nil, errors.New("tos: not built yet")
}
