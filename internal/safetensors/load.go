package safetensors

import (
	"fmt"
	"os"
	"syscall"
)

// LoadResult is what Load did to one file.
type LoadResult struct {
	Tensors int
	Bytes   int64 // tensor bytes copied
	// Verified is true when every tensor byte matched the file's seed.
	Verified bool
}

// Load reads a safetensors file the way safetensors' safe_open does for
// PyTorch: it maps the whole file, parses the header out of the mapping and
// copies every tensor out in key order. With verify it checks every copied
// byte against Fill and fails naming the first wrong offset; the file must
// then carry a seed.
//
// Load page-faults on the mapping: never call it on a FUSE mount from the
// process serving that mount.
func Load(path string, verify bool) (LoadResult, error) {
	var res LoadResult
	f, err := os.Open(path)
	if err != nil {
		return res, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return res, err
	}
	size := st.Size()
	if size < 8 {
		return res, fmt.Errorf("%s: %d bytes is too short for a safetensors file", path, size)
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return res, fmt.Errorf("mmap %s: %w", path, err)
	}
	defer syscall.Munmap(m)
	n, err := HeaderLen(m[:8], size)
	if err != nil {
		return res, fmt.Errorf("%s: %w", path, err)
	}
	h, err := Parse(m[8:8+n], size)
	if err != nil {
		return res, fmt.Errorf("%s: %w", path, err)
	}
	seed, seeded := h.Seed()
	if verify && !seeded {
		return res, fmt.Errorf("%s: no %s in __metadata__: cannot verify", path, SeedKey)
	}
	var buf []byte
	for _, t := range h.Tensors {
		sz := t.End - t.Begin
		if int64(cap(buf)) < sz {
			buf = make([]byte, sz)
		}
		dst := buf[:sz]
		copy(dst, m[t.Begin:t.End])
		if verify {
			if bad := Mismatch(seed, t.Begin, dst); bad >= 0 {
				return res, fmt.Errorf("%s: tensor %s: wrong byte at file offset %d", path, t.Name, bad)
			}
		}
		res.Tensors++
		res.Bytes += sz
	}
	res.Verified = verify
	return res, nil
}
