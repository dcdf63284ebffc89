// Package prefetch moves object bytes into the chunk cache ahead of the
// readers, and fetches what they miss.
//
// Every GET goes through one gate of Concurrency slots, handed out by
// priority: a reader's miss (Demand) first, then readahead for a sequential
// stream (Readahead), then background pulls of a whole model (Eager). A
// fetch that a reader starts waiting for is promoted to Demand while it
// queues. Readahead and eager pulls group consecutive chunks into GETs of
// PartSize bytes; a demand miss fetches just the chunk it needs.
//
// How far ahead anything runs is bounded by the cache's window: a pull
// claims window room for each chunk before fetching it, readahead gives up
// when there is none, and an eager pull waits for readers to consume what
// it fetched earlier. So a model much larger than the cache streams through
// it without evicting bytes a reader has not read yet.
package prefetch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/cache"
)

// Config tunes a Fetcher.
type Config struct {
	// PartSize is the size of readahead and eager GETs, rounded to whole
	// chunks (at least one).
	PartSize int64
	// Concurrency bounds the GETs in flight.
	Concurrency int
	// MaxReadahead bounds how far ahead of one stream readahead runs, in
	// bytes; 0 means half the cache window.
	MaxReadahead int64
	// Adaptive searches for the best concurrency up to Concurrency at run
	// time instead of using Concurrency outright.
	Adaptive bool
}

// Stats counts what a Fetcher did; fields are updated atomically.
type Stats struct {
	DemandFetches    atomic.Int64 // GETs for chunks a reader missed
	ReadaheadFetches atomic.Int64 // GETs started by stream readahead
	EagerFetches     atomic.Int64 // GETs started by eager pulls
	Promotions       atomic.Int64 // queued fetches a reader was waiting on
	Rereads          atomic.Int64 // GETs of just the bytes a reader asked again (see reread)
	BytesServed      atomic.Int64 // bytes delivered to readers
	Concurrency      atomic.Int64 // the gate's current limit
}

// Fetcher fills the chunk cache from the stores its files live in. It is
// safe for concurrent use.
type Fetcher struct {
	cache   *cache.Cache
	fetched *backend.Stats // shared by the readers of all files
	gate    *gate
	cfg     Config

	Stats Stats

	ctx    context.Context // fetches outlive the requests that start them
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	pending map[cache.Key]*ticket // claimed chunks whose GET waits for a slot
	wanted  map[cache.Key]bool    // loading chunks a reader waits for before their GET is started
	failed  map[cache.Key]failure // chunks whose fetch failed lately
	// scopes numbers the readers files are read through: a file's chunks
	// are keyed by its reader's number, so models attached with their own
	// credentials never share cached bytes, nor drop each other's. The map
	// keeps each reader, so a number is never handed out twice.
	scopes map[*backend.Reader]int
}

// failure is a fetch that gave up, remembered for failMemory: the kernel
// retries a failed page fault while a signal is pending (and Go runtimes
// always have one), and each retry would otherwise start all the attempts
// again, so an mmap reader of a broken object would spin instead of
// getting SIGBUS.
type failure struct {
	err   error
	until time.Time
}

const failMemory = 2 * time.Second

// New returns a Fetcher filling c. The readers of all its files count into
// stats, which the concurrency search watches.
func New(c *cache.Cache, stats *backend.Stats, cfg Config) *Fetcher {
	if cfg.Concurrency < 1 {
		cfg.Concurrency = 1
	}
	cfg.PartSize = max(cfg.PartSize/c.ChunkSize(), 1) * c.ChunkSize()
	if cfg.MaxReadahead <= 0 {
		cfg.MaxReadahead = c.WindowMax() / 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Fetcher{cache: c, fetched: stats, gate: newGate(cfg.Concurrency), cfg: cfg,
		ctx: ctx, cancel: cancel, pending: make(map[cache.Key]*ticket), wanted: make(map[cache.Key]bool),
		failed: make(map[cache.Key]failure), scopes: make(map[*backend.Reader]int)}
	f.Stats.Concurrency.Store(int64(cfg.Concurrency))
	if cfg.Adaptive {
		f.wg.Add(1)
		go f.tune()
	}
	return f
}

// Config returns the settings in effect (after rounding).
func (f *Fetcher) Config() Config { return f.cfg }

// Close stops all fetches and waits for them. Chunks they were filling
// fail with context.Canceled.
func (f *Fetcher) Close() {
	f.mu.Lock()
	f.closed = true // no fetch starts after this: wg.Add must not race wg.Wait
	f.mu.Unlock()
	f.cancel()
	f.wg.Wait()
}

// File is the fetch state of one object version: the reader of its store,
// its stream detector and which chunks have been delivered to readers. Get
// one per object version from Fetcher.File and share it between all opens.
type File struct {
	Name   string // path inside the mount, for logs and eager ordering
	Obj    backend.Object
	reader *backend.Reader
	id     string

	forgotten atomic.Bool // Forget was called: fetch no more ahead of readers

	mu        sync.Mutex
	streams   streams
	delivered bitmap // chunks some reader has been served from
	complete  bitmap // chunks every byte of which has reached readers
}

// File returns the fetch state for obj, read through r and shown to
// readers as name.
func (f *Fetcher) File(name string, obj backend.Object, r *backend.Reader) *File {
	f.mu.Lock()
	scope, ok := f.scopes[r]
	if !ok {
		scope = len(f.scopes) + 1
		f.scopes[r] = scope
	}
	f.mu.Unlock()
	id := strconv.Itoa(scope) + "\x00" + r.Store.String() + "\x00" + obj.Key + "\x00" + obj.ETag
	return &File{Name: name, Obj: obj, reader: r, id: id}
}

func (f *Fetcher) key(file *File, c int64) cache.Key { return cache.Key{Object: file.id, Index: c} }

// chunkLen is the byte length of chunk c of file.
func (f *Fetcher) chunkLen(file *File, c int64) int {
	cs := f.cache.ChunkSize()
	return int(min(cs, file.Obj.Size-c*cs))
}

func (f *Fetcher) lastChunk(file *File) int64 {
	return (file.Obj.Size - 1) / f.cache.ChunkSize()
}

// Span is the part [From, To) of a chunk's data that answers a read.
type Span struct {
	Chunk    *cache.Chunk // nil for a reread: data holds the bytes
	From, To int
	data     []byte
}

// Bytes is the span's data.
func (s Span) Bytes() []byte {
	if s.Chunk == nil {
		return s.data[s.From:s.To]
	}
	return s.Chunk.Data()[s.From:s.To]
}

// Read returns the chunks holding bytes [off, off+n) of file, clamped at
// EOF, fetching what is missing, and starts readahead when the read
// continues a stream. The caller owns one reference per span: it passes
// them to Delivered once the bytes have reached the reader, or to Release.
// ctx ends the wait, never a fetch other readers may share.
func (f *Fetcher) Read(ctx context.Context, file *File, off int64, n int) ([]Span, error) {
	if spans, ok, err := f.reread(ctx, file, off, n); ok {
		return spans, err
	}
	spans, err := f.claim(ctx, file, off, n)
	if err != nil || len(spans) == 0 {
		return spans, err
	}
	last := spans[len(spans)-1].Chunk.Key().Index
	maxChunks := f.cfg.MaxReadahead / f.cache.ChunkSize()
	file.mu.Lock()
	from, to := file.streams.access(last, maxChunks, f.lastChunk(file))
	file.mu.Unlock()
	if from < to {
		f.pull(f.ctx, file, chunkRange(from, to), cache.Readahead, false, nil)
	}
	for _, s := range spans {
		if err := f.wait(ctx, s.Chunk); err != nil {
			Release(spans)
			return nil, err
		}
	}
	return spans, nil
}

// reread serves a read of bytes the kernel was given before and has since
// dropped from its page cache (memory pressure, proactive reclaim): when
// every byte of the range's chunks reached readers and none of the chunks
// is cached any more, it fetches just the bytes asked, into a buffer of
// their own, instead of whole chunks of which the kernel still holds the
// rest. ok is false when the read is not such a read.
func (f *Fetcher) reread(ctx context.Context, file *File, off int64, n int) (spans []Span, ok bool, err error) {
	end := min(off+int64(n), file.Obj.Size)
	if off < 0 || off >= end {
		return nil, false, nil
	}
	cs := f.cache.ChunkSize()
	for c := off / cs; c*cs < end; c++ {
		if !file.has(&file.complete, c) {
			return nil, false, nil
		}
		if err := f.recentFailure(f.key(file, c)); err != nil {
			return nil, true, err
		}
		if ch := f.cache.Get(f.key(file, c)); ch != nil {
			ch.Release()
			return nil, false, nil
		}
	}
	buf := make([]byte, end-off)
	f.Stats.Rereads.Add(1)
	if err := f.readGated(ctx, cache.Demand, file, buf, off); err != nil {
		if ctx.Err() == nil {
			var keys []cache.Key
			for c := off / cs; c*cs < end; c++ {
				keys = append(keys, f.key(file, c))
			}
			f.remember(keys, err)
		}
		return nil, true, fmt.Errorf("reread %s: %w", file.Name, err)
	}
	return []Span{{From: 0, To: len(buf), data: buf}}, true, nil
}

// readGated reads bytes of file outside the cache with one GET that, like
// every other, waits for a slot of the gate at class.
func (f *Fetcher) readGated(ctx context.Context, class cache.Class, file *File, buf []byte, off int64) error {
	if err := f.gate.acquire(ctx, newTicket(class)); err != nil {
		return err
	}
	defer f.gate.release()
	return file.reader.ReadAt(ctx, file.Obj, buf, off)
}

// claim claims the chunks for [off, off+n) for a reader, starting a GET for
// each one missing, and returns them unwaited.
func (f *Fetcher) claim(ctx context.Context, file *File, off int64, n int) ([]Span, error) {
	end := min(off+int64(n), file.Obj.Size)
	if off < 0 || off >= end {
		return nil, nil
	}
	cs := f.cache.ChunkSize()
	var spans []Span
	for c := off / cs; c*cs < end; c++ {
		if err := f.recentFailure(f.key(file, c)); err != nil {
			Release(spans)
			return nil, err
		}
		ch, fill, err := f.cache.Claim(ctx, f.key(file, c), cache.Demand, true)
		if err != nil {
			Release(spans)
			return nil, err
		}
		if fill {
			f.Stats.DemandFetches.Add(1)
			f.fetch(file, []*cache.Chunk{ch.Ref()}, cache.Demand, nil)
		}
		from := max(off, c*cs) - c*cs
		to := min(end, (c+1)*cs) - c*cs
		spans = append(spans, Span{Chunk: ch, From: int(from), To: int(to)})
	}
	return spans, nil
}

// wait waits for ch, first promoting its queued GET if it has one.
func (f *Fetcher) wait(ctx context.Context, ch *cache.Chunk) error {
	if ch.Ready() {
		return ch.Wait(ctx)
	}
	f.mu.Lock()
	t := f.pending[ch.Key()]
	if t == nil && !ch.Ready() {
		// Claimed by a pull that has not started its GET: it starts it
		// at Demand (see fetch).
		f.wanted[ch.Key()] = true
	}
	f.mu.Unlock()
	if t != nil {
		f.Stats.Promotions.Add(1)
		f.gate.promote(t, cache.Demand)
	}
	return ch.Wait(ctx)
}

// Delivered records that spans reached a reader and releases them.
func (f *Fetcher) Delivered(file *File, spans []Span) {
	for _, s := range spans {
		f.Stats.BytesServed.Add(int64(s.To - s.From))
		if s.Chunk == nil {
			continue // a reread: its chunks are marked already
		}
		// Marked delivered before Served can hand the chunk to ristretto
		// (which may drop it): a pull that misses it then knows a reader
		// has it and does not fetch it again.
		c := s.Chunk.Key().Index
		file.mu.Lock()
		file.delivered.set(c)
		file.mu.Unlock()
		if s.Chunk.Served(s.From, s.To) {
			file.mu.Lock()
			file.complete.set(c)
			file.mu.Unlock()
		}
		s.Chunk.Release()
	}
}

// bitmap is a set of chunk indexes.
type bitmap []uint64

func (b *bitmap) set(c int64) {
	for int64(len(*b)) <= c/64 {
		*b = append(*b, 0)
	}
	(*b)[c/64] |= 1 << (c % 64)
}

func (b bitmap) has(c int64) bool { return c/64 < int64(len(b)) && b[c/64]&(1<<(c%64)) != 0 }

// has reports whether chunk c is in one of file's bitmaps.
func (file *File) has(b *bitmap, c int64) bool {
	file.mu.Lock()
	defer file.mu.Unlock()
	return b.has(c)
}

// remember records chunks whose fetch failed, unless the fetcher is
// closing.
func (f *Fetcher) remember(keys []cache.Key, err error) {
	if f.ctx.Err() != nil {
		return
	}
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, fl := range f.failed {
		if now.After(fl.until) {
			delete(f.failed, k)
		}
	}
	for _, k := range keys {
		f.failed[k] = failure{err: err, until: now.Add(failMemory)}
	}
}

// recentFailure is the error of a fetch of k that failed lately, or nil.
func (f *Fetcher) recentFailure(k cache.Key) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := f.failed[k]
	if !ok {
		return nil
	}
	if time.Now().After(fl.until) {
		delete(f.failed, k)
		return nil
	}
	return fl.err
}

// ErrForgotten ends prefetching for a File that Forget was called on.
var ErrForgotten = errors.New("the file changed or was removed while it was being prefetched")

// Forget drops file's chunks from the cache's window and stops fetching
// ahead for it: its object version has left the tree. Readers still
// holding it fetch what they miss on demand.
func (f *Fetcher) Forget(file *File) {
	file.forgotten.Store(true)
	f.cache.Drop(file.id)
}

// Release drops the references of spans that will not be delivered.
func Release(spans []Span) {
	for _, s := range spans {
		if s.Chunk != nil {
			s.Chunk.Release()
		}
	}
}

func chunkRange(from, to int64) []int64 {
	cs := make([]int64, 0, to-from)
	for c := from; c < to; c++ {
		cs = append(cs, c)
	}
	return cs
}

// pull fetches the listed chunks of file at class, in order, skipping
// those already cached or already delivered to a reader. Consecutive
// chunks share a GET of up to PartSize. Without wait, pull stops at the
// first chunk the window has no room for; with wait, it waits for room
// (until ctx ends). t, if set, follows the chunks and the GETs.
func (f *Fetcher) pull(ctx context.Context, file *File, chunks []int64, class cache.Class, wait bool, t *tally) error {
	per := int(f.cfg.PartSize / f.cache.ChunkSize())
	var run []*cache.Chunk
	flush := func() {
		if len(run) > 0 {
			if class == cache.Eager {
				f.Stats.EagerFetches.Add(1)
			} else {
				f.Stats.ReadaheadFetches.Add(1)
			}
			f.fetch(file, run, class, t)
			run = nil
		}
	}
	defer flush()
	for _, c := range chunks {
		if err := ctx.Err(); err != nil {
			return err
		}
		if file.forgotten.Load() {
			return ErrForgotten
		}
		if len(run) > 0 && (run[len(run)-1].Key().Index != c-1 || len(run) == per) {
			flush()
		}
		if file.has(&file.delivered, c) {
			t.arrived(f.chunkLen(file, c))
			continue
		}
		k := f.key(file, c)
		ch, fill, err := f.cache.Claim(ctx, k, class, false)
		if errors.Is(err, cache.ErrWindowFull) {
			if !wait {
				return err
			}
			flush() // the chunks we hold must be on their way before we wait
			ch, fill, err = f.cache.Claim(ctx, k, class, true)
		}
		if err != nil {
			return err
		}
		if !fill {
			ch.Release()
			t.arrived(f.chunkLen(file, c))
			continue
		}
		run = append(run, ch)
	}
	return nil
}

// fetch starts one GET that fills chunks, consecutive chunks of file the
// caller claimed for filling; it takes over the caller's references. t, if
// set, hears of each chunk that arrives and of a failure, and waits for
// the GET.
func (f *Fetcher) fetch(file *File, chunks []*cache.Chunk, class cache.Class, t *tally) {
	tk := newTicket(class)
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		for _, ch := range chunks {
			ch.Fill(0, context.Canceled)
			ch.Release()
		}
		return
	}
	for _, ch := range chunks {
		f.pending[ch.Key()] = tk
		if f.wanted[ch.Key()] {
			delete(f.wanted, ch.Key())
			if tk.class != cache.Demand {
				tk.class = cache.Demand
				f.Stats.Promotions.Add(1)
			}
		}
	}
	f.wg.Add(1)
	t.started()
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		defer t.ended()
		err := f.gate.acquire(f.ctx, tk)
		f.mu.Lock()
		for _, ch := range chunks {
			delete(f.pending, ch.Key())
		}
		f.mu.Unlock()
		filled := 0
		if err == nil {
			bufs := make([][]byte, len(chunks))
			for i, ch := range chunks {
				bufs[i] = ch.Buffer()[:f.chunkLen(file, ch.Key().Index)]
			}
			off := chunks[0].Key().Index * f.cache.ChunkSize()
			err = file.reader.ReadVec(f.ctx, file.Obj, off, bufs, func(i int) {
				chunks[i].Fill(len(bufs[i]), nil)
				filled++
				t.arrived(len(bufs[i]))
			})
			f.gate.release()
		}
		if filled < len(chunks) {
			err = fmt.Errorf("fetch %s: %w", file.Name, err)
			keys := make([]cache.Key, 0, len(chunks)-filled)
			for _, ch := range chunks[filled:] {
				keys = append(keys, ch.Key())
			}
			f.remember(keys, err)
			for _, ch := range chunks[filled:] {
				ch.Fill(0, err)
			}
			if f.ctx.Err() == nil { // not the fetcher closing
				t.failed(err)
			}
		}
		// Readers that came after the GET started marked the chunks
		// wanted: now filled, they need nothing more.
		f.mu.Lock()
		for _, ch := range chunks {
			delete(f.wanted, ch.Key())
		}
		f.mu.Unlock()
		for _, ch := range chunks {
			ch.Release()
		}
	}()
}
