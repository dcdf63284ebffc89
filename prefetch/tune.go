package prefetch

import (
	"log/slog"
	"time"
)

// The run-time concurrency search. The profile gives the most GETs that
// could help; the node, the store and the other tenants decide how many
// actually do. Starting low, the gate's limit doubles while each doubling
// raises throughput by at least minGain; the first doubling that does not
// is undone and the search stops. Intervals in which no GET had to queue
// say nothing about the limit and are skipped, as is the first interval
// after each change, while transfers ramp up.
const (
	tuneInterval = 500 * time.Millisecond
	tuneStart    = 4
	minGain      = 0.10
)

type climb struct {
	limit, max int
	best       float64 // throughput at bestLimit
	bestLimit  int
	settle     bool // the next sample is a ramp-up: skip it
	done       bool
}

func newClimb(max int) *climb {
	return &climb{limit: min(tuneStart, max), max: max, settle: true}
}

// observe takes an interval's throughput at the current limit and whether
// the gate was saturated, and returns the limit to use next.
func (c *climb) observe(bytesPerSec float64, saturated bool) int {
	if c.done || !saturated {
		return c.limit
	}
	if c.settle {
		c.settle = false
		return c.limit
	}
	if c.bestLimit != 0 && bytesPerSec < c.best*(1+minGain) {
		c.limit, c.done = c.bestLimit, true
		return c.limit
	}
	c.best, c.bestLimit = bytesPerSec, c.limit
	if c.limit >= c.max {
		c.done = true
		return c.limit
	}
	c.limit = min(2*c.limit, c.max)
	c.settle = true
	return c.limit
}

// tune runs the search on f's gate until f closes or the search ends.
func (f *Fetcher) tune() {
	defer f.wg.Done()
	c := newClimb(f.cfg.Concurrency)
	f.gate.setLimit(c.limit)
	f.Stats.Concurrency.Store(int64(c.limit))
	t := time.NewTicker(tuneInterval)
	defer t.Stop()
	lastBytes := f.fetched.BytesFetched.Load()
	lastQueued := f.gate.queuedTotal()
	last := time.Now()
	for !c.done {
		select {
		case <-f.ctx.Done():
			return
		case now := <-t.C:
			bytes, queued := f.fetched.BytesFetched.Load(), f.gate.queuedTotal()
			rate := float64(bytes-lastBytes) / now.Sub(last).Seconds()
			limit := c.observe(rate, queued > lastQueued)
			lastBytes, lastQueued, last = bytes, queued, now
			if limit != f.gate.getLimit() {
				f.gate.setLimit(limit)
				f.Stats.Concurrency.Store(int64(limit))
			}
		}
	}
	slog.Info("GET concurrency settled", "concurrency", c.limit, "max", c.max, "mib_per_s", int(c.best/(1<<20)))
}
