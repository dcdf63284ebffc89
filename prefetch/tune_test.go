package prefetch

import "testing"

// run feeds the search a throughput curve (throughput by limit) and
// returns the limit it settles on and how many samples that took.
func run(c *climb, curve func(limit int) float64) (int, int) {
	for i := 1; i <= 100; i++ {
		c.observe(curve(c.limit), true)
		if c.done {
			return c.limit, i
		}
	}
	return c.limit, -1
}

func TestClimbStopsWhereThroughputStopsRising(t *testing.T) {
	// Rises to 16 GETs, flat beyond: the search settles on 16.
	curve := func(n int) float64 { return float64(min(n, 16)) * 100 }
	limit, samples := run(newClimb(64), curve)
	if limit != 16 || samples < 0 {
		t.Errorf("settled on %d after %d samples, want 16", limit, samples)
	}
	// Throughput falls past 8 (a saturated CPU): back to 8.
	curve = func(n int) float64 {
		if n <= 8 {
			return float64(n) * 100
		}
		return 700
	}
	if limit, _ := run(newClimb(64), curve); limit != 8 {
		t.Errorf("settled on %d, want 8", limit)
	}
	// Keeps rising: stops at the profile's maximum.
	if limit, _ := run(newClimb(32), func(n int) float64 { return float64(n) }); limit != 32 {
		t.Errorf("settled on %d, want the maximum 32", limit)
	}
	// A maximum below the start is used outright.
	if c := newClimb(2); c.limit != 2 {
		t.Errorf("start %d with max 2", c.limit)
	}
}

func TestClimbIgnoresIdleAndRampUpSamples(t *testing.T) {
	c := newClimb(64)
	for i := 0; i < 10; i++ {
		if got := c.observe(1, false); got != 4 || c.done {
			t.Fatalf("an unsaturated sample moved the limit to %d", got)
		}
	}
	c.observe(5, true) // ramp-up at 4: skipped
	if c.limit != 4 {
		t.Fatalf("ramp-up sample moved the limit to %d", c.limit)
	}
	c.observe(400, true) // 4 GETs: 400
	if c.limit != 8 {
		t.Fatalf("limit %d after the first real sample, want 8", c.limit)
	}
	c.observe(1, true)   // ramp-up at 8: skipped even though it is low
	c.observe(420, true) // 8 GETs: +5%, not enough
	if !c.done || c.limit != 4 {
		t.Errorf("limit %d done %v, want back to 4 and done", c.limit, c.done)
	}
}
