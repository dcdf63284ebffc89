package fs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/modelfs/modelfs/backend"
)

// A store timeout is an I/O error, not EINTR: timeouts from net and
// net/http match context.DeadlineExceeded, and a reader told EINTR retries
// at once, for ever if the store keeps timing out. Only a read whose own
// request was interrupted gets EINTR.
func TestErrnoOfTimeoutsAndInterrupts(t *testing.T) {
	// A real dial timeout: a 1 ns deadline expires before the dial.
	_, dialErr := (&net.Dialer{Timeout: time.Nanosecond}).Dial("tcp", "127.0.0.1:1")
	if dialErr == nil {
		t.Fatal("a dial with a 1 ns timeout succeeded")
	}
	live := context.Background()
	interrupted, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		ctx  context.Context
		err  error
		want syscall.Errno
	}{
		{live, fmt.Errorf("get m.bin: %w", dialErr), syscall.EIO},
		{live, fmt.Errorf("read: %w", context.DeadlineExceeded), syscall.EIO},
		{live, errors.New("connection reset"), syscall.EIO},
		{live, fmt.Errorf("get: %w", backend.ErrPrecondition), syscall.ESTALE},
		{live, fmt.Errorf("get: %w", backend.ErrNotExist), syscall.ESTALE},
		{interrupted, context.Canceled, syscall.EINTR},
		{interrupted, fmt.Errorf("get m.bin: %w", dialErr), syscall.EINTR},
		{live, nil, 0},
	}
	for _, c := range cases {
		if got := errno(c.ctx, c.err); got != c.want {
			t.Errorf("errno(ctx err %v, %v) = %v, want %v", c.ctx.Err(), c.err, got, c.want)
		}
	}
}

// A listing that only moved LastModified (a copy in place of metadata)
// names the same bytes when the store gives ETags; without one, the time
// is all there is to go by.
func TestSameVersion(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	o := backend.Object{Key: "m.bin", Size: 10, ETag: `"e1"`, ModTime: t0}
	with := func(f func(*backend.Object)) backend.Object { c := o; f(&c); return c }
	cases := []struct {
		name string
		b    backend.Object
		same bool
	}{
		{"identical", o, true},
		{"metadata copied in place", with(func(c *backend.Object) { c.ModTime = t0.Add(time.Hour) }), true},
		{"new ETag", with(func(c *backend.Object) { c.ETag = `"e2"` }), false},
		{"new size", with(func(c *backend.Object) { c.Size = 11 }), false},
	}
	for _, c := range cases {
		if got := sameVersion(o, c.b); got != c.same {
			t.Errorf("%s: sameVersion = %v, want %v", c.name, got, c.same)
		}
	}
	noTag := with(func(c *backend.Object) { c.ETag = "" })
	if sameVersion(noTag, with(func(c *backend.Object) { c.ETag = ""; c.ModTime = t0.Add(time.Hour) })) {
		t.Error("without ETags a new LastModified must count as a new version")
	}
	if !sameVersion(noTag, noTag) {
		t.Error("without ETags an unchanged listing must count as the same version")
	}
}
