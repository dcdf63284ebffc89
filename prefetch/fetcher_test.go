package prefetch

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/cache"
	"github.com/modelfs/modelfs/internal/safetensors"
)

// memStore serves objects from memory and records every GET. With hold
// set, each GET blocks until a value arrives on release: tests use it to
// see which of several queued GETs the gate lets through first.
type memStore struct {
	mu      sync.Mutex
	objs    map[string][]byte
	gets    []get
	fetched int64
	hold    bool
	release chan struct{}
	started chan get
	fail    error // every GET fails with it, when set
}

type get struct {
	key    string
	off, n int64
}

func newMemStore() *memStore {
	return &memStore{objs: map[string][]byte{}, release: make(chan struct{}), started: make(chan get, 1000)}
}

func (s *memStore) List(ctx context.Context, prefix string, fn func(backend.Object) error) error {
	return errors.New("not used")
}

func (s *memStore) Stat(ctx context.Context, key string) (backend.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objs[key]
	if !ok {
		return backend.Object{}, backend.WithKind(backend.ErrNotExist, errors.New(key))
	}
	return backend.Object{Key: key, Size: int64(len(b)), ETag: "e"}, nil
}

func (s *memStore) Open(ctx context.Context, key, etag string, off, n int64) (io.ReadCloser, error) {
	s.mu.Lock()
	b := s.objs[key]
	g := get{key, off, n}
	s.gets = append(s.gets, g)
	s.fetched += n
	hold, fail := s.hold, s.fail
	s.mu.Unlock()
	s.started <- g
	if fail != nil {
		return nil, fail
	}
	if hold {
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return io.NopCloser(bytes.NewReader(b[off : off+n])), nil
}

func (s *memStore) String() string { return "mem" }
func (s *memStore) Close() error   { return nil }

func (s *memStore) put(key string, b []byte) backend.Object {
	s.mu.Lock()
	s.objs[key] = b
	s.mu.Unlock()
	return backend.Object{Key: key, Size: int64(len(b)), ETag: "e"}
}

func (s *memStore) fetchedBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetched
}

const tcs = 64 << 10 // chunk size in these tests

func newFetcher(t *testing.T, st backend.Store, budgetChunks int64, cfg Config) (*Fetcher, *cache.Cache) {
	t.Helper()
	c, err := cache.New(cache.Config{Budget: budgetChunks * tcs, ChunkSize: tcs})
	if err != nil {
		t.Fatal(err)
	}
	r := backend.NewReader(st, backend.DefaultPolicy)
	f := New(c, r.Stats, cfg)
	readers[f] = r
	t.Cleanup(func() { f.Close(); c.Close(); delete(readers, f) })
	return f, c
}

// readers is the reader each test fetcher's files use.
var readers = map[*Fetcher]*backend.Reader{}

func fileOf(f *Fetcher, name string, obj backend.Object) *File { return f.File(name, obj, readers[f]) }

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed ^ byte(i>>12)
	}
	return b
}

// readAll reads file sequentially in reads of n bytes as the kernel would,
// delivering each reply, and checks the bytes.
func readAll(t *testing.T, f *Fetcher, file *File, want []byte, n int) {
	t.Helper()
	for off := 0; off < len(want); off += n {
		spans, err := f.Read(context.Background(), file, int64(off), n)
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		var got []byte
		for _, s := range spans {
			got = append(got, s.Bytes()...)
		}
		f.Delivered(file, spans)
		end := min(off+n, len(want))
		if !bytes.Equal(got, want[off:end]) {
			t.Fatalf("read at %d: wrong bytes", off)
		}
	}
}

func TestSequentialReadFetchesEachByteOnce(t *testing.T) {
	st := newMemStore()
	data := pattern(100*tcs+17, 1)
	obj := st.put("w", data)
	f, _ := newFetcher(t, st, 32, Config{PartSize: 4 * tcs, Concurrency: 4})
	file := fileOf(f, "w", obj)
	readAll(t, f, file, data, 16<<10)
	f.Close()
	if got := st.fetchedBytes(); got != int64(len(data)) {
		t.Errorf("fetched %d bytes for a %d-byte object", got, len(data))
	}
	var big int
	for _, g := range st.gets {
		if g.n > tcs {
			big++
		}
	}
	if f.Stats.ReadaheadFetches.Load() == 0 || big == 0 {
		t.Errorf("no part-sized readahead GETs (readahead %d, GETs over a chunk %d)", f.Stats.ReadaheadFetches.Load(), big)
	}
}

func TestGatePriorityAndReserve(t *testing.T) {
	g := newGate(1)
	ctx := context.Background()
	first := newTicket(cache.Eager)
	if err := g.acquire(ctx, first); err != nil {
		t.Fatal(err)
	}
	var order []cache.Class
	var mu sync.Mutex
	var wg sync.WaitGroup
	tickets := []*ticket{newTicket(cache.Eager), newTicket(cache.Readahead), newTicket(cache.Eager)}
	for _, tk := range tickets {
		wg.Add(1)
		go func(tk *ticket) {
			defer wg.Done()
			if err := g.acquire(ctx, tk); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, tk.class)
			mu.Unlock()
			g.release()
		}(tk)
	}
	// Wait until all three are queued.
	waitQueued(g, 3, cache.Readahead, cache.Eager)
	// A demand fetch does not queue behind them: it takes the reserve.
	d := newTicket(cache.Demand)
	if err := g.acquire(ctx, d); err != nil {
		t.Fatal(err)
	}
	g.release()
	// Promote the last eager ticket: it must go before the first one.
	g.promote(tickets[2], cache.Readahead)
	g.release() // the slot held by first
	wg.Wait()
	want := []cache.Class{cache.Readahead, cache.Readahead, cache.Eager}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("grant order %v, want %v", order, want)
	}
}

// TestDemandGoesFirst: with the only GET slot taken, a reader's miss is
// fetched before eager pulls queued earlier.
func TestDemandGoesFirst(t *testing.T) {
	st := newMemStore()
	st.hold = true
	a := st.put("a", pattern(20*tcs, 2)) // fits what the pull may hold ahead of readers
	b := st.put("b", pattern(8*tcs, 3))
	f, _ := newFetcher(t, st, 64, Config{PartSize: tcs, Concurrency: 1})
	f.gate.setLimit(1)
	f.gate.reserve = 0 // no Demand reserve: the order is all that decides
	fa, fb := fileOf(f, "a", a), fileOf(f, "b", b)
	warmDone := make(chan error, 1)
	go func() { warmDone <- f.Warm(context.Background(), []*File{fa}, All, new(Progress)) }()
	<-st.started                       // the first eager GET holds the slot
	waitQueued(f.gate, 3, cache.Eager) // until more eager GETs queue behind it
	readDone := make(chan error, 1)
	go func() {
		spans, err := f.Read(context.Background(), fb, 0, 100)
		if err == nil {
			f.Delivered(fb, spans)
		}
		readDone <- err
	}()
	waitQueued(f.gate, 1, cache.Demand)
	st.release <- struct{}{} // finish the first eager GET
	if g := <-st.started; g.key != "b" {
		t.Errorf("after the running GET, the gate started %+v, want the demand read of b", g)
	}
	close(st.release)
	if err := <-readDone; err != nil {
		t.Fatal(err)
	}
	if err := <-warmDone; err != nil {
		t.Fatal(err)
	}
}

// TestEagerStaysWithinTheWindow: with no reader, an eager pull of a model
// ten times the cache fetches one window and waits; as a reader consumes,
// it streams the rest through without fetching anything twice.
func TestEagerStaysWithinTheWindow(t *testing.T) {
	st := newMemStore()
	var files []*File
	var datas [][]byte
	f, c := newFetcher(t, st, 32, Config{PartSize: 4 * tcs, Concurrency: 4})
	var total int64
	for i := 0; i < 3; i++ {
		d := pattern(80*tcs+int(i)*1000, byte(i))
		datas = append(datas, d)
		files = append(files, fileOf(f, fmt.Sprintf("m-%d.bin", i), st.put(fmt.Sprintf("m-%d.bin", i), d)))
		total += int64(len(d))
	}
	p := new(Progress)
	done := make(chan error, 1)
	go func() { done <- f.Warm(context.Background(), files, All, p) }()
	// Until the pull is blocked on window room and its GETs are done.
	for c.Stats.Waits.Load() == 0 || p.Done.Load() < c.AheadMax() {
		runtime.Gosched()
	}
	if got := st.fetchedBytes(); got > c.AheadMax() {
		t.Fatalf("eager pull fetched %d bytes with no reader; it may fill %d", got, c.AheadMax())
	}
	for i, file := range files {
		readAll(t, f, file, datas[i], 128<<10)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := st.fetchedBytes(); float64(got) > 1.05*float64(total) {
		t.Errorf("fetched %d bytes for %d bytes of model", got, total)
	}
	if p.Done.Load() != total || p.Total.Load() != total {
		t.Errorf("progress %d/%d, want %d", p.Done.Load(), p.Total.Load(), total)
	}
	if a := c.Allocated(); a > c.Budget() {
		t.Errorf("allocated %d bytes over the %d budget", a, c.Budget())
	}
}

func TestPlanFollowsTensorKeyOrder(t *testing.T) {
	// Key order a, b, c is not offset order: b's data comes first.
	hdr := fmt.Sprintf(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F8_E4M3","shape":[%d],"data_offsets":[%d,%d]},`+
		`"b":{"dtype":"F32","shape":[%d],"data_offsets":[%d,%d]},"c":{"dtype":"F8_E4M3","shape":[%d],"data_offsets":[%d,%d]}}`,
		tcs, 5*tcs, 6*tcs, tcs/4, tcs, 2*tcs, tcs, 8*tcs, 9*tcs)
	data := make([]byte, 8+len(hdr)+10*tcs)
	binary.LittleEndian.PutUint64(data, uint64(len(hdr)))
	copy(data[8:], hdr)
	st := newMemStore()
	f, _ := newFetcher(t, st, 32, Config{PartSize: tcs, Concurrency: 2})
	file := fileOf(f, "x.safetensors", st.put("x.safetensors", data))
	plan := f.plan(context.Background(), file)
	// Header, then a (chunks 5-6: the data region starts 8+len(hdr) bytes
	// in), b (1-2), c (8-9), then what no tensor covers, front to back.
	want := []int64{0, 5, 6, 1, 2, 8, 9, 3, 4, 7, 10}
	if fmt.Sprint(plan) != fmt.Sprint(want) {
		t.Errorf("plan %v, want %v", plan, want)
	}
}

func TestPlanOfGeneratedMixedModel(t *testing.T) {
	dir := t.TempDir()
	paths, err := safetensors.Generate(dir, safetensors.Spec{Bytes: 6 << 20, Shards: 1, Seed: 3, Mixed: true})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	st := newMemStore()
	f, _ := newFetcher(t, st, 32, Config{PartSize: tcs, Concurrency: 2})
	name := filepath.Base(paths[0])
	plan := f.plan(context.Background(), fileOf(f, name, st.put(name, data)))
	seen := map[int64]bool{}
	for _, c := range plan {
		if seen[c] {
			t.Fatalf("chunk %d planned twice", c)
		}
		seen[c] = true
	}
	if int64(len(plan)) != (int64(len(data))+tcs-1)/tcs {
		t.Errorf("plan covers %d chunks of %d", len(plan), (len(data)+tcs-1)/tcs)
	}
}

func TestPlanOfMalformedHeaderIsSequential(t *testing.T) {
	st := newMemStore()
	f, _ := newFetcher(t, st, 32, Config{PartSize: tcs, Concurrency: 2})
	for name, data := range map[string][]byte{
		"short.safetensors":   {1, 2, 3},
		"huge.safetensors":    append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, pattern(3*tcs, 1)...),
		"garbage.safetensors": append([]byte{16, 0, 0, 0, 0, 0, 0, 0}, append([]byte("{not json at all"), pattern(3*tcs, 2)...)...),
	} {
		file := fileOf(f, name, st.put(name, data))
		plan := f.plan(context.Background(), file)
		want := chunkRange(0, (int64(len(data))+tcs-1)/tcs)
		if fmt.Sprint(plan) != fmt.Sprint(want) {
			t.Errorf("%s: plan %v, want %v", name, plan, want)
		}
	}
}

// A warm whose GETs fail says so once they have ended, with the store's
// error, and counts none of the bytes done: the model then shows as
// failed, not as downloading for ever.
func TestWarmReportsFailedGets(t *testing.T) {
	st := newMemStore()
	st.fail = backend.WithKind(backend.ErrPrecondition, errors.New("412"))
	f, _ := newFetcher(t, st, 64, Config{PartSize: 4 * tcs, Concurrency: 4})
	a := fileOf(f, "a.bin", st.put("a.bin", pattern(8*tcs, 1)))
	p := new(Progress)
	err := f.Warm(context.Background(), []*File{a}, All, p)
	if !errors.Is(err, backend.ErrPrecondition) {
		t.Fatalf("warm over failing GETs: %v, want the store's precondition error", err)
	}
	if p.Done.Load() != 0 || p.Total.Load() != a.Obj.Size {
		t.Errorf("progress %d of %d, want 0 of %d", p.Done.Load(), p.Total.Load(), a.Obj.Size)
	}
}

// A warm whose context has ended, or of a file that Forget was called on,
// claims and fetches nothing more; the warm reports the forgotten files.
func TestWarmStopsForCancelAndForget(t *testing.T) {
	st := newMemStore()
	f, c := newFetcher(t, st, 64, Config{PartSize: 4 * tcs, Concurrency: 4})
	a := fileOf(f, "a.bin", st.put("a.bin", pattern(16*tcs, 1)))
	b := fileOf(f, "b.bin", st.put("b.bin", pattern(16*tcs, 2)))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Warm(ctx, []*File{a, b}, All, new(Progress)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled warm: %v", err)
	}
	f.Forget(a)
	p := new(Progress)
	err := f.Warm(context.Background(), []*File{a, b}, All, p)
	if !errors.Is(err, ErrForgotten) {
		t.Fatalf("warm with a forgotten file: %v, want ErrForgotten", err)
	}
	f.Close()
	if got, want := st.fetchedBytes(), b.Obj.Size; got != want {
		t.Errorf("fetched %d bytes, want only b's %d", got, want)
	}
	if p.Done.Load() != b.Obj.Size {
		t.Errorf("progress done %d, want b's %d", p.Done.Load(), b.Obj.Size)
	}
	if w := c.WindowBytes(); w > b.Obj.Size {
		t.Errorf("window holds %d bytes, more than b's %d", w, b.Obj.Size)
	}
}

// TestPromoteBeforeAcquire: a ticket promoted before its GET is queued
// (a reader arrived between the claim and the fetch) queues at the class
// it was promoted to.
func TestPromoteBeforeAcquire(t *testing.T) {
	g := newGate(1)
	ctx := context.Background()
	if err := g.acquire(ctx, newTicket(cache.Eager)); err != nil {
		t.Fatal(err)
	}
	early := newTicket(cache.Eager)
	go g.acquire(ctx, early)
	waitQueued(g, 1, cache.Eager) // until early is queued
	late := newTicket(cache.Eager)
	g.promote(late, cache.Readahead)
	go g.acquire(ctx, late)
	waitQueued(g, 2, cache.Readahead, cache.Eager) // until late is queued too
	g.release()
	select {
	case <-late.granted:
	case <-early.granted:
		t.Fatal("the eager ticket queued first went before the one promoted before it queued")
	}
}

// TestRereadFetchesOnlyTheBytesAsked: once every byte of a chunk has
// reached readers and the chunk has left the cache, a reader asking again
// (the kernel dropped those pages) gets just the bytes it asks for, fetched
// on their own, not the whole chunk again.
func TestRereadFetchesOnlyTheBytesAsked(t *testing.T) {
	st := newMemStore()
	f, c := newFetcher(t, st, 16, Config{PartSize: 4 * tcs, Concurrency: 4})
	data := pattern(80*tcs, 9)
	file := fileOf(f, "w.bin", st.put("w.bin", data))
	readAll(t, f, file, data, 32<<10)
	// Chunk 3 was served whole long ago: 16 chunks of cache cannot hold it.
	if ch := c.Get(f.key(file, 3)); ch != nil {
		ch.Release()
		t.Fatal("chunk 3 is still cached; the cache holds more than this test assumes")
	}
	before, rereads := st.fetchedBytes(), f.Stats.Rereads.Load()
	const off, n = 3*tcs + 1000, 8192 // inside chunk 3
	spans, err := f.Read(context.Background(), file, off, n)
	if err != nil {
		t.Fatal(err)
	}
	var got []byte
	for _, s := range spans {
		got = append(got, s.Bytes()...)
	}
	f.Delivered(file, spans)
	if !bytes.Equal(got, data[off:off+n]) {
		t.Fatal("reread returned the wrong bytes")
	}
	if d := st.fetchedBytes() - before; d != n {
		t.Errorf("reread of %d bytes fetched %d", n, d)
	}
	if f.Stats.Rereads.Load() != rereads+1 {
		t.Errorf("Rereads %d, want %d", f.Stats.Rereads.Load(), rereads+1)
	}
}

// waitQueued waits until at least n tickets of the classes wait in g.
func waitQueued(g *gate, n int, classes ...cache.Class) {
	for {
		g.mu.Lock()
		q := 0
		for _, c := range classes {
			q += len(g.queue[c])
		}
		g.mu.Unlock()
		if q >= n {
			return
		}
		runtime.Gosched()
	}
}

// Files read through different readers (models attached with their own
// credentials) never share cached chunks: their chunks have other keys,
// so the second reader fetches its bytes itself. The same reader keys a
// file the same way every time (a re-list finds what it cached).
func TestCachedChunksAreScopedByReader(t *testing.T) {
	st := newMemStore()
	f, _ := newFetcher(t, st, 64, Config{PartSize: tcs, Concurrency: 4})
	obj := st.put("a.bin", pattern(tcs, 1))
	other := backend.NewReader(st, backend.DefaultPolicy)
	a, again, b := fileOf(f, "a.bin", obj), fileOf(f, "a.bin", obj), f.File("a.bin", obj, other)
	if f.key(a, 0) != f.key(again, 0) {
		t.Errorf("one reader keys the same chunk two ways: %v, %v", f.key(a, 0), f.key(again, 0))
	}
	if f.key(a, 0) == f.key(b, 0) {
		t.Errorf("two readers share the key %v", f.key(a, 0))
	}
	spans, err := f.Read(context.Background(), a, 0, tcs)
	if err != nil {
		t.Fatal(err)
	}
	Release(spans)
	if spans, err = f.Read(context.Background(), b, 0, tcs); err != nil {
		t.Fatal(err)
	}
	Release(spans)
	if got := st.fetchedBytes(); got != 2*tcs {
		t.Errorf("two readers fetched %d bytes, want %d each", got, tcs)
	}
}

// GETs outside the cache (a safetensors header before a pull, a reread)
// wait for a slot of the gate like every other GET.
func TestHeaderReadsWaitForTheGate(t *testing.T) {
	st := newMemStore()
	st.hold = true
	f, _ := newFetcher(t, st, 64, Config{PartSize: tcs, Concurrency: 1})
	a := fileOf(f, "a.bin", st.put("a.bin", pattern(4*tcs, 1)))
	b := fileOf(f, "b.safetensors", st.put("b.safetensors", pattern(4*tcs, 2)))
	ctx := context.Background()
	if err := f.pull(ctx, a, []int64{0}, cache.Eager, false, nil); err != nil {
		t.Fatal(err)
	}
	<-st.started // a's GET holds the only slot
	done := make(chan struct{})
	go func() { f.header(ctx, b); close(done) }()
	for queued := 0; queued == 0; runtime.Gosched() {
		select {
		case g := <-st.started:
			t.Fatalf("GET of %s started while the gate was full", g.key)
		default:
		}
		f.gate.mu.Lock()
		queued = len(f.gate.queue[cache.Eager])
		f.gate.mu.Unlock()
	}
	st.release <- struct{}{} // a's GET ends and frees the slot
	if g := <-st.started; g.key != "b.safetensors" {
		t.Errorf("next GET %v, want the header of b.safetensors", g)
	}
	st.release <- struct{}{}
	<-done
}
