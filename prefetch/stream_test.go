package prefetch

import (
	"math/rand/v2"
	"testing"
)

// feed runs accesses through a detector and collects the readahead ranges.
func feed(d *streams, max, last int64, accesses ...int64) [][2]int64 {
	var out [][2]int64
	for _, c := range accesses {
		if from, to := d.access(c, max, last); from < to {
			out = append(out, [2]int64{from, to})
		}
	}
	return out
}

func TestSequentialStreamGrowsItsWindow(t *testing.T) {
	var d streams
	got := feed(&d, 16, 1000, 0, 1, 2, 3, 4, 5, 6, 7)
	want := [][2]int64{{2, 3}, {3, 5}, {5, 7}, {7, 9}, {9, 11}, {11, 13}, {13, 15}}
	if len(got) != len(want) {
		t.Fatalf("ranges %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("ranges %v, want %v", got, want)
		}
	}
	// Never more than max ahead of the stream, and never past the file.
	got = feed(&d, 16, 40, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28)
	for _, r := range got {
		if r[1] > 29+16 || r[1] > 41 {
			t.Errorf("range %v runs too far ahead", r)
		}
	}
}

// A long stream in a large file: the window grows to max chunks ahead of
// the stream and no further.
func TestReadaheadWindowStopsAtMax(t *testing.T) {
	const max = 16
	var d streams
	reached := false
	for c := int64(0); c < 200; c++ {
		from, to := d.access(c, max, 1_000_000)
		if from >= to {
			continue
		}
		if ahead := to - (c + 1); ahead > max {
			t.Fatalf("after chunk %d readahead runs to %d: %d chunks ahead, max %d", c, to, ahead, max)
		} else if ahead == max {
			reached = true
		}
	}
	if !reached {
		t.Errorf("the window never grew to max (%d chunks)", max)
	}
}

func TestRandomAccessReadsNothingAhead(t *testing.T) {
	var d streams
	r := rand.New(rand.NewPCG(1, 2))
	n := 0
	for i := 0; i < 1000; i++ {
		if from, to := d.access(r.Int64N(1_000_000), 64, 1_000_000); from < to {
			n++
		}
	}
	// A random access lands within slack of one of 8 recent streams rarely.
	if n > 5 {
		t.Errorf("random accesses triggered readahead %d times", n)
	}
}

// TestOutOfOrderArrivals: go-fuse delivers reads of one stream slightly
// out of order; the stream must still be recognized and grow.
func TestOutOfOrderArrivals(t *testing.T) {
	var d streams
	order := []int64{1, 0, 3, 2, 4, 6, 5, 7, 9, 8, 10, 11}
	got := feed(&d, 64, 1000, order...)
	if len(got) == 0 {
		t.Fatal("no readahead for a reordered sequential stream")
	}
	if last := got[len(got)-1]; last[1] < 12+8 {
		t.Errorf("window reached only %v after 12 chunks", last)
	}
	// No range is issued twice.
	seen := map[int64]bool{}
	for _, r := range got {
		for c := r[0]; c < r[1]; c++ {
			if seen[c] {
				t.Fatalf("chunk %d read ahead twice: %v", c, got)
			}
			seen[c] = true
		}
	}
}

// TestInterleavedStreams: a mixed-dtype file read in key order alternates
// between regions; each region keeps its own stream.
func TestInterleavedStreams(t *testing.T) {
	var d streams
	var accesses []int64
	for i := int64(0); i < 20; i++ {
		accesses = append(accesses, 1000+i, 5000+i) // two forward streams
	}
	got := feed(&d, 64, 10000, accesses...)
	var a, b bool
	for _, r := range got {
		a = a || (r[0] > 1000 && r[1] <= 1000+20+64)
		b = b || (r[0] > 5000 && r[1] <= 5000+20+64)
	}
	if !a || !b {
		t.Errorf("interleaved streams not both detected: %v", got)
	}
	// Three streams at once, too.
	var d3 streams
	accesses = accesses[:0]
	for i := int64(0); i < 20; i++ {
		accesses = append(accesses, 100+i, 3000+i, 9000+i)
	}
	hit := map[int64]bool{}
	for _, r := range feed(&d3, 64, 20000, accesses...) {
		hit[r[0]/1000] = true
	}
	if !hit[0] || !hit[3] || !hit[9] {
		t.Errorf("three streams: readahead only in regions %v", hit)
	}
}
