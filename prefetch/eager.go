package prefetch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/modelfs/modelfs/cache"
	"github.com/modelfs/modelfs/internal/safetensors"
)

// Mode says which files a mount pulls eagerly.
type Mode int

const (
	// Safetensors pulls the .safetensors files (the default).
	Safetensors Mode = iota
	// All pulls every file.
	All
	// None pulls nothing ahead of readers; readahead still runs.
	None
)

// ParseMode reads --prefetch.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "safetensors":
		return Safetensors, nil
	case "all":
		return All, nil
	case "none":
		return None, nil
	}
	return 0, fmt.Errorf("prefetch mode %q: want safetensors, all or none", s)
}

func (m Mode) String() string {
	return [...]string{"safetensors", "all", "none"}[m]
}

// Progress reports how much of an eager pull is in the cache or already
// delivered; fields are updated atomically.
type Progress struct {
	Total   atomic.Int64 // bytes the pull covers
	Done    atomic.Int64 // bytes fetched, found cached or already read
	Planned atomic.Bool  // Total is final
}

// headerProbe is how much of a shard the first header GET asks for: enough
// for the headers of all but the largest checkpoints.
const headerProbe = 1 << 20

// Warm pulls files in the order a loader reads them: first every
// safetensors header (each fetched on its own, to plan the pull), then the
// data of each file in natural name order, the chunks of a safetensors file
// in the order of its tensors' keys. It returns when every chunk has been
// fetched (or found cached or read), with the first GET that failed, or
// when ctx ends.
//
// The pull runs at Eager priority and waits for window room, so it never
// runs further ahead of the readers than the cache allows. A file whose
// header does not parse is pulled front to back as plain bytes.
func (f *Fetcher) Warm(ctx context.Context, files []*File, mode Mode, p *Progress) error {
	var pick []*File
	for _, file := range files {
		if file.Obj.Size > 0 && (mode == All || mode == Safetensors && isSafetensors(file.Name)) {
			pick = append(pick, file)
		}
	}
	if mode == None {
		pick = nil
	}
	sort.SliceStable(pick, func(i, j int) bool { return safetensors.NaturalLess(pick[i].Name, pick[j].Name) })
	for _, file := range pick {
		p.Total.Add(file.Obj.Size)
	}
	p.Planned.Store(true)
	if len(pick) == 0 {
		return nil
	}
	plans := make([][]int64, len(pick))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, file := range pick {
		g.Go(func() error {
			plans[i] = f.plan(gctx, file)
			return nil
		})
	}
	g.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	gone := 0
	t := &tally{progress: p}
	for i, file := range pick {
		err := f.pull(ctx, file, plans[i], cache.Eager, true, t)
		if errors.Is(err, ErrForgotten) {
			gone++
			continue
		}
		if err != nil {
			return err
		}
	}
	// The last GETs are still running: a pull that failed there must say
	// so, or the model would show as downloading for ever.
	if err := t.wait(); err != nil {
		return err
	}
	if gone > 0 {
		return fmt.Errorf("%d of %d files: %w", gone, len(pick), ErrForgotten)
	}
	return nil
}

func isSafetensors(name string) bool { return strings.HasSuffix(name, ".safetensors") }

// plan lists file's chunks in the order a loader will read them.
func (f *Fetcher) plan(ctx context.Context, file *File) []int64 {
	n := f.lastChunk(file) + 1
	seen := make([]bool, n)
	order := make([]int64, 0, n)
	add := func(from, to int64) { // byte range [from, to)
		cs := f.cache.ChunkSize()
		for c := from / cs; c*cs < to && c < n; c++ {
			if !seen[c] {
				seen[c] = true
				order = append(order, c)
			}
		}
	}
	if isSafetensors(file.Name) {
		h, err := f.header(ctx, file)
		if err != nil {
			slog.Debug("prefetching as plain bytes", "file", file.Name, "err", err)
		} else {
			add(0, h.DataStart)
			for _, t := range h.Tensors {
				add(t.Begin, t.End)
			}
		}
	}
	add(0, file.Obj.Size) // whatever no tensor covers, front to back
	return order
}

// header fetches and parses a safetensors header outside the cache: it is
// tiny next to the shard, and planning must not hold window room.
func (f *Fetcher) header(ctx context.Context, file *File) (*safetensors.Header, error) {
	size := file.Obj.Size
	buf := make([]byte, min(size, headerProbe))
	if err := f.readGated(ctx, cache.Eager, file, buf, 0); err != nil {
		return nil, err
	}
	n, err := safetensors.HeaderLen(buf, size)
	if err != nil {
		return nil, err
	}
	if 8+n > int64(len(buf)) {
		more := make([]byte, 8+n)
		copy(more, buf)
		if err := f.readGated(ctx, cache.Eager, file, more[len(buf):], int64(len(buf))); err != nil {
			return nil, err
		}
		buf = more
	}
	return safetensors.Parse(buf[8:8+n], size)
}

// pullEager pulls the planned chunks of file, waiting for window room.
// tally follows one Warm: it counts the bytes of the chunks that arrived
// (or were already there) into the Progress, keeps the first GET that
// failed, and lets Warm wait for its GETs. A nil tally does nothing.
type tally struct {
	progress *Progress
	gets     sync.WaitGroup
	mu       sync.Mutex
	err      error
}

func (t *tally) arrived(n int) {
	if t != nil {
		t.progress.Done.Add(int64(n))
	}
}

func (t *tally) failed(err error) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.mu.Unlock()
}

func (t *tally) started() {
	if t != nil {
		t.gets.Add(1)
	}
}

func (t *tally) ended() {
	if t != nil {
		t.gets.Done()
	}
}

// wait waits for every GET started and returns the first failure.
func (t *tally) wait() error {
	t.gets.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}
