package prefetch

// streams recognizes forward streams of chunk accesses inside one file and
// says how far ahead of each to read.
//
// A stream is a run of chunks [start, next) read in increasing order. An
// access matches a stream when it lands within slack chunks of the run:
// go-fuse hands reads over out of order, and a loader that copies tensors
// in key order from a mixed-dtype file reads two or more interleaved
// forward streams, each of which keeps its own entry here. The readahead
// window of a stream equals the length of its run so far (so it doubles as
// the stream proves itself) up to max chunks; an access that matches no
// stream starts a new one in the least recently used slot and reads
// nothing ahead.
type streams struct {
	s    [maxStreams]stream
	tick uint64
}

const (
	maxStreams = 8
	// slack is how far (in chunks) an access may fall outside a stream's
	// run and still belong to it.
	slack = 2
)

type stream struct {
	start, next int64 // the run: chunks [start, next)
	ahead       int64 // readahead has been issued for chunks below ahead
	used        uint64
}

// access records that chunk c was read and returns the chunks [from, to)
// to read ahead now, possibly none. max bounds the window in chunks and
// last is the file's last chunk.
func (d *streams) access(c, max, last int64) (from, to int64) {
	d.tick++
	var s *stream
	for i := range d.s {
		t := &d.s[i]
		if t.used != 0 && c >= t.start-slack && c <= t.next+slack {
			s = t
			break
		}
	}
	if s == nil {
		s = &d.s[0]
		for i := range d.s {
			if d.s[i].used < s.used {
				s = &d.s[i]
			}
		}
		*s = stream{start: c, next: c + 1, ahead: c + 1, used: d.tick}
		return 0, 0
	}
	s.used = d.tick
	if c < s.start {
		s.start = c
	}
	if c >= s.next {
		s.next = c + 1
	}
	window := min(s.next-s.start-1, max)
	if window <= 0 {
		return 0, 0
	}
	from = s.ahead
	if from < s.next {
		from = s.next
	}
	to = min(s.next+window, last+1)
	if to <= from {
		return 0, 0
	}
	s.ahead = to
	return from, to
}
