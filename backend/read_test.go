package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// faultKind says how one GET attempt of the fake store misbehaves.
type faultKind int

const (
	fine      faultKind = iota // serve the whole range
	truncate                   // serve k bytes, then io.EOF
	breakBody                  // serve k bytes, then err
	openErr                    // Open fails with err
	stallOpen                  // Open blocks until its ctx is done
	stallBody                  // serve k bytes, then Read blocks until ctx is done
	drip                       // serve one byte at once, then one byte per every
)

type fault struct {
	kind  faultKind
	k     int
	err   error
	every time.Duration
}

// request is one Open the fake store saw.
type request struct {
	key, etag string
	off, n    int64
}

// fakeStore serves data as one object and injects faults[i] into the i-th
// Open (later Opens succeed). Reads deliver at most chunk bytes at a time.
type fakeStore struct {
	t      *testing.T
	key    string
	etag   string
	data   []byte
	chunk  int
	faults []fault
	onOpen func(i int) // called at the start of every Open

	mu     sync.Mutex
	reqs   []request
	served int64   // body bytes delivered over all attempts
	per    []int64 // body bytes delivered per attempt
}

func newFake(t *testing.T, size int, faults ...fault) *fakeStore {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*131 + i>>8 + 7)
	}
	return &fakeStore{t: t, key: "m/model.safetensors", etag: `"v1"`, data: data, chunk: 64, faults: faults}
}

func (f *fakeStore) obj() Object {
	return Object{Key: f.key, Size: int64(len(f.data)), ETag: f.etag}
}

func (f *fakeStore) requests() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.reqs...)
}

func (f *fakeStore) List(context.Context, string, func(Object) error) error {
	return errors.New("fake: List not implemented")
}

func (f *fakeStore) Stat(_ context.Context, key string) (Object, error) {
	if key != f.key {
		return Object{}, WithKind(ErrNotExist, errors.New("fake: no such key"))
	}
	return f.obj(), nil
}

func (f *fakeStore) String() string { return "fake" }
func (f *fakeStore) Close() error   { return nil }

func (f *fakeStore) Open(ctx context.Context, key, etag string, off, n int64) (io.ReadCloser, error) {
	f.mu.Lock()
	i := len(f.reqs)
	f.reqs = append(f.reqs, request{key: key, etag: etag, off: off, n: n})
	f.per = append(f.per, 0)
	f.mu.Unlock()
	if f.onOpen != nil {
		f.onOpen(i)
	}
	if n <= 0 || off < 0 || off+n > int64(len(f.data)) {
		f.t.Errorf("Open(%q, off=%d, n=%d) outside the %d-byte object or with n <= 0", key, off, n, len(f.data))
		return nil, fmt.Errorf("fake: bad range [%d, %d)", off, off+n)
	}
	if key != f.key {
		return nil, WithKind(ErrNotExist, fmt.Errorf("fake: no key %q", key))
	}
	if etag != f.etag {
		return nil, WithKind(ErrPrecondition, fmt.Errorf("fake: etag %s is not %s", etag, f.etag))
	}
	var ft fault
	if i < len(f.faults) {
		ft = f.faults[i]
	}
	switch ft.kind {
	case openErr:
		return nil, ft.err
	case stallOpen:
		<-ctx.Done()
		return nil, fmt.Errorf("fake: dial: %w", ctx.Err())
	}
	return &fakeBody{ctx: ctx, store: f, attempt: i, data: f.data[off : off+n], fault: ft}, nil
}

type fakeBody struct {
	ctx     context.Context
	store   *fakeStore
	attempt int
	data    []byte
	pos     int
	fault   fault
}

func (b *fakeBody) deliver(p []byte, limit int) (int, error) {
	m := copy(p, b.data[b.pos:min(len(b.data), b.pos+limit, b.pos+b.store.chunk)])
	b.pos += m
	b.store.mu.Lock()
	b.store.served += int64(m)
	b.store.per[b.attempt] += int64(m)
	b.store.mu.Unlock()
	return m, nil
}

func (b *fakeBody) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	if b.pos == len(b.data) {
		return 0, io.EOF
	}
	switch b.fault.kind {
	case truncate:
		if b.pos >= b.fault.k {
			return 0, io.EOF
		}
		return b.deliver(p, b.fault.k-b.pos)
	case breakBody:
		if b.pos >= b.fault.k {
			return 0, b.fault.err
		}
		return b.deliver(p, b.fault.k-b.pos)
	case stallBody:
		if b.pos >= b.fault.k {
			<-b.ctx.Done()
			return 0, fmt.Errorf("fake: read: %w", b.ctx.Err())
		}
		return b.deliver(p, b.fault.k-b.pos)
	case drip:
		if b.pos > 0 {
			t := time.NewTimer(b.fault.every)
			defer t.Stop()
			select {
			case <-b.ctx.Done():
				return 0, fmt.Errorf("fake: read: %w", b.ctx.Err())
			case <-t.C:
			}
		}
		return b.deliver(p, 1)
	}
	return b.deliver(p, len(b.data))
}

func (b *fakeBody) Close() error { return nil }

// fastPolicy retries quickly and never aborts a healthy attempt.
var fastPolicy = Policy{
	FirstByteTimeout: 2 * time.Second,
	Attempts:         5,
	BackoffBase:      time.Microsecond,
	BackoffMax:       time.Millisecond,
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func checkIdle(t *testing.T, r *Reader) {
	t.Helper()
	if n := r.Stats.InFlight.Load(); n != 0 {
		t.Errorf("Stats.InFlight = %d after the read returned", n)
	}
}

func TestReadAtClean(t *testing.T) {
	f := newFake(t, 4096)
	r := NewReader(f, fastPolicy)
	var observed int
	r.Observe = func(time.Duration) { observed++ }
	for _, tc := range []struct{ off, n int64 }{{0, 4096}, {0, 1}, {4095, 1}, {100, 1000}, {777, 3319}} {
		before := len(f.requests())
		p := make([]byte, tc.n)
		if err := r.ReadAt(testCtx(t), f.obj(), p, tc.off); err != nil {
			t.Fatalf("ReadAt(off=%d, n=%d): %v", tc.off, tc.n, err)
		}
		if !bytes.Equal(p, f.data[tc.off:tc.off+tc.n]) {
			t.Fatalf("ReadAt(off=%d, n=%d) returned the wrong bytes", tc.off, tc.n)
		}
		reqs := f.requests()[before:]
		want := request{key: f.key, etag: f.etag, off: tc.off, n: tc.n}
		if len(reqs) != 1 || reqs[0] != want {
			t.Fatalf("ReadAt(off=%d, n=%d) sent %+v, want one %+v", tc.off, tc.n, reqs, want)
		}
	}
	s := r.Stats
	if s.Requests.Load() != 5 || s.Retries.Load() != 0 || s.Failures.Load() != 0 || s.Truncations.Load() != 0 {
		t.Errorf("stats after clean reads: requests=%d retries=%d failures=%d truncations=%d",
			s.Requests.Load(), s.Retries.Load(), s.Failures.Load(), s.Truncations.Load())
	}
	if got, want := s.BytesFetched.Load(), int64(4096+1+1+1000+3319); got != want {
		t.Errorf("BytesFetched = %d, want %d", got, want)
	}
	if observed != 5 {
		t.Errorf("Observe called %d times, want 5 (one per successful attempt)", observed)
	}
	checkIdle(t, r)
}

func TestReadAtRetriesOnlyMissingBytes(t *testing.T) {
	reset := errors.New("read tcp: connection reset by peer")
	slowDown := errors.New("api error SlowDown: 503")
	const off, n = 1000, 2000
	tests := []struct {
		name        string
		faults      []fault
		wantOffs    []int64 // offsets of the GETs, relative to off
		truncations int64
	}{
		{"truncated", []fault{{kind: truncate, k: 100}}, []int64{0, 100}, 1},
		{"empty body", []fault{{kind: truncate, k: 0}}, []int64{0, 0}, 1},
		{"truncated unaligned to chunk", []fault{{kind: truncate, k: 65}, {kind: truncate, k: 1}}, []int64{0, 65, 66}, 2},
		{"truncated one byte short", []fault{{kind: truncate, k: n - 1}}, []int64{0, n - 1}, 1},
		{"error before body", []fault{{kind: openErr, err: slowDown}}, []int64{0, 0}, 0},
		{"connection reset", []fault{{kind: breakBody, k: 37, err: reset}}, []int64{0, 37}, 0},
		{"reset at once", []fault{{kind: breakBody, k: 0, err: reset}}, []int64{0, 0}, 0},
		{"mixed", []fault{
			{kind: breakBody, k: 37, err: reset},
			{kind: openErr, err: slowDown},
			{kind: truncate, k: 10},
			{kind: breakBody, k: 500, err: io.ErrUnexpectedEOF}, // how net/http reports a short body
		}, []int64{0, 37, 37, 47, 547}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, 4096, tc.faults...)
			r := NewReader(f, fastPolicy)
			p := make([]byte, n)
			if err := r.ReadAt(testCtx(t), f.obj(), p, off); err != nil {
				t.Fatalf("ReadAt after transient faults: %v", err)
			}
			if !bytes.Equal(p, f.data[off:off+n]) {
				t.Fatalf("ReadAt returned the wrong bytes after faults")
			}
			reqs := f.requests()
			var offs []int64
			for _, q := range reqs {
				offs = append(offs, q.off-off)
				if q.off+q.n != off+n {
					t.Errorf("GET [%d, %d) does not end where the read does (%d)", q.off, q.off+q.n, off+n)
				}
				if q.etag != f.etag {
					t.Errorf("retry sent etag %q, want the pinned %q", q.etag, f.etag)
				}
			}
			if fmt.Sprint(offs) != fmt.Sprint(tc.wantOffs) {
				t.Fatalf("GET offsets (relative) = %v, want %v", offs, tc.wantOffs)
			}
			s := r.Stats
			attempts := int64(len(tc.wantOffs))
			if s.Requests.Load() != attempts || s.Retries.Load() != attempts-1 {
				t.Errorf("Requests=%d Retries=%d, want %d and %d", s.Requests.Load(), s.Retries.Load(), attempts, attempts-1)
			}
			if s.Truncations.Load() != tc.truncations {
				t.Errorf("Truncations = %d, want %d", s.Truncations.Load(), tc.truncations)
			}
			// Every byte crossed the wire exactly once.
			if s.BytesFetched.Load() != n || f.served != n {
				t.Errorf("BytesFetched=%d served=%d, want %d each", s.BytesFetched.Load(), f.served, n)
			}
			if s.Failures.Load() != 0 || s.Stalls.Load() != 0 || s.SlowAborts.Load() != 0 || s.Preconditions.Load() != 0 {
				t.Errorf("unexpected counters: failures=%d stalls=%d slow=%d preconditions=%d",
					s.Failures.Load(), s.Stalls.Load(), s.SlowAborts.Load(), s.Preconditions.Load())
			}
			checkIdle(t, r)
		})
	}
}

func TestReadAtPermanentErrorsNotRetried(t *testing.T) {
	tests := []struct {
		name          string
		before        []fault // transient faults ahead of the permanent one
		err           error
		kind          error
		preconditions int64
	}{
		{"precondition", nil, WithKind(ErrPrecondition, errors.New("412 PreconditionFailed")), ErrPrecondition, 1},
		{"not exist", nil, WithKind(ErrNotExist, errors.New("404 NoSuchKey")), ErrNotExist, 0},
		{"access", nil, WithKind(ErrAccess, errors.New("403 AccessDenied")), ErrAccess, 0},
		{"no bucket", nil, WithKind(ErrNoBucket, errors.New("404 NoSuchBucket")), ErrNoBucket, 0},
		{"bare sentinel", nil, ErrNotExist, ErrNotExist, 0},
		{"precondition after a truncation", []fault{{kind: truncate, k: 10}},
			WithKind(ErrPrecondition, errors.New("412")), ErrPrecondition, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			faults := append(append([]fault(nil), tc.before...), fault{kind: openErr, err: tc.err})
			f := newFake(t, 1024, faults...)
			r := NewReader(f, fastPolicy)
			err := r.ReadAt(testCtx(t), f.obj(), make([]byte, 100), 50)
			if err == nil {
				t.Fatal("ReadAt succeeded through a permanent error")
			}
			if !errors.Is(err, tc.kind) || !Permanent(err) {
				t.Fatalf("ReadAt error %v does not match %v", err, tc.kind)
			}
			if !strings.Contains(err.Error(), f.key) {
				t.Errorf("error %q does not name the key", err)
			}
			if strings.Contains(err.Error(), "gave up") {
				t.Errorf("error %q says it gave up: a permanent error is not retried", err)
			}
			want := int64(len(faults))
			if got := int64(len(f.requests())); got != want {
				t.Fatalf("%d GETs, want %d (no retry after a permanent error)", got, want)
			}
			s := r.Stats
			if s.Requests.Load() != want || s.Retries.Load() != want-1 || s.Failures.Load() != 1 {
				t.Errorf("Requests=%d Retries=%d Failures=%d, want %d, %d, 1",
					s.Requests.Load(), s.Retries.Load(), s.Failures.Load(), want, want-1)
			}
			if s.Preconditions.Load() != tc.preconditions {
				t.Errorf("Preconditions = %d, want %d", s.Preconditions.Load(), tc.preconditions)
			}
			checkIdle(t, r)
		})
	}
}

// A read pinned to an ETag the object no longer has fails at once.
func TestReadAtChangedObject(t *testing.T) {
	f := newFake(t, 1024)
	r := NewReader(f, fastPolicy)
	obj := f.obj()
	obj.ETag = `"v0"`
	err := r.ReadAt(testCtx(t), obj, make([]byte, 10), 0)
	if !errors.Is(err, ErrPrecondition) {
		t.Fatalf("ReadAt of a replaced object: %v, want ErrPrecondition", err)
	}
	if reqs := f.requests(); len(reqs) != 1 || reqs[0].etag != `"v0"` {
		t.Fatalf("GETs %+v, want one pinned to \"v0\"", reqs)
	}
	if r.Stats.Preconditions.Load() != 1 || r.Stats.Failures.Load() != 1 {
		t.Errorf("Preconditions=%d Failures=%d, want 1 and 1", r.Stats.Preconditions.Load(), r.Stats.Failures.Load())
	}
}

func TestReadAtGivesUp(t *testing.T) {
	slowDown := errors.New("api error SlowDown: 503")
	for _, attempts := range []int{1, 2, 3, 7} {
		t.Run(fmt.Sprint(attempts), func(t *testing.T) {
			var faults []fault
			for i := 0; i < 20; i++ {
				faults = append(faults, fault{kind: openErr, err: slowDown})
			}
			f := newFake(t, 1024, faults...)
			p := fastPolicy
			p.Attempts = attempts
			r := NewReader(f, p)
			err := r.ReadAt(testCtx(t), f.obj(), make([]byte, 100), 0)
			if err == nil {
				t.Fatal("ReadAt succeeded against a store that always fails")
			}
			if !strings.Contains(err.Error(), "gave up") || !strings.Contains(err.Error(), fmt.Sprintf("%d attempts", attempts)) {
				t.Errorf("error %q does not say it gave up after %d attempts", err, attempts)
			}
			if !errors.Is(err, slowDown) {
				t.Errorf("error %q does not wrap the last attempt's error", err)
			}
			if Permanent(err) {
				t.Errorf("giving up on transient errors reported as permanent: %v", err)
			}
			if got := len(f.requests()); got != attempts {
				t.Fatalf("%d GETs, want exactly %d", got, attempts)
			}
			s := r.Stats
			if s.Requests.Load() != int64(attempts) || s.Retries.Load() != int64(attempts-1) || s.Failures.Load() != 1 {
				t.Errorf("Requests=%d Retries=%d Failures=%d", s.Requests.Load(), s.Retries.Load(), s.Failures.Load())
			}
			checkIdle(t, r)
		})
	}
}

// Attempts <= 0 still makes one attempt.
func TestReadAtZeroAttempts(t *testing.T) {
	f := newFake(t, 1024, fault{kind: truncate, k: 5})
	p := fastPolicy
	p.Attempts = 0
	r := NewReader(f, p)
	err := r.ReadAt(testCtx(t), f.obj(), make([]byte, 100), 0)
	if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "gave up after 1 attempts") {
		t.Fatalf("ReadAt with Attempts=0: %v, want a truncation after 1 attempt", err)
	}
	if got := len(f.requests()); got != 1 {
		t.Fatalf("%d GETs, want 1", got)
	}
}

// Progress on every attempt does not extend the budget: attempts are
// bounded even when each one delivers something.
func TestReadAtBoundedWithProgress(t *testing.T) {
	var faults []fault
	for i := 0; i < 10; i++ {
		faults = append(faults, fault{kind: truncate, k: 10})
	}
	f := newFake(t, 1024, faults...)
	r := NewReader(f, fastPolicy) // 5 attempts
	p := make([]byte, 100)
	err := r.ReadAt(testCtx(t), f.obj(), p, 0)
	if !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("ReadAt: %v, want it to give up on truncations", err)
	}
	var offs []int64
	for _, q := range f.requests() {
		offs = append(offs, q.off)
	}
	if fmt.Sprint(offs) != "[0 10 20 30 40]" {
		t.Fatalf("GET offsets %v, want [0 10 20 30 40]", offs)
	}
	if !bytes.Equal(p[:50], f.data[:50]) {
		t.Errorf("the bytes that did arrive are not in place")
	}
	if r.Stats.Truncations.Load() != 5 {
		t.Errorf("Truncations = %d, want 5", r.Stats.Truncations.Load())
	}
}

func TestReadAtFirstByteTimeout(t *testing.T) {
	pol := Policy{FirstByteTimeout: 50 * time.Millisecond, Attempts: 3, BackoffBase: time.Microsecond, BackoffMax: time.Millisecond}
	tests := []struct {
		name   string
		faults []fault
		stalls int64
	}{
		{"stalled connect", []fault{{kind: stallOpen}}, 1},
		{"stalled body", []fault{{kind: stallBody, k: 0}}, 1},
		{"two stalls", []fault{{kind: stallOpen}, {kind: stallBody, k: 0}}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, 4096, tc.faults...)
			r := NewReader(f, pol)
			p := make([]byte, 3000)
			start := time.Now()
			if err := r.ReadAt(testCtx(t), f.obj(), p, 1000); err != nil {
				t.Fatalf("ReadAt after stalls: %v", err)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("ReadAt took %v: the first-byte timeout did not cut the stall short", el)
			}
			if !bytes.Equal(p, f.data[1000:4000]) {
				t.Fatal("ReadAt returned the wrong bytes after stalls")
			}
			s := r.Stats
			if s.Stalls.Load() != tc.stalls || s.SlowAborts.Load() != 0 {
				t.Errorf("Stalls=%d SlowAborts=%d, want %d and 0", s.Stalls.Load(), s.SlowAborts.Load(), tc.stalls)
			}
			if s.Requests.Load() != tc.stalls+1 {
				t.Errorf("Requests = %d, want %d", s.Requests.Load(), tc.stalls+1)
			}
			for _, q := range f.requests() {
				if q.off != 1000 || q.n != 3000 {
					t.Errorf("GET [%d, +%d), want the whole range again after a stall with no bytes", q.off, q.n)
				}
			}
			checkIdle(t, r)
		})
	}
}

func TestReadAtAlwaysStalls(t *testing.T) {
	pol := Policy{FirstByteTimeout: 50 * time.Millisecond, Attempts: 2, BackoffBase: time.Microsecond, BackoffMax: time.Millisecond}
	f := newFake(t, 1024, fault{kind: stallBody}, fault{kind: stallOpen}, fault{kind: stallBody})
	r := NewReader(f, pol)
	err := r.ReadAt(testCtx(t), f.obj(), make([]byte, 10), 0)
	if !errors.Is(err, ErrStalled) || !strings.Contains(err.Error(), "gave up after 2 attempts") {
		t.Fatalf("ReadAt: %v, want ErrStalled after 2 attempts", err)
	}
	if errors.Is(err, context.Canceled) {
		t.Errorf("error %v reports the bare cancellation, not the stall", err)
	}
	if r.Stats.Stalls.Load() != 2 || r.Stats.Failures.Load() != 1 {
		t.Errorf("Stalls=%d Failures=%d, want 2 and 1", r.Stats.Stalls.Load(), r.Stats.Failures.Load())
	}
}

// A first byte that comes late but within the timeout is no stall.
func TestReadAtFirstByteInTime(t *testing.T) {
	pol := Policy{FirstByteTimeout: time.Second, Attempts: 1}
	f := newFake(t, 64)
	// The store answers after 20 ms, well inside the timeout.
	f.onOpen = func(int) { <-time.After(20 * time.Millisecond) }
	p := make([]byte, 64)
	if err := NewReader(f, pol).ReadAt(testCtx(t), f.obj(), p, 0); err != nil {
		t.Fatalf("ReadAt with a late first byte: %v", err)
	}
}

func TestReadAtLowSpeedLimit(t *testing.T) {
	// 1000 B/s over 50 ms windows: an attempt must move 50 bytes per window;
	// the drip moves one byte per 10 ms.
	pol := Policy{
		FirstByteTimeout: 50 * time.Millisecond,
		LowSpeedLimit:    1000,
		LowSpeedWindow:   50 * time.Millisecond,
		Attempts:         3,
		BackoffBase:      time.Microsecond,
		BackoffMax:       time.Millisecond,
	}
	f := newFake(t, 4096, fault{kind: drip, every: 10 * time.Millisecond})
	r := NewReader(f, pol)
	p := make([]byte, 2000)
	start := time.Now()
	if err := r.ReadAt(testCtx(t), f.obj(), p, 500); err != nil {
		t.Fatalf("ReadAt after a slow attempt: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("ReadAt took %v: the low-speed limit did not abort the drip", el)
	}
	if !bytes.Equal(p, f.data[500:2500]) {
		t.Fatal("ReadAt returned the wrong bytes after a slow attempt")
	}
	s := r.Stats
	if s.SlowAborts.Load() != 1 || s.Stalls.Load() != 0 {
		t.Errorf("SlowAborts=%d Stalls=%d, want 1 and 0", s.SlowAborts.Load(), s.Stalls.Load())
	}
	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d GETs, want 2", len(reqs))
	}
	dripped := f.per[0]
	if dripped < 1 || dripped >= 50 {
		t.Errorf("the slow attempt delivered %d bytes, want 1..49", dripped)
	}
	if reqs[1].off != 500+dripped || reqs[1].n != 2000-dripped {
		t.Errorf("retry GET [%d, +%d), want [%d, +%d): only the missing bytes", reqs[1].off, reqs[1].n, 500+dripped, 2000-dripped)
	}
	if s.BytesFetched.Load() != 2000 {
		t.Errorf("BytesFetched = %d, want 2000", s.BytesFetched.Load())
	}
}

func TestReadAtAlwaysTooSlow(t *testing.T) {
	pol := Policy{
		FirstByteTimeout: 30 * time.Millisecond,
		LowSpeedLimit:    1000,
		LowSpeedWindow:   30 * time.Millisecond,
		Attempts:         2,
		BackoffBase:      time.Microsecond,
		BackoffMax:       time.Millisecond,
	}
	f := newFake(t, 1024, fault{kind: drip, every: 10 * time.Millisecond}, fault{kind: stallBody, k: 3})
	r := NewReader(f, pol)
	err := r.ReadAt(testCtx(t), f.obj(), make([]byte, 500), 0)
	if !errors.Is(err, ErrTooSlow) || !strings.Contains(err.Error(), "gave up") {
		t.Fatalf("ReadAt: %v, want ErrTooSlow and giving up", err)
	}
	if r.Stats.SlowAborts.Load() != 2 || r.Stats.Stalls.Load() != 0 {
		t.Errorf("SlowAborts=%d Stalls=%d, want 2 and 0", r.Stats.SlowAborts.Load(), r.Stats.Stalls.Load())
	}
}

// A transfer comfortably above the low-speed limit over several windows is
// left alone.
func TestReadAtFastEnough(t *testing.T) {
	pol := Policy{
		FirstByteTimeout: 30 * time.Millisecond,
		LowSpeedLimit:    100, // 3 bytes per 30 ms window
		LowSpeedWindow:   30 * time.Millisecond,
		Attempts:         1,
	}
	f := newFake(t, 40, fault{kind: drip, every: 3 * time.Millisecond}) // ~30 bytes per window
	r := NewReader(f, pol)
	p := make([]byte, 40)
	if err := r.ReadAt(testCtx(t), f.obj(), p, 0); err != nil {
		t.Fatalf("ReadAt of a transfer above the limit: %v", err)
	}
	if !bytes.Equal(p, f.data) || r.Stats.SlowAborts.Load() != 0 {
		t.Fatalf("bytes equal=%v SlowAborts=%d", bytes.Equal(p, f.data), r.Stats.SlowAborts.Load())
	}
}

// The caller cancelling is neither a stall nor retried.
func TestReadAtCallerCancels(t *testing.T) {
	pol := Policy{FirstByteTimeout: time.Minute, Attempts: 5, BackoffBase: time.Microsecond, BackoffMax: time.Millisecond}
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	f := newFake(t, 1024, fault{kind: stallBody, k: 10})
	f.onOpen = func(int) { cancel() }
	r := NewReader(f, pol)
	err := r.ReadAt(ctx, f.obj(), make([]byte, 100), 0)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("ReadAt with a cancelled context: %v, want context.Canceled", err)
	}
	if len(f.requests()) != 1 || r.Stats.Stalls.Load() != 0 || r.Stats.SlowAborts.Load() != 0 {
		t.Errorf("GETs=%d Stalls=%d SlowAborts=%d, want 1, 0, 0", len(f.requests()), r.Stats.Stalls.Load(), r.Stats.SlowAborts.Load())
	}
}

// A deadline that expires during the backoff ends the read without another
// attempt.
func TestReadAtDeadlineDuringBackoff(t *testing.T) {
	pol := Policy{FirstByteTimeout: time.Minute, Attempts: 5, BackoffBase: time.Hour, BackoffMax: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	f := newFake(t, 1024, fault{kind: openErr, err: errors.New("503")})
	r := NewReader(f, pol)
	start := time.Now()
	err := r.ReadAt(ctx, f.obj(), make([]byte, 100), 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ReadAt: %v, want context.DeadlineExceeded", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("backoff ignored the deadline: %v", el)
	}
	if len(f.requests()) != 1 {
		t.Errorf("%d GETs, want 1", len(f.requests()))
	}
}

func TestReadVecFilled(t *testing.T) {
	reset := errors.New("connection reset")
	tests := []struct {
		name   string
		sizes  []int
		chunk  int
		faults []fault
	}{
		{"one buffer", []int{100}, 64, nil},
		{"clean", []int{5, 13, 1, 20}, 64, nil},
		{"small reads", []int{5, 13, 1, 20}, 3, nil},
		{"empty buffers", []int{0, 5, 0, 0, 13, 1, 0, 20, 0}, 4, nil},
		{"faults across buffers", []int{5, 13, 1, 20, 64}, 4, []fault{
			{kind: truncate, k: 7},
			{kind: breakBody, k: 9, err: reset},
			{kind: openErr, err: reset},
			{kind: truncate, k: 4},
		}},
		{"fault on a boundary", []int{8, 8, 8}, 8, []fault{{kind: truncate, k: 8}, {kind: truncate, k: 8}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, 1024, tc.faults...)
			f.chunk = tc.chunk
			const off = 333
			bufs := make([][]byte, len(tc.sizes))
			ends := make([]int64, len(tc.sizes)) // end of bufs[i] relative to off
			var total int64
			for i, n := range tc.sizes {
				bufs[i] = make([]byte, n)
				total += int64(n)
				ends[i] = total
			}
			var calls []int
			filled := func(i int) {
				calls = append(calls, i)
				if i < 0 || i >= len(bufs) {
					t.Fatalf("filled(%d) out of range", i)
				}
				start := ends[i] - int64(len(bufs[i]))
				if !bytes.Equal(bufs[i], f.data[off+start:off+ends[i]]) {
					t.Errorf("filled(%d) called before the buffer holds its bytes", i)
				}
				// Called as soon as the buffer is complete: nothing past it
				// was read yet.
				f.mu.Lock()
				served := f.served
				f.mu.Unlock()
				if served != ends[i] {
					t.Errorf("filled(%d) called after %d bytes arrived, want right at %d", i, served, ends[i])
				}
			}
			r := NewReader(f, fastPolicy)
			if err := r.ReadVec(testCtx(t), f.obj(), off, bufs, filled); err != nil {
				t.Fatalf("ReadVec: %v", err)
			}
			want := make([]int, len(bufs))
			for i := range want {
				want[i] = i
			}
			if fmt.Sprint(calls) != fmt.Sprint(want) {
				t.Fatalf("filled calls %v, want %v (once per buffer, in order)", calls, want)
			}
			got := bytes.Join(bufs, nil)
			if !bytes.Equal(got, f.data[off:off+total]) {
				t.Fatal("ReadVec buffers do not hold the source bytes")
			}
			if reqs := f.requests(); int64(len(reqs)) != r.Stats.Requests.Load() || len(reqs) != len(tc.faults)+1 {
				t.Errorf("%d GETs, want %d", len(reqs), len(tc.faults)+1)
			}
			if r.Stats.BytesFetched.Load() != total {
				t.Errorf("BytesFetched = %d, want %d", r.Stats.BytesFetched.Load(), total)
			}
		})
	}
}

// When ReadVec fails, filled has fired for exactly the buffers that were
// complete and for no other.
func TestReadVecFilledOnFailure(t *testing.T) {
	f := newFake(t, 1024,
		fault{kind: truncate, k: 7},
		fault{kind: truncate, k: 6},
		fault{kind: openErr, err: WithKind(ErrPrecondition, errors.New("412"))},
	)
	f.chunk = 2
	bufs := [][]byte{make([]byte, 5), make([]byte, 0), make([]byte, 8), make([]byte, 10)}
	var calls []int
	r := NewReader(f, fastPolicy)
	err := r.ReadVec(testCtx(t), f.obj(), 0, bufs, func(i int) { calls = append(calls, i) })
	if !errors.Is(err, ErrPrecondition) {
		t.Fatalf("ReadVec: %v, want ErrPrecondition", err)
	}
	// 13 bytes arrived: buffers 0, 1 (empty) and 2 (bytes 5..12) are full.
	if fmt.Sprint(calls) != "[0 1 2]" {
		t.Fatalf("filled calls %v, want [0 1 2]", calls)
	}
	if !bytes.Equal(bytes.Join(bufs[:3], nil), f.data[:13]) {
		t.Error("the complete buffers do not hold the source bytes")
	}
	if r.Stats.Preconditions.Load() != 1 || r.Stats.Truncations.Load() != 2 {
		t.Errorf("Preconditions=%d Truncations=%d, want 1 and 2", r.Stats.Preconditions.Load(), r.Stats.Truncations.Load())
	}
}

// Many concurrent readers on one Reader share its Stats without races and
// each gets its own bytes.
func TestReaderConcurrent(t *testing.T) {
	f := newFake(t, 1<<16)
	f.chunk = 1000
	r := NewReader(f, fastPolicy)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			off := int64(g * 4000)
			p := make([]byte, 4000)
			if err := r.ReadAt(testCtx(t), f.obj(), p, off); err != nil {
				t.Errorf("ReadAt %d: %v", g, err)
				return
			}
			if !bytes.Equal(p, f.data[off:off+4000]) {
				t.Errorf("ReadAt %d: wrong bytes", g)
			}
		}(g)
	}
	wg.Wait()
	if r.Stats.Requests.Load() != 16 || r.Stats.BytesFetched.Load() != 16*4000 {
		t.Errorf("Requests=%d BytesFetched=%d", r.Stats.Requests.Load(), r.Stats.BytesFetched.Load())
	}
	checkIdle(t, r)
}

// FuzzReadVec drives ReadVec through an arbitrary script of transient
// faults and buffer layout: with enough attempts it must return exactly the
// source bytes, fetch every byte once, ask each retry for the missing tail
// only and fire filled once per buffer in order.
func FuzzReadVec(f *testing.F) {
	f.Add(uint16(10), []byte{5, 0, 13}, []byte{1, 7, 2, 9, 3, 0})
	f.Add(uint16(0), []byte{64}, []byte{})
	f.Add(uint16(900), []byte{0, 0, 1}, []byte{1, 0, 1, 0, 1, 0})
	f.Fuzz(func(t *testing.T, off16 uint16, sizes, script []byte) {
		if len(sizes) == 0 || len(sizes) > 32 || len(script) > 32 {
			t.Skip()
		}
		var total int64
		bufs := make([][]byte, len(sizes))
		for i, s := range sizes {
			bufs[i] = make([]byte, s)
			total += int64(s)
		}
		if total == 0 {
			t.Skip() // Open's contract needs n > 0
		}
		var faults []fault
		for i := 0; i+1 < len(script); i += 2 {
			k := int(script[i+1])
			switch script[i] % 3 {
			case 0:
				faults = append(faults, fault{kind: truncate, k: k})
			case 1:
				faults = append(faults, fault{kind: breakBody, k: k, err: io.ErrUnexpectedEOF})
			default:
				faults = append(faults, fault{kind: openErr, err: errors.New("503")})
			}
		}
		fs := newFake(t, 1024+8192, faults...)
		fs.chunk = 1 + int(off16%17)
		off := int64(off16 % 1024)
		pol := Policy{Attempts: len(faults) + 1, BackoffMax: 0}
		r := NewReader(fs, pol)
		var calls []int
		err := r.ReadVec(context.Background(), fs.obj(), off, bufs, func(i int) { calls = append(calls, i) })
		if err != nil {
			t.Fatalf("ReadVec: %v", err)
		}
		if !bytes.Equal(bytes.Join(bufs, nil), fs.data[off:off+total]) {
			t.Fatal("wrong bytes")
		}
		for i, c := range calls {
			if c != i {
				t.Fatalf("filled calls %v", calls)
			}
		}
		if len(calls) != len(bufs) {
			t.Fatalf("filled called %d times for %d buffers", len(calls), len(bufs))
		}
		var prev int64 = -1
		for i, q := range fs.requests() {
			if q.off+q.n != off+total || q.off < prev {
				t.Fatalf("GET %d [%d, +%d) for read [%d, %d)", i, q.off, q.n, off, off+total)
			}
			if i > 0 && q.off != off+fs.served-fs.servedAfter(i) {
				t.Fatalf("GET %d starts at %d, not where the bytes stopped", i, q.off)
			}
			prev = q.off
		}
		if r.Stats.BytesFetched.Load() != total {
			t.Fatalf("BytesFetched = %d, want %d", r.Stats.BytesFetched.Load(), total)
		}
	})
}

// servedAfter sums the bytes delivered by attempts i and later.
func (f *fakeStore) servedAfter(i int) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, m := range f.per[i:] {
		n += m
	}
	return n
}

// With the low-speed limit off, a body that stops after its first bytes is
// still a stall: the watchdog checks every first-byte timeout for progress.
func TestReadAtStallAfterFirstBytesLowSpeedOff(t *testing.T) {
	pol := fastPolicy
	pol.FirstByteTimeout = 50 * time.Millisecond // and LowSpeedLimit 0: off
	f := newFake(t, 4096, fault{kind: stallBody, k: 10})
	r := NewReader(f, pol)
	p := make([]byte, 1000)
	if err := r.ReadAt(testCtx(t), f.obj(), p, 0); err != nil {
		t.Fatalf("ReadAt: %v", err)
	}
	if !bytes.Equal(p, f.data[:1000]) {
		t.Fatal("wrong bytes after the stall")
	}
	if got := r.Stats.Stalls.Load(); got != 1 {
		t.Errorf("Stalls = %d, want 1", got)
	}
	if reqs := f.requests(); len(reqs) != 2 || reqs[1].off != 10 {
		t.Errorf("GETs %+v, want a second one from offset 10", reqs)
	}
}

// allThenErr delivers its bytes, the last ones together with an error other
// than EOF, as io.Reader allows.
type allThenErr struct{ data []byte }

func (b *allThenErr) Read(p []byte) (int, error) {
	n := copy(p, b.data)
	b.data = b.data[n:]
	if len(b.data) == 0 {
		return n, errors.New("connection reset by peer")
	}
	return n, nil
}

func (b *allThenErr) Close() error { return nil }

type allThenErrStore struct {
	*fakeStore
	sizes []int64
}

func (s *allThenErrStore) Open(ctx context.Context, key, etag string, off, n int64) (io.ReadCloser, error) {
	s.sizes = append(s.sizes, n)
	return &allThenErr{data: append([]byte(nil), s.data[off:off+n]...)}, nil
}

// A body whose last bytes come with an error has still delivered them: the
// read succeeds with one GET, and never asks for an empty range.
func TestReadAtAllBytesThenError(t *testing.T) {
	f := newFake(t, 100)
	s := &allThenErrStore{fakeStore: f}
	r := NewReader(s, fastPolicy)
	p := make([]byte, 100)
	if err := r.ReadAt(testCtx(t), f.obj(), p, 0); err != nil {
		t.Fatalf("every byte arrived, yet ReadAt failed: %v (GET sizes %v)", err, s.sizes)
	}
	if !bytes.Equal(p, f.data) {
		t.Fatal("wrong bytes")
	}
	if len(s.sizes) != 1 {
		t.Errorf("GET sizes %v, want one GET", s.sizes)
	}
}
