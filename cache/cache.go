// Package cache holds object bytes in RAM as fixed-size chunks under one
// byte budget (MAX_IO_QUEUE × IO_CHUNKSIZE).
//
// The budget has two parts with different owners:
//
//   - The window (three quarters of the budget) holds chunks being fetched
//     and chunks fetched ahead of a reader but not yet delivered. No cache
//     policy ever drops a chunk from the window: it leaves only once every
//     page of it has been served, when its fetch fails, when a claim of
//     higher priority reclaims it, or when it was served in part and then
//     left untouched for long (see Claim). This is what keeps prefetched
//     bytes from being thrown away before anyone reads them. Fetches ahead of
//     readers fill at most three quarters of the window; the rest is kept
//     for readers' misses.
//   - Served chunks are offered to a ristretto cache (the rest of the
//     budget) for re-reads. Its TinyLFU admission may reject them or evict
//     them later; the reader already has the bytes by then, and a re-read
//     simply fetches again.
//
// Ownership: a chunk's buffer is reference counted. The window holds one
// reference, ristretto holds one, and every caller of Claim or Get holds one
// until Release. A FUSE reply releases only after the kernel has copied the
// bytes, so a buffer is never reused under a reply. When the count reaches
// zero the buffer goes back to a free list, which together with the live
// chunks never holds more than the budget; a Chunk value is never reused,
// so a stale pointer found in ristretto can only fail tryRef.
//
// Locking: Cache.mu guards the window map, its byte count and the window
// fields of every Chunk (class, seq, loading, inWindow, served pages). A
// chunk's data is written only by its single filler before ready is closed
// and is read-only afterwards.
package cache

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/ristretto/v2"
	"golang.org/x/sys/unix"
)

// PageSize is the unit in which served bytes are tracked: the page cache
// never asks a FUSE server for less than a page, except at EOF.
const PageSize = 4096

// Class says why a chunk is wanted; lower values are more urgent.
type Class uint8

const (
	// Demand: a reader is blocked on this chunk now.
	Demand Class = iota
	// Readahead: ahead of an active sequential stream.
	Readahead
	// Eager: a background pull of a whole model.
	Eager
)

func (c Class) String() string {
	switch c {
	case Demand:
		return "demand"
	case Readahead:
		return "readahead"
	}
	return "eager"
}

// Key names one chunk of one object version.
type Key struct {
	Object string // identity of the object version: key and ETag
	Index  int64  // chunk number: bytes [Index×ChunkSize, (Index+1)×ChunkSize)
}

func (k Key) String() string { return k.Object + "#" + strconv.FormatInt(k.Index, 10) }

// ErrWindowFull is returned by Claim with wait=false when no window room
// can be had.
var ErrWindowFull = errors.New("cache window full")

// Config sizes a Cache.
type Config struct {
	Budget    int64 // bytes for all chunk buffers; at least 8 chunks
	ChunkSize int64 // a multiple of PageSize
}

// Stats counts cache events; all fields are updated atomically.
type Stats struct {
	Hits      atomic.Int64 // claims answered by a resident or loading chunk
	Misses    atomic.Int64 // claims that had to fetch
	Fills     atomic.Int64 // chunks filled successfully
	FillErrs  atomic.Int64 // fills that failed
	Reclaimed atomic.Int64 // unread chunks moved out of the window by a more urgent claim
	Dropped   atomic.Int64 // served chunks ristretto refused outright (Set false)
	Rejected  atomic.Int64 // served chunks ristretto's admission policy turned away
	Evicted   atomic.Int64 // chunks ristretto evicted after admitting them
	Waits     atomic.Int64 // claims that waited for window room
}

// Cache is the chunk cache. It is safe for concurrent use.
type Cache struct {
	chunkSize int64
	budget    int64
	windowMax int64
	rc        *ristretto.Cache[string, *Chunk]
	// rcMu guards rc against Close: ristretto panics on a Set after Close,
	// and a lazily unmounted file system may still serve reads then.
	rcMu     sync.RWMutex
	rcClosed bool

	Stats Stats

	mu          sync.Mutex
	window      map[Key]*Chunk
	windowBytes int64
	seq         uint64
	// flow counts the bytes of the chunks claimed so far: the clock by
	// which a chunk a reader stopped reading half way goes stale.
	flow     int64
	released chan struct{} // closed and replaced whenever window room frees up

	freeMu    sync.Mutex
	free      [][]byte
	allocated int64 // bytes in live chunk buffers plus the free list
}

// New builds a cache.
func New(cfg Config) (*Cache, error) {
	if cfg.ChunkSize <= 0 || cfg.ChunkSize%PageSize != 0 {
		return nil, fmt.Errorf("chunk size %d must be a positive multiple of %d", cfg.ChunkSize, PageSize)
	}
	if cfg.Budget < 8*cfg.ChunkSize {
		return nil, fmt.Errorf("cache budget %d must hold at least 8 chunks of %d bytes", cfg.Budget, cfg.ChunkSize)
	}
	chunks := cfg.Budget / cfg.ChunkSize
	windowChunks := chunks * 3 / 4
	c := &Cache{
		chunkSize: cfg.ChunkSize,
		budget:    chunks * cfg.ChunkSize,
		windowMax: windowChunks * cfg.ChunkSize,
		window:    make(map[Key]*Chunk),
		released:  make(chan struct{}),
	}
	rcChunks := chunks - windowChunks
	rc, err := ristretto.NewCache(&ristretto.Config[string, *Chunk]{
		NumCounters:        max(10*rcChunks, 1000),
		MaxCost:            rcChunks * cfg.ChunkSize,
		BufferItems:        64,
		IgnoreInternalCost: true,
		Metrics:            true,
		OnReject:           func(*ristretto.Item[*Chunk]) { c.Stats.Rejected.Add(1) },
		OnEvict:            func(*ristretto.Item[*Chunk]) { c.Stats.Evicted.Add(1) },
		OnExit: func(ch *Chunk) {
			if ch != nil {
				ch.Release()
			}
		},
	})
	if err != nil {
		return nil, err
	}
	c.rc = rc
	return c, nil
}

// ChunkSize is the size of every chunk but an object's last.
func (c *Cache) ChunkSize() int64 { return c.chunkSize }

// Budget is the byte budget, rounded down to whole chunks.
func (c *Cache) Budget() int64 { return c.budget }

// WindowMax is the byte size of the window.
func (c *Cache) WindowMax() int64 { return c.windowMax }

// AheadMax is how much of the window fetches ahead of readers may fill.
func (c *Cache) AheadMax() int64 { return c.limit(Readahead) }

// WindowBytes is the window's current occupancy.
func (c *Cache) WindowBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.windowBytes
}

// Allocated is the bytes held in chunk buffers, live or free.
func (c *Cache) Allocated() int64 {
	c.freeMu.Lock()
	defer c.freeMu.Unlock()
	return c.allocated
}

// Released returns a channel that is closed the next time window room
// frees up.
func (c *Cache) Released() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.released
}

// Close drops every cached chunk. Chunks still referenced stay valid until
// their holders release them.
func (c *Cache) Close() {
	c.rcMu.Lock()
	defer c.rcMu.Unlock()
	if !c.rcClosed {
		c.rcClosed = true
		c.rc.Close()
	}
}

// ristretto runs fn on rc unless the cache is closed, and reports whether
// it ran.
func (c *Cache) ristretto(fn func(rc *ristretto.Cache[string, *Chunk])) bool {
	c.rcMu.RLock()
	defer c.rcMu.RUnlock()
	if c.rcClosed {
		return false
	}
	fn(c.rc)
	return true
}

// Get returns the chunk for k, resident or loading, with a reference the
// caller must Release, or nil.
func (c *Cache) Get(k Key) *Chunk {
	c.mu.Lock()
	if ch := c.window[k]; ch != nil {
		ch.refs.Add(1)
		c.mu.Unlock()
		return ch
	}
	c.mu.Unlock()
	var ch *Chunk
	c.ristretto(func(rc *ristretto.Cache[string, *Chunk]) { ch, _ = rc.Get(k.String()) })
	if ch != nil && ch.tryRef() {
		return ch
	}
	return nil
}

// Claim returns the chunk for k with a reference the caller must Release.
// If fill is true the caller is its filler: it must write the bytes into
// Buffer and call Fill exactly once, on a context of its own, since other
// readers may wait for the same fill.
//
// A new chunk needs window room. When the window is full, Claim moves the
// newest ready, unread chunk of a less urgent class out to ristretto; any
// claim may then move out a chunk served in part and untouched since (one
// a reader abandoned half read, which would otherwise hold its room for
// good), and a Demand claim the oldest ready Demand chunk. Chunks still
// loading are never moved. If nothing can move, Claim waits for room when
// wait is set and returns ErrWindowFull otherwise.
func (c *Cache) Claim(ctx context.Context, k Key, class Class, wait bool) (ch *Chunk, fill bool, err error) {
	if ch := c.Get(k); ch != nil {
		c.Stats.Hits.Add(1)
		return ch, false, nil
	}
	c.mu.Lock()
	waited := false
	for {
		if ch := c.window[k]; ch != nil {
			// Someone else claimed it while we did not hold the lock.
			ch.refs.Add(1)
			c.mu.Unlock()
			c.Stats.Hits.Add(1)
			return ch, false, nil
		}
		if c.windowBytes+c.chunkSize <= c.limit(class) {
			break
		}
		if victim := c.victimLocked(class); victim != nil {
			c.removeLocked(victim)
			c.mu.Unlock()
			c.Stats.Reclaimed.Add(1)
			c.toRistretto(victim)
			c.mu.Lock()
			continue
		}
		if !wait {
			c.mu.Unlock()
			return nil, false, ErrWindowFull
		}
		if !waited {
			waited = true
			c.Stats.Waits.Add(1)
		}
		rel := c.released
		c.mu.Unlock()
		select {
		case <-rel:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		c.mu.Lock()
	}
	c.seq++
	c.flow += c.chunkSize
	ch = &Chunk{key: k, cache: c, ready: make(chan struct{}), class: class, seq: c.seq, loading: true, inWindow: true}
	ch.refs.Store(2) // the window's and the caller's
	c.window[k] = ch
	c.windowBytes += c.chunkSize
	c.mu.Unlock()
	// Nobody touches the buffer before Fill but the caller, and allocBuf
	// may wait for ristretto: allocate outside the lock.
	ch.buf = c.allocBuf()
	c.Stats.Misses.Add(1)
	return ch, true, nil
}

// Drop removes every chunk of object from the window: the object will not
// be read again (its model was detached). Chunks still loading leave when
// their fill ends. Ristretto's copies age out on their own.
func (c *Cache) Drop(object string) {
	c.mu.Lock()
	var out []*Chunk
	for k, ch := range c.window {
		if k.Object != object {
			continue
		}
		if ch.loading {
			ch.dropped = true
			continue
		}
		c.removeLocked(ch)
		out = append(out, ch)
	}
	c.mu.Unlock()
	for _, ch := range out {
		ch.Release() // the window's reference
	}
}

// limit is how much of the window a claim of class may fill: readers'
// misses may fill it all, fetches ahead of them leave a quarter free, so
// that a reader never waits behind the whole window loading for others
// (or failing to).
func (c *Cache) limit(class Class) int64 {
	if class == Demand {
		return c.windowMax
	}
	return c.windowMax - c.windowMax/4
}

// victimLocked picks the ready chunk a claim of class may move out: the
// newest one of a less urgent class; else the one a reader touched least
// recently if it has gone stale, that is, it was served in part and four
// windows' worth of chunks have been claimed since it was last served (its
// reader stopped half way, or the kernel will never ask for its other
// pages; the other streams of an interleaved load come back long before);
// else, for a Demand claim, the oldest Demand chunk.
func (c *Cache) victimLocked(class Class) *Chunk {
	var newestLess, stalest, oldestDemand *Chunk
	for _, ch := range c.window {
		if ch.loading {
			continue
		}
		switch {
		case ch.class > class:
			if newestLess == nil || ch.seq > newestLess.seq {
				newestLess = ch
			}
		case ch.class == Demand:
			if ch.unserved < ch.pages() && c.flow-ch.touched > 4*c.windowMax &&
				(stalest == nil || ch.touched < stalest.touched) {
				stalest = ch
			}
			if class == Demand && (oldestDemand == nil || ch.seq < oldestDemand.seq) {
				oldestDemand = ch
			}
		}
	}
	switch {
	case newestLess != nil:
		return newestLess
	case stalest != nil:
		return stalest
	}
	return oldestDemand
}

// pages is how many pages the filled chunk holds.
func (ch *Chunk) pages() int { return (ch.n + PageSize - 1) / PageSize }

// removeLocked takes ch out of the window; the window's reference passes
// to the caller.
func (c *Cache) removeLocked(ch *Chunk) {
	delete(c.window, ch.key)
	ch.inWindow = false
	c.windowBytes -= c.chunkSize
	c.wakeLocked()
}

// wakeLocked wakes the claims waiting for window room to look again.
func (c *Cache) wakeLocked() {
	close(c.released)
	c.released = make(chan struct{})
}

// toRistretto hands the window's reference of a ready chunk to ristretto.
func (c *Cache) toRistretto(ch *Chunk) {
	set := false
	c.ristretto(func(rc *ristretto.Cache[string, *Chunk]) { set = rc.Set(ch.key.String(), ch, c.chunkSize) })
	if !set {
		c.Stats.Dropped.Add(1)
		ch.Release()
	}
}

func (c *Cache) allocBuf() []byte {
	for waited := false; ; waited = true {
		c.freeMu.Lock()
		if n := len(c.free); n > 0 {
			b := c.free[n-1]
			c.free = c.free[:n-1]
			c.freeMu.Unlock()
			return b
		}
		if waited || c.allocated+c.chunkSize <= c.budget {
			c.allocated += c.chunkSize
			c.freeMu.Unlock()
			return mapBuf(int(c.chunkSize))
		}
		c.freeMu.Unlock()
		// Buffers handed to ristretto come back once its processor has
		// applied the Sets (rejecting or evicting): wait for that rather
		// than grow past the budget.
		c.ristretto(func(rc *ristretto.Cache[string, *Chunk]) { rc.Wait() })
	}
}

// freeBuf keeps b for reuse while live and free buffers fit the budget;
// beyond it (buffers that outlived eviction under a FUSE reply) b is
// unmapped.
func (c *Cache) freeBuf(b []byte) {
	c.freeMu.Lock()
	defer c.freeMu.Unlock()
	if c.allocated <= c.budget {
		c.free = append(c.free, b)
		return
	}
	c.allocated -= c.chunkSize
	unmapBuf(b)
}

// mapBuf allocates a chunk buffer outside the Go heap, asking for huge
// pages: every byte served is copied twice through these buffers (from the
// socket, into the page cache), and 2 MiB pages spare the TLB and the page
// pinning of both copies. Outside the heap, buffers also cost the garbage
// collector nothing and need no zeroing. Where mmap fails the heap serves.
func mapBuf(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, n)
	}
	unix.Madvise(b, unix.MADV_HUGEPAGE) // advice only: without THP, small pages
	return b
}

func unmapBuf(b []byte) {
	unix.Munmap(b) // fails for a heap buffer, which the collector takes
}

// Chunk is one cached chunk. See the package comment for its life cycle.
type Chunk struct {
	key   Key
	cache *Cache
	refs  atomic.Int32
	ready chan struct{}
	buf   []byte // chunkSize bytes; the data is buf[:n]
	n     int
	err   error

	// Guarded by cache.mu.
	class    Class
	seq      uint64
	loading  bool
	inWindow bool
	dropped  bool     // leave the window when filled
	served   []uint64 // bitmap of served pages
	unserved int
	touched  int64 // cache.flow when a page was last served
}

// Key is the chunk's key.
func (ch *Chunk) Key() Key { return ch.key }

// Buffer is the whole buffer, for the filler only.
func (ch *Chunk) Buffer() []byte { return ch.buf }

// Fill publishes the first n bytes of Buffer, or err, and wakes waiters. A
// failed chunk leaves the window at once so that the next claim fetches
// afresh.
func (ch *Chunk) Fill(n int, err error) {
	c := ch.cache
	ch.n, ch.err = n, err
	c.mu.Lock()
	ch.loading = false
	pages := ch.pages()
	ch.served = make([]uint64, (pages+63)/64)
	ch.unserved = pages
	failed := err != nil
	removed := (failed || pages == 0 || ch.dropped) && ch.inWindow
	if removed {
		c.removeLocked(ch)
	} else if ch.inWindow {
		c.wakeLocked() // a ready chunk can be reclaimed: waiters may now find room
	}
	c.mu.Unlock()
	close(ch.ready)
	if failed {
		c.Stats.FillErrs.Add(1)
	} else {
		c.Stats.Fills.Add(1)
	}
	if removed {
		ch.Release() // the window's reference
	}
}

// Wait blocks until the chunk is filled and returns the fill's error. A
// canceled ctx ends the wait, not the fill.
func (ch *Chunk) Wait(ctx context.Context) error {
	select {
	case <-ch.ready:
		return ch.err
	default:
	}
	select {
	case <-ch.ready:
		return ch.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Ready reports whether the fill has finished.
func (ch *Chunk) Ready() bool {
	select {
	case <-ch.ready:
		return true
	default:
		return false
	}
}

// Data is the chunk's bytes; valid once Wait returned nil.
func (ch *Chunk) Data() []byte { return ch.buf[:ch.n] }

// Served records that bytes [from, to) of the chunk reached a reader. A
// page counts once it is covered entirely, or up to the chunk's end. The
// first serve makes the chunk Demand class, so that readahead for other
// streams cannot take it from a reader in mid-chunk; once every page has
// been served the chunk leaves the window for ristretto.
//
// It reports whether every page of the chunk has now been served.
func (ch *Chunk) Served(from, to int) (complete bool) {
	c := ch.cache
	first := (from + PageSize - 1) / PageSize
	last := to / PageSize // exclusive
	if to >= ch.n {
		last = ch.pages()
	}
	c.mu.Lock()
	if !ch.inWindow || ch.loading {
		// Filled, and served whole before (n is read only once filled).
		complete = !ch.loading && ch.err == nil && ch.n > 0 && ch.unserved == 0
		c.mu.Unlock()
		return complete
	}
	ch.class = Demand
	ch.touched = c.flow
	for p := first; p < last; p++ {
		w, b := p/64, uint64(1)<<(p%64)
		if ch.served[w]&b == 0 {
			ch.served[w] |= b
			ch.unserved--
		}
	}
	done := ch.unserved == 0
	if done {
		c.removeLocked(ch)
	}
	c.mu.Unlock()
	if done {
		c.toRistretto(ch)
	}
	return done
}

// ServedPages counts the pages served so far.
func (ch *Chunk) ServedPages() int {
	ch.cache.mu.Lock()
	defer ch.cache.mu.Unlock()
	n := 0
	for _, w := range ch.served {
		n += bits.OnesCount64(w)
	}
	return n
}

// Ref takes another reference on a chunk the caller already holds one on.
func (ch *Chunk) Ref() *Chunk {
	ch.refs.Add(1)
	return ch
}

// tryRef takes a reference unless the chunk has already been freed.
func (ch *Chunk) tryRef() bool {
	for {
		r := ch.refs.Load()
		if r <= 0 {
			return false
		}
		if ch.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// Release drops one reference; the last one frees the buffer.
func (ch *Chunk) Release() {
	switch r := ch.refs.Add(-1); {
	case r == 0:
		b := ch.buf
		ch.buf = nil
		ch.cache.freeBuf(b)
	case r < 0:
		panic("cache: chunk released more often than referenced")
	}
}
