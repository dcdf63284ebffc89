package cache

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

const cs = 4 * PageSize

func newCache(t *testing.T, chunks int64) *Cache {
	t.Helper()
	c, err := New(Config{Budget: chunks * cs, ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func key(i int64) Key { return Key{Object: "obj\x00etag", Index: i} }

func fill(ch *Chunk, b byte) {
	buf := ch.Buffer()
	for i := range buf {
		buf[i] = b
	}
	ch.Fill(len(buf), nil)
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{{Budget: 8 * cs, ChunkSize: 0}, {Budget: 8 * cs, ChunkSize: cs + 1}, {Budget: 7 * cs, ChunkSize: cs}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// TestConcurrentMissesFetchOnce: many claimers of one chunk get one filler.
func TestConcurrentMissesFetchOnce(t *testing.T) {
	c := newCache(t, 16)
	var fillers atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, isFiller, err := c.Claim(context.Background(), key(1), Demand, true)
			if err != nil {
				t.Error(err)
				return
			}
			defer ch.Release()
			if isFiller {
				fillers.Add(1)
				fill(ch, 7)
			}
			if err := ch.Wait(context.Background()); err != nil || ch.Data()[0] != 7 || len(ch.Data()) != cs {
				t.Errorf("wait: %v, data %d bytes", err, len(ch.Data()))
			}
		}()
	}
	wg.Wait()
	if n := fillers.Load(); n != 1 {
		t.Errorf("%d fillers, want 1", n)
	}
}

// TestWindowNeverDropsUnreadChunks: once the window is full of unread
// eager chunks, an eager claim waits instead of evicting them, and room
// comes back only when a chunk is served.
func TestWindowNeverDropsUnreadChunks(t *testing.T) {
	c := newCache(t, 8) // window: 6 chunks, 4 of them for fetches ahead of readers
	n := c.limit(Eager) / cs
	for i := int64(0); i < n; i++ {
		ch, isFiller, err := c.Claim(context.Background(), key(i), Eager, false)
		if err != nil || !isFiller {
			t.Fatalf("claim %d: %v %v", i, isFiller, err)
		}
		fill(ch, byte(i))
		ch.Release()
	}
	if _, _, err := c.Claim(context.Background(), key(100), Eager, false); !errors.Is(err, ErrWindowFull) {
		t.Fatalf("claim beyond the window: %v, want ErrWindowFull", err)
	}
	got := make(chan error, 1)
	go func() {
		ch, _, err := c.Claim(context.Background(), key(100), Eager, true)
		if err == nil {
			ch.Release()
		}
		got <- err
	}()
	for c.Stats.Waits.Load() == 0 { // until the claim has started to wait
		runtime.Gosched()
	}
	select {
	case err := <-got:
		t.Fatalf("claim returned %v while the window was full of unread chunks", err)
	default:
	}
	// Serving chunk 0 entirely frees its room.
	ch := c.Get(key(0))
	if ch == nil {
		t.Fatal("chunk 0 is gone from the window")
	}
	ch.Served(0, cs)
	ch.Release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	for i := int64(1); i < n; i++ {
		ch := c.Get(key(i))
		if ch == nil || ch.Data()[0] != byte(i) {
			t.Fatalf("unread chunk %d was dropped", i)
		}
		ch.Release()
	}
}

// TestPriorityReclaim: a demand claim moves out the newest ready chunk of
// a less urgent class; chunks still loading are never moved.
func TestPriorityReclaim(t *testing.T) {
	c := newCache(t, 8)
	n := c.limit(Eager) / cs
	var loading *Chunk
	for i := int64(0); i < n; i++ {
		ch, _, err := c.Claim(context.Background(), key(i), Eager, false)
		if err != nil {
			t.Fatal(err)
		}
		if i == n-1 {
			loading = ch // the newest stays loading
			continue
		}
		fill(ch, 1)
		ch.Release()
	}
	// Readers' misses first use the room kept for them...
	reserve := (c.WindowMax() - c.WindowBytes()) / cs
	for i := int64(0); i < reserve; i++ {
		ch, isFiller, err := c.Claim(context.Background(), key(40+i), Demand, false)
		if err != nil || !isFiller {
			t.Fatalf("demand claim %d in the reserve: %v", i, err)
		}
		fill(ch, 2)
		ch.Release()
	}
	if c.Stats.Reclaimed.Load() != 0 {
		t.Fatalf("reclaimed %d while the reserve had room", c.Stats.Reclaimed.Load())
	}
	// ...then move out the newest ready chunk of a less urgent class.
	ch, isFiller, err := c.Claim(context.Background(), key(50), Demand, false)
	if err != nil || !isFiller {
		t.Fatalf("demand claim: %v", err)
	}
	fill(ch, 2)
	ch.Release()
	if c.Stats.Reclaimed.Load() != 1 {
		t.Errorf("reclaimed %d, want 1", c.Stats.Reclaimed.Load())
	}
	c.mu.Lock()
	_, victimIn := c.window[key(n-2)]
	_, loadingIn := c.window[key(n-1)]
	c.mu.Unlock()
	if victimIn || !loadingIn {
		t.Errorf("newest ready eager chunk in window: %v; loading chunk in window: %v", victimIn, loadingIn)
	}
	// An eager claim cannot reclaim anything.
	if _, _, err := c.Claim(context.Background(), key(51), Eager, false); !errors.Is(err, ErrWindowFull) {
		t.Errorf("eager claim on a full window: %v", err)
	}
	loading.Fill(0, errors.New("boom"))
	loading.Release()
	if c.Get(key(n-1)) != nil {
		t.Error("a failed chunk stayed cached")
	}
}

// Chunks readers stopped reading half way must not hold the window for
// good: once four windows' worth of chunks have been claimed since they
// were last served (here by readers' misses read whole through the room
// kept for them), readahead may move them out, the least recently served
// first, though not while they are fresh.
func TestAbandonedHalfReadChunksGoStale(t *testing.T) {
	c := newCache(t, 8)
	n := c.limit(Readahead) / cs
	for i := int64(0); i < n; i++ {
		ch, _, err := c.Claim(context.Background(), key(i), Demand, false)
		if err != nil {
			t.Fatal(err)
		}
		fill(ch, 1)
		ch.Served(0, PageSize) // the first page only: the reader goes away
		ch.Release()
	}
	windows := func(claimed int64) float64 { return float64(claimed*cs) / float64(c.WindowMax()) }
	for misses := int64(1); ; misses++ {
		ch, isFiller, err := c.Claim(context.Background(), key(1000+misses), Demand, false)
		if err != nil || !isFiller {
			t.Fatalf("demand claim: %v", err)
		}
		fill(ch, 2)
		ch.Served(0, cs) // read whole: it leaves the window
		ch.Release()
		ra, _, err := c.Claim(context.Background(), key(2000+misses), Readahead, false)
		if errors.Is(err, ErrWindowFull) {
			if windows(misses) > 5 {
				t.Fatalf("readahead still shut out after %.1f windows of misses", windows(misses))
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		fill(ra, 3)
		ra.Release()
		if windows(misses) < 3.5 {
			t.Errorf("a half-read chunk was moved out after %.1f windows of misses, while fresh", windows(misses))
		}
		break
	}
	c.mu.Lock()
	_, firstIn := c.window[key(0)]
	_, lastIn := c.window[key(n-1)]
	c.mu.Unlock()
	if firstIn || !lastIn {
		t.Errorf("the least recently served chunk should have gone: key 0 in window %v, key %d %v", firstIn, n-1, lastIn)
	}
	if c.Stats.Reclaimed.Load() != 1 {
		t.Errorf("reclaimed %d, want 1", c.Stats.Reclaimed.Load())
	}
}

// TestReaderWakesWhenLoadsFinish: a reader waiting for room while the
// whole window is loading is woken when a load finishes (the ready chunk
// can then be reclaimed), not only when a chunk leaves the window.
func TestReaderWakesWhenLoadsFinish(t *testing.T) {
	c := newCache(t, 8)
	var loading []*Chunk
	for i := int64(0); c.WindowBytes() < c.WindowMax(); i++ {
		class := Eager
		if c.WindowBytes()+cs > c.limit(Eager) {
			class = Demand // the reserve, taken by other readers' loads
		}
		ch, _, err := c.Claim(context.Background(), key(i), class, false)
		if err != nil {
			t.Fatal(err)
		}
		loading = append(loading, ch)
	}
	got := make(chan error, 1)
	go func() {
		ch, _, err := c.Claim(context.Background(), key(99), Demand, true)
		if err == nil {
			ch.Release()
		}
		got <- err
	}()
	for c.Stats.Waits.Load() == 0 {
		runtime.Gosched()
	}
	fill(loading[0], 1) // an eager chunk becomes ready: the reader may take its room
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	for _, ch := range loading[1:] {
		fill(ch, 1)
	}
	for _, ch := range loading {
		ch.Release()
	}
}

// TestBufferNotReusedWhileReferenced: a chunk evicted while a reply holds
// it keeps its bytes until the reply releases it.
func TestBufferNotReusedWhileReferenced(t *testing.T) {
	c := newCache(t, 8)
	ch, _, _ := c.Claim(context.Background(), key(0), Demand, true)
	fill(ch, 0xAA)
	held := ch.Data()
	ch.Served(0, cs) // leaves the window for ristretto, which may drop it
	// Churn many chunks through the cache so buffers get recycled.
	for i := int64(1); i < 200; i++ {
		o, isFiller, err := c.Claim(context.Background(), key(i), Demand, true)
		if err != nil {
			t.Fatal(err)
		}
		if isFiller {
			fill(o, 0x55)
		}
		o.Served(0, cs)
		o.Release()
	}
	for i, b := range held {
		if b != 0xAA {
			t.Fatalf("held buffer changed at %d: %#x", i, b)
		}
	}
	ch.Release()
	if a := c.Allocated(); a > c.Budget() {
		t.Errorf("allocated %d bytes, budget %d", a, c.Budget())
	}
}

func TestServedPagesAndShortChunks(t *testing.T) {
	c := newCache(t, 8)
	ch, _, _ := c.Claim(context.Background(), key(0), Readahead, true)
	ch.Fill(PageSize+10, nil) // a short last chunk: 2 pages
	ch.Served(0, 100)         // a partial page does not count
	if ch.ServedPages() != 0 {
		t.Errorf("served pages %d after a partial page", ch.ServedPages())
	}
	ch.Served(0, PageSize)
	ch.Served(PageSize, PageSize+10) // up to the end counts
	if c.WindowBytes() != 0 {
		t.Errorf("a fully served chunk is still in the window (%d bytes)", c.WindowBytes())
	}
	ch.Release()
}

func TestWaitCanceled(t *testing.T) {
	c := newCache(t, 8)
	ch, _, _ := c.Claim(context.Background(), key(0), Demand, true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ch.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("wait: %v", err)
	}
	// The fill still completes for everyone else.
	fill(ch, 3)
	if err := ch.Wait(context.Background()); err != nil {
		t.Error(err)
	}
	ch.Release()
}

// After Close (a lazily unmounted file system may still be serving), a
// chunk can still be claimed, filled, read and served: it is dropped
// instead of handed to the closed ristretto, and nothing panics.
func TestUseAfterClose(t *testing.T) {
	c := newCache(t, 16)
	c.Close()
	ch, doFill, err := c.Claim(context.Background(), key(0), Demand, false)
	if err != nil || !doFill {
		t.Fatalf("claim after Close: fill %v, %v", doFill, err)
	}
	fill(ch, 7)
	if got := c.Get(key(0)); got == nil || got.Buffer()[0] != 7 {
		t.Fatalf("the window's chunk after Close: %v", got)
	} else {
		got.Release()
	}
	ch.Served(0, cs)
	ch.Release()
	if c.Get(key(0)) != nil {
		t.Error("a served chunk is still found after Close")
	}
	if d := c.Stats.Dropped.Load(); d != 1 {
		t.Errorf("Dropped = %d, want 1", d)
	}
	c.Close() // twice is fine
}
