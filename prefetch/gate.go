package prefetch

import (
	"context"
	"sync"

	"github.com/modelfs/modelfs/cache"
)

// gate bounds the GETs in flight and hands free slots out by priority:
// every waiting Demand fetch before any Readahead, every Readahead before
// any Eager, first come first served within a class. Demand fetches may
// also use a small reserve above the limit, so a reader never queues
// behind a full set of background transfers.
type gate struct {
	mu      sync.Mutex
	limit   int
	reserve int
	inUse   int
	queue   [3][]*ticket
	queued  int64 // acquires that found no free slot, ever
}

// ticket is one fetch's place in the gate. Its class can be raised while it
// waits (a reader arrived for a chunk it will fill).
type ticket struct {
	class   cache.Class
	granted chan struct{}
	started bool // acquire has been called
	queued  bool
}

func newGate(limit int) *gate {
	g := &gate{}
	g.setLimit(limit)
	return g
}

func newTicket(class cache.Class) *ticket {
	return &ticket{class: class, granted: make(chan struct{})}
}

// setLimit changes the number of slots; waiters are admitted at once if
// the limit grew.
func (g *gate) setLimit(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.limit = max(n, 1)
	g.reserve = max(g.limit/4, 2)
	g.admitLocked()
}

func (g *gate) capacityLocked(c cache.Class) int {
	if c == cache.Demand {
		return g.limit + g.reserve
	}
	return g.limit
}

func (g *gate) getLimit() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limit
}

// queuedTotal counts the acquires that had to wait for a slot.
func (g *gate) queuedTotal() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.queued
}

// acquire waits for a slot. On error (ctx done) no slot is held.
func (g *gate) acquire(ctx context.Context, t *ticket) error {
	g.mu.Lock()
	t.started = true
	g.queue[t.class] = append(g.queue[t.class], t)
	t.queued = true
	g.admitLocked()
	if t.queued {
		g.queued++
	}
	g.mu.Unlock()
	select {
	case <-t.granted:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !t.queued { // granted while we gave up: hand the slot back
		g.inUse--
		g.admitLocked()
		return ctx.Err()
	}
	g.removeLocked(t)
	return ctx.Err()
}

// release frees a slot taken by acquire.
func (g *gate) release() {
	g.mu.Lock()
	g.inUse--
	g.admitLocked()
	g.mu.Unlock()
}

// promote raises a waiting ticket to class c.
func (g *gate) promote(t *ticket, c cache.Class) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.class <= c {
		return
	}
	if !t.started { // not queued yet: acquire will queue it at c
		t.class = c
		return
	}
	if !t.queued { // already granted
		return
	}
	g.removeLocked(t)
	t.class = c
	g.queue[c] = append(g.queue[c], t)
	g.admitLocked()
}

func (g *gate) removeLocked(t *ticket) {
	q := g.queue[t.class]
	for i, w := range q {
		if w == t {
			g.queue[t.class] = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	t.queued = false
}

// admitLocked grants slots to waiters, most urgent class first. A class
// waits while a more urgent one is queued, so priorities hold even when
// the Demand reserve is what frees up.
func (g *gate) admitLocked() {
	for c := range g.queue {
		for len(g.queue[c]) > 0 && g.inUse < g.capacityLocked(cache.Class(c)) {
			t := g.queue[c][0]
			g.queue[c] = g.queue[c][1:]
			t.queued = false
			g.inUse++
			close(t.granted)
		}
		if len(g.queue[c]) > 0 {
			return
		}
	}
}
