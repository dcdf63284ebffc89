package backend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Why a request attempt was abandoned; they are wrapped into the error of
// the attempt and counted in Stats.
var (
	ErrStalled   = errors.New("no bytes arrived within the request timeout")
	ErrTooSlow   = errors.New("transfer below the low-speed limit")
	ErrTruncated = errors.New("body ended before the requested range")
)

// Policy bounds every ranged GET a Reader makes.
type Policy struct {
	// FirstByteTimeout aborts an attempt that has delivered no body byte
	// this long after it was sent.
	FirstByteTimeout time.Duration
	// LowSpeedLimit (bytes/s) and LowSpeedWindow abort an attempt that moves
	// fewer than LowSpeedLimit×LowSpeedWindow bytes in any window.
	LowSpeedLimit  int64
	LowSpeedWindow time.Duration
	// Attempts bounds the tries of one ReadAt; each retry asks only for the
	// bytes still missing.
	Attempts int
	// BackoffBase and BackoffMax shape the jittered exponential backoff.
	BackoffBase, BackoffMax time.Duration
}

// DefaultPolicy is what the CLI starts from.
var DefaultPolicy = Policy{
	FirstByteTimeout: 3 * time.Second,
	LowSpeedLimit:    1 << 20,
	LowSpeedWindow:   3 * time.Second,
	Attempts:         5,
	BackoffBase:      50 * time.Millisecond,
	BackoffMax:       2 * time.Second,
}

// Stats counts what a Reader did. All fields are updated atomically.
type Stats struct {
	Requests      atomic.Int64 // GET attempts started
	BytesFetched  atomic.Int64 // body bytes received
	Retries       atomic.Int64 // attempts after the first
	Stalls        atomic.Int64 // attempts aborted by the first-byte timeout
	SlowAborts    atomic.Int64 // attempts aborted by the low-speed limit
	Truncations   atomic.Int64 // bodies that ended early
	Preconditions atomic.Int64 // ETag mismatches (object replaced)
	Failures      atomic.Int64 // ReadAt calls that gave up
	InFlight      atomic.Int64 // attempts now running
}

// Reader reads byte ranges of pinned object versions reliably: each attempt
// is watched for stalls and low speed, transient failures are retried for
// the missing bytes only, and permanent ones (not found, refused, changed)
// fail at once.
type Reader struct {
	Store  Store
	Policy Policy
	Stats  *Stats
	// Observe, if set, receives the duration of every successful attempt.
	Observe func(time.Duration)
}

// NewReader returns a Reader with its own Stats.
func NewReader(s Store, p Policy) *Reader {
	return &Reader{Store: s, Policy: p, Stats: new(Stats)}
}

// ReadAt fills p with bytes [off, off+len(p)) of obj, which must lie inside
// the object. It returns nil only when every byte arrived.
func (r *Reader) ReadAt(ctx context.Context, obj Object, p []byte, off int64) error {
	return r.ReadVec(ctx, obj, off, [][]byte{p}, nil)
}

// ReadVec fills bufs, in order, with the consecutive bytes of obj from off,
// using one GET when nothing goes wrong. filled(i), if set, is called as
// soon as bufs[i] is complete, so a reader waiting on the first buffer does
// not wait for the last. It returns nil only when every buffer is full.
func (r *Reader) ReadVec(ctx context.Context, obj Object, off int64, bufs [][]byte, filled func(int)) error {
	var total int64
	for _, b := range bufs {
		total += int64(len(b))
	}
	v := &vec{bufs: bufs, filled: filled}
	if total == 0 {
		v.advance(0) // reports the empty buffers filled
		return nil
	}
	var err error
	attempts := max(r.Policy.Attempts, 1)
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			r.Stats.Retries.Add(1)
			if werr := r.Policy.backoff(ctx, attempt); werr != nil {
				return werr
			}
		}
		err = r.attempt(ctx, obj, off+v.done, total-v.done, v)
		if err == nil || v.done == total {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if Permanent(err) {
			if errors.Is(err, ErrPrecondition) {
				r.Stats.Preconditions.Add(1)
			}
			r.Stats.Failures.Add(1)
			return fmt.Errorf("read %s [%d, %d): %w", obj.Key, off, off+total, err)
		}
	}
	r.Stats.Failures.Add(1)
	return fmt.Errorf("read %s [%d, %d): gave up after %d attempts: %w", obj.Key, off, off+total, attempts, err)
}

// vec is the fill position inside a list of buffers.
type vec struct {
	bufs   [][]byte
	filled func(int)
	i      int   // current buffer
	pos    int   // bytes of bufs[i] filled
	done   int64 // bytes filled in all
}

// next is the unfilled rest of the current buffer.
func (v *vec) next() []byte { return v.bufs[v.i][v.pos:] }

func (v *vec) advance(n int) {
	v.pos += n
	v.done += int64(n)
	for v.i < len(v.bufs) && v.pos == len(v.bufs[v.i]) {
		if v.filled != nil {
			v.filled(v.i)
		}
		v.i++
		v.pos = 0
	}
}

// backoff waits before retry number attempt (from 1), or until ctx ends.
func (p Policy) backoff(ctx context.Context, attempt int) error {
	d := p.BackoffBase << min(attempt-1, 16)
	if d > p.BackoffMax || d <= 0 {
		d = p.BackoffMax
	}
	if d <= 0 {
		return ctx.Err()
	}
	// Full jitter: concurrent retries after a burst of 503s spread out.
	d = time.Duration(rand.Int64N(int64(d)/2+1)) + d/2
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// attempt runs one GET for the n bytes from off into v.
func (r *Reader) attempt(ctx context.Context, obj Object, off, n int64, v *vec) error {
	r.Stats.Requests.Add(1)
	r.Stats.InFlight.Add(1)
	defer r.Stats.InFlight.Add(-1)
	start := time.Now()
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &watchdog{cancel: cancel, window: cmp.Or(r.Policy.LowSpeedWindow, r.Policy.FirstByteTimeout),
		minBytes: int64(float64(r.Policy.LowSpeedLimit) * r.Policy.LowSpeedWindow.Seconds())}
	// The timer first checks for the first byte, then re-arms itself every
	// window (the low-speed window, else the first-byte timeout); without a
	// first-byte timeout it starts with the window. A body that stops is
	// caught whether or not a low-speed limit is set.
	if first := cmp.Or(r.Policy.FirstByteTimeout, w.window); first > 0 {
		w.t = time.AfterFunc(first, w.fire)
		defer w.t.Stop()
	}
	body, err := r.Store.Open(actx, obj.Key, obj.ETag, off, n)
	if err != nil {
		return r.cause(actx, err)
	}
	defer body.Close()
	var got int64
	for got < n {
		m, rerr := body.Read(v.next())
		got += int64(m)
		w.progress.Add(int64(m))
		r.Stats.BytesFetched.Add(int64(m))
		v.advance(m)
		if got == n {
			break // every byte is here, whatever the body says next
		}
		// A body cut short arrives as io.ErrUnexpectedEOF from net/http.
		if rerr == io.EOF || errors.Is(rerr, io.ErrUnexpectedEOF) {
			r.Stats.Truncations.Add(1)
			return fmt.Errorf("%w: got %d of %d bytes", ErrTruncated, got, n)
		}
		if rerr != nil {
			return r.cause(actx, rerr)
		}
	}
	if r.Observe != nil {
		r.Observe(time.Since(start))
	}
	return nil
}

// cause prefers the watchdog's reason over the bare "context canceled" the
// transport reports, and counts it.
func (r *Reader) cause(actx context.Context, err error) error {
	switch c := context.Cause(actx); {
	case errors.Is(c, ErrStalled):
		r.Stats.Stalls.Add(1)
		return c
	case errors.Is(c, ErrTooSlow):
		r.Stats.SlowAborts.Add(1)
		return c
	}
	return err
}

// watchdog aborts an attempt through its context: first when no byte came
// within the first-byte timeout, then whenever a window moves no bytes, or
// fewer than the low-speed limit asks.
// fire runs only on the timer goroutine and re-arms itself, so last and
// armed need no lock.
type watchdog struct {
	progress atomic.Int64
	last     int64
	armed    bool
	t        *time.Timer
	cancel   context.CancelCauseFunc
	window   time.Duration
	minBytes int64
}

func (w *watchdog) fire() {
	cur := w.progress.Load()
	if cur == 0 || (w.minBytes <= 0 && cur == w.last) {
		w.cancel(ErrStalled)
		return
	}
	if w.window <= 0 {
		return // nothing to watch after the first byte
	}
	if w.minBytes > 0 && w.armed && cur-w.last < w.minBytes {
		w.cancel(fmt.Errorf("%w: %d bytes in %v", ErrTooSlow, cur-w.last, w.window))
		return
	}
	w.armed, w.last = true, cur
	w.t.Reset(w.window)
}
