package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// Fill writes into p the synthetic bytes at absolute offsets [off,
// off+len(p)) of a file generated with seed. Each aligned 8-byte word is a
// SplitMix64 hash of (seed, word index), so any range can be produced or
// checked on its own.
func Fill(seed uint64, off int64, p []byte) {
	for len(p) > 0 {
		w := uint64(off) / 8
		skip := int(uint64(off) % 8)
		if skip == 0 && len(p) >= 8 {
			binary.LittleEndian.PutUint64(p, word(seed, w))
			p, off = p[8:], off+8
			continue
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], word(seed, w))
		n := copy(p, b[skip:])
		p, off = p[n:], off+int64(n)
	}
}

// Mismatch returns the absolute offset of the first byte of p that differs
// from Fill(seed, off, ·), or -1 when all match.
func Mismatch(seed uint64, off int64, p []byte) int64 {
	for len(p) > 0 {
		if off%8 == 0 && len(p) >= 8 {
			w := uint64(off) / 8
			n := len(p) &^ 7
			for i := 0; i < n; i, w = i+8, w+1 {
				if x := binary.LittleEndian.Uint64(p[i:]) ^ word(seed, w); x != 0 {
					return off + int64(i) + int64(bits.TrailingZeros64(x)/8)
				}
			}
			p, off = p[n:], off+int64(n)
			continue
		}
		var b [1]byte
		Fill(seed, off, b[:])
		if p[0] != b[0] {
			return off
		}
		p, off = p[1:], off+1
	}
	return -1
}

func word(seed, i uint64) uint64 {
	z := seed + (i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// SeedKey is the __metadata__ key that records a generated file's seed.
const SeedKey = "modelfs_seed"

// Seed returns the seed a generated file recorded in its header.
func (h *Header) Seed() (uint64, bool) {
	s, ok := h.Metadata[SeedKey]
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// Spec describes a synthetic model.
type Spec struct {
	Bytes  int64  // total tensor bytes over all shards (approximate, ≥ 1 MiB)
	Shards int    // number of .safetensors files
	Seed   uint64 // base seed; shard i uses Seed+i
	// Mixed gives every weight an F32 scale tensor beside F8 data, so a
	// key-order load reads two interleaved forward streams per file.
	Mixed bool
}

// tensor sizes cycled through when filling a shard: large weights, mid-size
// ones and odd sizes that straddle chunk and page boundaries.
var tensorSizes = []int64{48 << 20, 7<<20 + 4098, 16 << 20, 1<<20 + 10, 24 << 20, 262146, 6 << 20, 130}

// Generate writes a model described by spec into dir: the shards named like
// Hugging Face's (model-00001-of-00002.safetensors), their index, and small
// config and tokenizer files. It returns the shard paths.
func Generate(dir string, spec Spec) ([]string, error) {
	if spec.Shards < 1 {
		return nil, fmt.Errorf("shard count %d must be at least 1", spec.Shards)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	per := max(spec.Bytes/int64(spec.Shards), 1<<20)
	weightMap := map[string]string{}
	var paths []string
	var total int64
	layer := 0
	for s := 0; s < spec.Shards; s++ {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, spec.Shards)
		var ts []Tensor
		var size int64
		for k := 0; size < per; k++ {
			n := min(tensorSizes[(layer+k)%len(tensorSizes)], per-size)
			n = max(n&^1, 2) // whole BF16 elements
			base := fmt.Sprintf("model.layers.%d.w%d", layer, k)
			if spec.Mixed {
				ts = append(ts, Tensor{Name: base + ".weight", DType: "F8_E4M3", Shape: []int64{n}})
				ts = append(ts, Tensor{Name: base + ".weight_scale", DType: "F32", Shape: []int64{1 + n%7}})
				size += n + 4*(1+n%7)
			} else {
				ts = append(ts, Tensor{Name: base + ".weight", DType: "BF16", Shape: []int64{n / 2}})
				size += n
			}
			if k%3 == 2 {
				layer++
			}
		}
		layer++
		p := filepath.Join(dir, name)
		if err := writeShard(p, ts, spec.Seed+uint64(s)); err != nil {
			return nil, err
		}
		for _, t := range ts {
			weightMap[t.Name] = name
		}
		paths = append(paths, p)
		total += size
	}
	index := map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}
	files := map[string]any{
		"model.safetensors.index.json": index,
		"config.json": map[string]any{"architectures": []string{"SyntheticForCausalLM"},
			"model_type": "synthetic", "num_hidden_layers": layer, "torch_dtype": "bfloat16"},
		"generation_config.json": map[string]any{"do_sample": false, "max_new_tokens": 16},
		"tokenizer_config.json":  map[string]any{"model_max_length": 4096},
	}
	vocab := map[string]int{}
	for i := 0; i < 5000; i++ {
		vocab["tok"+strconv.Itoa(i)] = i
	}
	files["tokenizer.json"] = map[string]any{"version": "1.0", "model": map[string]any{"vocab": vocab}}
	for name, v := range files {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// writeShard lays tensors out the way the safetensors library does (larger
// dtypes first, then by name) and fills their bytes from seed.
func writeShard(path string, ts []Tensor, seed uint64) error {
	order := append([]Tensor(nil), ts...)
	sort.SliceStable(order, func(i, j int) bool {
		ai, aj := DTypeSize(order[i].DType), DTypeSize(order[j].DType)
		if ai != aj {
			return ai > aj
		}
		return order[i].Name < order[j].Name
	})
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt", SeedKey: strconv.FormatUint(seed, 10)}}
	var off int64
	for i := range order {
		n := DTypeSize(order[i].DType)
		for _, d := range order[i].Shape {
			n *= d
		}
		hdr[order[i].Name] = rawTensor{DType: order[i].DType, Shape: order[i].Shape, DataOffsets: [2]int64{off, off + n}}
		off += n
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	var lenb [8]byte
	binary.LittleEndian.PutUint64(lenb[:], uint64(len(js)))
	w.Write(lenb[:])
	w.Write(js)
	start := int64(8 + len(js))
	buf := make([]byte, 1<<20)
	for pos := start; pos < start+off; {
		n := min(int64(len(buf)), start+off-pos)
		Fill(seed, pos, buf[:n])
		if _, err := w.Write(buf[:n]); err != nil {
			f.Close()
			return err
		}
		pos += n
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
