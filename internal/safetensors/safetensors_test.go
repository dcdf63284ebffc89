package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// ---- Fill and Mismatch ----

func TestFillMatchesLongerFill(t *testing.T) {
	for _, seed := range []uint64{0, 1, 42, math.MaxUint64} {
		for _, base := range []int64{0, 5, 1 << 20, 1<<40 + 3} {
			long := make([]byte, 256)
			Fill(seed, base, long)
			for off := 0; off < 80; off++ {
				for n := 0; off+n <= len(long) && n < 80; n++ {
					p := make([]byte, n)
					Fill(seed, base+int64(off), p)
					if string(p) != string(long[off:off+n]) {
						t.Fatalf("seed %d: Fill(off=%d, n=%d) differs from the same bytes of a longer Fill", seed, base+int64(off), n)
					}
				}
			}
		}
	}
}

func TestFillDependsOnSeedAndOffset(t *testing.T) {
	a, b, c := make([]byte, 64), make([]byte, 64), make([]byte, 64)
	Fill(1, 0, a)
	Fill(2, 0, b)
	Fill(1, 64, c)
	if string(a) == string(b) {
		t.Error("seeds 1 and 2 fill the same bytes")
	}
	if string(a) == string(c) {
		t.Error("offsets 0 and 64 fill the same bytes")
	}
	// Every word differs from its neighbour: no trivially repeating pattern.
	for i := 8; i < len(a); i += 8 {
		if string(a[i:i+8]) == string(a[i-8:i]) {
			t.Errorf("words %d and %d are equal", i/8-1, i/8)
		}
	}
	// Deterministic.
	again := make([]byte, 64)
	Fill(1, 0, again)
	if string(a) != string(again) {
		t.Error("Fill is not deterministic")
	}
}

func TestMismatch(t *testing.T) {
	const seed = 7
	for _, base := range []int64{0, 3, 8, 1<<33 + 5} {
		for n := 0; n <= 40; n++ {
			p := make([]byte, n)
			Fill(seed, base, p)
			if got := Mismatch(seed, base, p); got != -1 {
				t.Fatalf("Mismatch(off=%d, n=%d) of Fill's own bytes = %d, want -1", base, n, got)
			}
			for j := 0; j < n; j++ {
				for _, mask := range []byte{0x01, 0x80, 0xff} {
					q := slices.Clone(p)
					q[j] ^= mask
					if got, want := Mismatch(seed, base, q), base+int64(j); got != want {
						t.Fatalf("Mismatch(off=%d, n=%d) with byte %d flipped by %#x = %d, want %d", base, n, j, mask, got, want)
					}
					// A second, later flip does not hide the first.
					if j+1 < n {
						q[n-1] ^= 0x10
						if got, want := Mismatch(seed, base, q), base+int64(j); got != want {
							t.Fatalf("Mismatch with flips at %d and %d = %d, want %d", j, n-1, got, want)
						}
					}
				}
			}
		}
	}
	// The wrong seed is caught.
	p := make([]byte, 64)
	Fill(1, 0, p)
	if Mismatch(2, 0, p) == -1 {
		t.Error("Mismatch accepts bytes filled from another seed")
	}
}

func FuzzFillMismatch(f *testing.F) {
	f.Add(uint64(0), uint64(0), uint16(8), uint16(0), byte(1))
	f.Add(uint64(9), uint64(13), uint16(100), uint16(57), byte(0x80))
	f.Add(uint64(math.MaxUint64), uint64(1<<50+1), uint16(3), uint16(2), byte(0))
	f.Fuzz(func(t *testing.T, seed, off64 uint64, n, flip uint16, mask byte) {
		off := int64(off64 >> 2) // keep off+n well inside int64
		p := make([]byte, n)
		Fill(seed, off, p)
		// Fill of a sub-range equals the slice of the larger one.
		if n > 0 {
			i := int(flip) % int(n)
			q := make([]byte, int(n)-i)
			Fill(seed, off+int64(i), q)
			if string(q) != string(p[i:]) {
				t.Fatalf("Fill(off=%d) differs from the tail of Fill(off=%d)", off+int64(i), off)
			}
		}
		if got := Mismatch(seed, off, p); got != -1 {
			t.Fatalf("Mismatch of Fill's own bytes = %d", got)
		}
		if n == 0 || mask == 0 {
			return
		}
		j := int(flip) % int(n)
		p[j] ^= mask
		if got, want := Mismatch(seed, off, p), off+int64(j); got != want {
			t.Fatalf("Mismatch(seed=%d, off=%d, n=%d) with byte %d flipped = %d, want %d", seed, off, n, j, got, want)
		}
	})
}

// ---- NaturalLess ----

func TestNaturalLess(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"model-2-of-10", "model-10-of-10", true},
		{"model-10-of-10", "model-2-of-10", false},
		{"model-00002-of-00010", "model-00010-of-00010", true},
		{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", true},
		{"file9", "file10", true},
		{"file99", "file100", true},
		{"file100", "file99", false},
		{"a1b2", "a1b10", true},
		{"a1b10", "a1b2", false},
		{"x08", "x9", true},
		{"x9", "x08", false},
		// Equal values: fewer leading zeros first, and never both ways.
		{"x1", "x01", true},
		{"x01", "x1", false},
		{"x7", "x007", true},
		{"x0", "x00", true},
		{"x00", "x0", false},
		// Equal values: the zeros decide before the rest of the name.
		{"x01a", "x1b", false},
		{"x1b", "x01a", true},
		// Numbers longer than any integer type.
		{"12345678901234567890123", "12345678901234567890124", true},
		{"99999999999999999999999", "100000000000000000000000", true},
		// Plain strings compare bytewise, prefixes first.
		{"", "", false},
		{"", "a", true},
		{"a", "", false},
		{"a", "a", false},
		{"a", "aa", true},
		{"abc", "abd", true},
		{"abd", "abc", false},
		{"B", "a", true},
		{"model.safetensors", "model.safetensors", false},
		// Digits against other bytes: by the byte.
		{"a/", "a0", true},
		{"a9", "a:", true},
		{"a100", "a:", true},
		{"a-", "a1", true},
		{"1", "a", true},
		{"7", "7", false},
		{"7", "7a", true},
	}
	for _, tc := range tests {
		if got := NaturalLess(tc.a, tc.b); got != tc.want {
			t.Errorf("NaturalLess(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// NaturalLess sorts Hugging Face shard names the way their numbers count.
func TestNaturalLessSortsShards(t *testing.T) {
	var want []string
	for i := 1; i <= 12; i++ {
		want = append(want, fmt.Sprintf("model-%d-of-12.safetensors", i))
	}
	got := slices.Clone(want)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(got), func(i, j int) { got[i], got[j] = got[j], got[i] })
	sort.Slice(got, func(i, j int) bool { return NaturalLess(got[i], got[j]) })
	if !slices.Equal(got, want) {
		t.Fatalf("sorted %v, want %v", got, want)
	}
}

func randName(r *rand.Rand) string {
	const alphabet = "0019a-b./:"
	n := r.IntN(7)
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

// checkOrder asserts the strict-weak-order laws on a, b, c, and that only
// equal strings are equivalent (so sorting shard names is deterministic).
func checkOrder(t *testing.T, a, b, c string) {
	t.Helper()
	ab, ba := NaturalLess(a, b), NaturalLess(b, a)
	if NaturalLess(a, a) {
		t.Fatalf("NaturalLess(%q, %q) = true: not irreflexive", a, a)
	}
	if ab && ba {
		t.Fatalf("NaturalLess(%q, %q) and the reverse are both true", a, b)
	}
	if !ab && !ba && a != b {
		t.Fatalf("%q and %q are distinct but neither sorts first", a, b)
	}
	bc, ac := NaturalLess(b, c), NaturalLess(a, c)
	if ab && bc && !ac {
		t.Fatalf("not transitive: %q < %q < %q but not %q < %q", a, b, c, a, c)
	}
	// Transitivity of incomparability.
	eq := func(x, y string) bool { return !NaturalLess(x, y) && !NaturalLess(y, x) }
	if eq(a, b) && eq(b, c) && !eq(a, c) {
		t.Fatalf("incomparability not transitive on %q, %q, %q", a, b, c)
	}
}

func TestNaturalLessStrictWeakOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	names := make([]string, 300)
	for i := range names {
		names[i] = randName(r)
	}
	for i := 0; i < 200000; i++ {
		checkOrder(t, names[r.IntN(len(names))], names[r.IntN(len(names))], names[r.IntN(len(names))])
	}
	// A sort by NaturalLess is consistent: every adjacent pair is ordered
	// and every pair of the sorted list agrees with its positions.
	sort.Slice(names, func(i, j int) bool { return NaturalLess(names[i], names[j]) })
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			if NaturalLess(names[j], names[i]) {
				t.Fatalf("after sorting, %q (at %d) sorts before %q (at %d)", names[j], j, names[i], i)
			}
		}
	}
}

func FuzzNaturalLess(f *testing.F) {
	f.Add("model-2-of-10", "model-10-of-10", "model-010-of-10")
	f.Add("x01", "x1", "x001")
	f.Add("a/", "a0", "a:")
	f.Add("", "0", "00")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		checkOrder(t, a, b, c)
		checkOrder(t, c, a, b)
		checkOrder(t, b, c, a)
		// Without digits it is the plain byte order.
		if !strings.ContainsAny(a+b, "0123456789") && NaturalLess(a, b) != (a < b) {
			t.Fatalf("NaturalLess(%q, %q) = %v, differs from < on strings without digits", a, b, NaturalLess(a, b))
		}
	})
}

// ---- HeaderLen and Parse ----

func lenPrefix(n uint64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], n)
	return b[:]
}

func TestHeaderLen(t *testing.T) {
	tests := []struct {
		name     string
		prefix   []byte
		fileSize int64
		want     int64
		wantErr  string
	}{
		{"zero", lenPrefix(0), 8, 0, ""},
		{"fills the file", lenPrefix(92), 100, 92, ""},
		{"room to spare", lenPrefix(16), 1 << 30, 16, ""},
		{"longer prefix slice", append(lenPrefix(4), 1, 2, 3), 12, 4, ""},
		{"at the limit", lenPrefix(MaxHeader), MaxHeader + 8, MaxHeader, ""},
		{"short prefix", []byte{1, 0, 0, 0, 0, 0, 0}, 100, 0, "shorter than"},
		{"empty prefix", nil, 100, 0, "shorter than"},
		{"short file", lenPrefix(0), 7, 0, "shorter than"},
		{"negative file size", lenPrefix(0), -1, 0, "shorter than"},
		{"past EOF by one", lenPrefix(93), 100, 0, "past the end"},
		{"past EOF", lenPrefix(1000), 100, 0, "past the end"},
		{"over the limit", lenPrefix(MaxHeader + 1), 1 << 40, 0, "exceeds"},
		{"huge", lenPrefix(math.MaxUint64), 1 << 40, 0, "exceeds"},
		{"sign bit", lenPrefix(1 << 63), math.MaxInt64, 0, "exceeds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := HeaderLen(tc.prefix, tc.fileSize)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("HeaderLen = %d, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("HeaderLen = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	hdr := `{"__metadata__":{"format":"pt","modelfs_seed":"9"},` +
		`"b.weight":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},` +
		`"a.scale":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},` +
		`"c.empty":{"dtype":"U8","shape":[0],"data_offsets":[16,16]}}`
	size := int64(8 + len(hdr) + 16)
	h, err := Parse([]byte(hdr), size)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	ds := int64(8 + len(hdr))
	if h.DataStart != ds {
		t.Errorf("DataStart = %d, want %d", h.DataStart, ds)
	}
	want := []Tensor{
		{Name: "a.scale", DType: "F32", Shape: []int64{1}, Begin: ds, End: ds + 4},
		{Name: "b.weight", DType: "BF16", Shape: []int64{2, 3}, Begin: ds + 4, End: ds + 16},
		{Name: "c.empty", DType: "U8", Shape: []int64{0}, Begin: ds + 16, End: ds + 16},
	}
	if fmt.Sprint(h.Tensors) != fmt.Sprint(want) {
		t.Errorf("Tensors = %+v, want %+v", h.Tensors, want)
	}
	if h.Metadata["format"] != "pt" || len(h.Metadata) != 2 {
		t.Errorf("Metadata = %v", h.Metadata)
	}
	if seed, ok := h.Seed(); !ok || seed != 9 {
		t.Errorf("Seed() = %d, %v; want 9, true", seed, ok)
	}
	// One byte less and the last tensor runs past the end.
	if _, err := Parse([]byte(hdr), size-1); err == nil {
		t.Error("Parse accepted a tensor that ends past the file")
	}

	// No tensors, no metadata, trailing padding as writers add it.
	h, err = Parse([]byte("{}      "), 16)
	if err != nil || len(h.Tensors) != 0 || h.DataStart != 16 {
		t.Errorf("Parse of an empty header: %+v, %v", h, err)
	}
	if _, ok := h.Seed(); ok {
		t.Error("Seed() found a seed in a header without metadata")
	}
	h, err = Parse([]byte(`{"__metadata__":{"modelfs_seed":"x"}}`), 100)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if _, ok := h.Seed(); ok {
		t.Error("Seed() accepted a non-numeric seed")
	}
}

func TestParseRejects(t *testing.T) {
	tensor := func(b, e string) string {
		return `{"t":{"dtype":"U8","shape":[1],"data_offsets":[` + b + `,` + e + `]}}`
	}
	tests := []struct {
		name    string
		header  string
		size    int64 // data bytes after the header
		wantErr string
	}{
		{"empty", "", 100, "not a JSON object"},
		{"not JSON", "hello", 100, "not a JSON object"},
		{"truncated JSON", `{"t":{"dtype":"U8"`, 100, "not a JSON object"},
		{"array", `[1,2]`, 100, "not a JSON object"},
		{"string", `"x"`, 100, "not a JSON object"},
		{"number", `12`, 100, "not a JSON object"},
		{"trailing garbage", `{} x`, 100, "not a JSON object"},
		{"tensor not an object", `{"t":5}`, 100, `tensor "t"`},
		{"offsets not numbers", `{"t":{"dtype":"U8","shape":[1],"data_offsets":["0","1"]}}`, 100, `tensor "t"`},
		{"fractional offsets", tensor("0.5", "1"), 100, `tensor "t"`},
		{"shape not a list", `{"t":{"dtype":"U8","shape":1,"data_offsets":[0,1]}}`, 100, `tensor "t"`},
		{"negative begin", tensor("-1", "1"), 100, "outside"},
		{"end before begin", tensor("5", "4"), 100, "outside"},
		{"end past file", tensor("0", "101"), 100, "outside"},
		{"begin and end past file", tensor("200", "300"), 100, "outside"},
		{"offsets overflow int64", tensor("0", "9223372036854775808"), 100, `tensor "t"`},
		{"metadata not an object", `{"__metadata__":[1]}`, 100, "__metadata__"},
		{"metadata not strings", `{"__metadata__":{"a":1}}`, 100, "__metadata__"},
		{"metadata nested", `{"__metadata__":{"a":{"b":"c"}}}`, 100, "__metadata__"},
		{"metadata a string", `{"__metadata__":"pt"}`, 100, "__metadata__"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := Parse([]byte(tc.header), int64(8+len(tc.header))+tc.size)
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want an error", tc.header, h)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Parse(%q) error %q, want it to contain %q", tc.header, err, tc.wantErr)
			}
		})
	}
}

// Offsets near the int64 limit must not wrap around the bounds check:
// Load would slice the mapping with them.
func TestParseRejectsOverflowingOffsets(t *testing.T) {
	for _, off := range [][2]string{
		{"0", "9223372036854775807"},
		{"9223372036854775807", "9223372036854775807"},
		{"9223372036854775000", "9223372036854775807"},
		{"0", "9223372036854775790"},
	} {
		hdr := `{"t":{"dtype":"U8","shape":[1],"data_offsets":[` + off[0] + `,` + off[1] + `]}}`
		size := int64(8 + len(hdr) + 100)
		h, err := Parse([]byte(hdr), size)
		if err == nil {
			t.Errorf("Parse accepted data_offsets [%s, %s] in a %d-byte file: tensors %+v", off[0], off[1], size, h.Tensors)
		}
	}
}

// checkHeader asserts what every successful Parse guarantees.
func checkHeader(t *testing.T, h *Header, headerLen int, size int64) {
	t.Helper()
	if h.DataStart != 8+int64(headerLen) {
		t.Fatalf("DataStart = %d, want 8+%d", h.DataStart, headerLen)
	}
	for i, tn := range h.Tensors {
		if !(h.DataStart <= tn.Begin && tn.Begin <= tn.End && tn.End <= size) {
			t.Fatalf("tensor %q spans [%d, %d): outside data region [%d, %d)", tn.Name, tn.Begin, tn.End, h.DataStart, size)
		}
		if tn.Name == "__metadata__" {
			t.Fatal("__metadata__ listed as a tensor")
		}
		if i > 0 && !(h.Tensors[i-1].Name < tn.Name) {
			t.Fatalf("tensors not sorted by name: %q then %q", h.Tensors[i-1].Name, tn.Name)
		}
	}
}

func FuzzParse(f *testing.F) {
	seedHeader := `{"__metadata__":{"format":"pt","modelfs_seed":"3"},` +
		`"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`
	file := append(lenPrefix(uint64(len(seedHeader))), seedHeader...)
	file = append(file, make([]byte, 8)...)
	f.Add(file, uint32(0))
	f.Add([]byte(seedHeader), uint32(8))
	f.Add([]byte(`{"t":{"data_offsets":[0,1]},"t":{"data_offsets":[1,2]}}`), uint32(2))
	f.Add([]byte(`{"__metadata__":{"a":"b"}}`), uint32(0))
	f.Add(lenPrefix(math.MaxUint64), uint32(1))
	f.Add([]byte(`null`), uint32(0))
	// Offsets just short of the int64 limit: in range, but rejected
	// as outside the file; one digit away from overflowing DataStart+end.
	f.Add([]byte(`{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,9223372036854775700]}}`), uint32(4))
	f.Fuzz(func(t *testing.T, b []byte, extra uint32) {
		// b as a whole file.
		size := int64(len(b))
		if n, err := HeaderLen(b, size); err == nil {
			if n < 0 || 8+n > size {
				t.Fatalf("HeaderLen = %d for a %d-byte file", n, size)
			}
			if h, err := Parse(b[8:8+n], size); err == nil {
				checkHeader(t, h, int(n), size)
			}
		}
		// b as the JSON header of a file with extra data bytes.
		size = 8 + int64(len(b)) + int64(extra)
		if h, err := Parse(b, size); err == nil {
			checkHeader(t, h, len(b), size)
		}
	})
}

// ---- Generate and Load ----

func TestGenerateLoad(t *testing.T) {
	for _, mixed := range []bool{false, true} {
		t.Run(fmt.Sprintf("mixed=%v", mixed), func(t *testing.T) {
			dir := t.TempDir()
			spec := Spec{Bytes: 2 << 20, Shards: 2, Seed: 1234, Mixed: mixed}
			paths, err := Generate(dir, spec)
			if err != nil {
				t.Fatalf("Generate: %v", err)
			}
			if len(paths) != 2 {
				t.Fatalf("Generate returned %d shards, want 2", len(paths))
			}
			for _, name := range []string{"model.safetensors.index.json", "config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json"} {
				if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
					t.Errorf("Generate did not write %s: %v", name, err)
				}
			}
			var index struct {
				Metadata struct {
					TotalSize int64 `json:"total_size"`
				} `json:"metadata"`
				WeightMap map[string]string `json:"weight_map"`
			}
			b, err := os.ReadFile(filepath.Join(dir, "model.safetensors.index.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &index); err != nil {
				t.Fatalf("index: %v", err)
			}
			var total int64
			tensors := 0
			for i, p := range paths {
				want := fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)
				if filepath.Base(p) != want {
					t.Errorf("shard %d is %s, want %s", i, filepath.Base(p), want)
				}
				h, size := readHeader(t, p)
				if seed, ok := h.Seed(); !ok || seed != spec.Seed+uint64(i) {
					t.Errorf("%s: seed %d, %v; want %d", p, seed, ok, spec.Seed+uint64(i))
				}
				if h.DataStart%8 != 0 {
					t.Errorf("%s: data region starts at %d, not 8-aligned", p, h.DataStart)
				}
				checkLayout(t, h, size, mixed)
				for _, tn := range h.Tensors {
					if index.WeightMap[tn.Name] != filepath.Base(p) {
						t.Errorf("index maps %s to %q, want %s", tn.Name, index.WeightMap[tn.Name], filepath.Base(p))
					}
					total += tn.End - tn.Begin
				}
				tensors += len(h.Tensors)

				res, err := Load(p, true)
				if err != nil {
					t.Fatalf("Load(%s, verify): %v", p, err)
				}
				if !res.Verified || res.Tensors != len(h.Tensors) || res.Bytes != size-h.DataStart {
					t.Errorf("Load(%s) = %+v; want %d tensors, %d bytes, verified", p, res, len(h.Tensors), size-h.DataStart)
				}
			}
			if len(index.WeightMap) != tensors {
				t.Errorf("index lists %d tensors, shards hold %d", len(index.WeightMap), tensors)
			}
			if index.Metadata.TotalSize != total {
				t.Errorf("index total_size %d, tensor bytes %d", index.Metadata.TotalSize, total)
			}
			if total < spec.Bytes {
				t.Errorf("model holds %d tensor bytes, spec asked for %d", total, spec.Bytes)
			}
		})
	}
}

func readHeader(t *testing.T, path string) (*Header, int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := HeaderLen(b, int64(len(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	h, err := Parse(b[8:8+n], int64(len(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return h, int64(len(b))
}

// checkLayout: the tensors tile the data region exactly, each as long as its
// dtype and shape say, and the data bytes are Fill's.
func checkLayout(t *testing.T, h *Header, size int64, mixed bool) {
	t.Helper()
	byPos := slices.Clone(h.Tensors)
	sort.Slice(byPos, func(i, j int) bool { return byPos[i].Begin < byPos[j].Begin })
	pos := h.DataStart
	for _, tn := range byPos {
		if tn.Begin != pos {
			t.Fatalf("tensor %s starts at %d, want %d (gap or overlap)", tn.Name, tn.Begin, pos)
		}
		n := DTypeSize(tn.DType)
		if n == 0 {
			t.Fatalf("tensor %s has unknown dtype %q", tn.Name, tn.DType)
		}
		for _, d := range tn.Shape {
			n *= d
		}
		if tn.End-tn.Begin != n {
			t.Fatalf("tensor %s holds %d bytes, dtype %s shape %v need %d", tn.Name, tn.End-tn.Begin, tn.DType, tn.Shape, n)
		}
		switch {
		case !mixed && tn.DType != "BF16":
			t.Errorf("tensor %s is %s in an unmixed model", tn.Name, tn.DType)
		case mixed && strings.HasSuffix(tn.Name, ".weight_scale") && tn.DType != "F32":
			t.Errorf("scale %s is %s", tn.Name, tn.DType)
		case mixed && strings.HasSuffix(tn.Name, ".weight") && tn.DType != "F8_E4M3":
			t.Errorf("weight %s is %s", tn.Name, tn.DType)
		}
		pos = tn.End
	}
	if pos != size {
		t.Fatalf("tensors end at %d, file at %d", pos, size)
	}
	if mixed {
		scales := 0
		for _, tn := range h.Tensors {
			if strings.HasSuffix(tn.Name, ".weight_scale") {
				scales++
				if _, ok := slices.BinarySearchFunc(h.Tensors, strings.TrimSuffix(tn.Name, "_scale"),
					func(x Tensor, name string) int { return strings.Compare(x.Name, name) }); !ok {
					t.Errorf("scale %s has no weight", tn.Name)
				}
			}
		}
		if scales*2 != len(h.Tensors) {
			t.Errorf("%d scales for %d tensors, want one per weight", scales, len(h.Tensors))
		}
	}
}

func TestLoadCorruptByte(t *testing.T) {
	dir := t.TempDir()
	paths, err := Generate(dir, Spec{Bytes: 1 << 20, Shards: 1, Seed: 99, Mixed: true})
	if err != nil {
		t.Fatal(err)
	}
	p := paths[0]
	h, size := readHeader(t, p)
	mid := h.Tensors[len(h.Tensors)/2]
	for _, off := range []int64{h.DataStart, h.DataStart + 1, mid.Begin + (mid.End-mid.Begin)/2 + 3, mid.End - 1, size - 1} {
		corrupt(t, p, off)
		_, err := Load(p, true)
		if err == nil {
			t.Fatalf("Load(verify) accepted a file with byte %d flipped", off)
		}
		if want := fmt.Sprintf("offset %d", off); !strings.Contains(err.Error(), want) {
			t.Errorf("Load error %q does not name %s", err, want)
		}
		// Without verification the same file loads.
		if res, err := Load(p, false); err != nil || res.Verified {
			t.Errorf("Load(no verify) of the corrupted file: %+v, %v", res, err)
		}
		corrupt(t, p, off) // flip back
		if _, err := Load(p, true); err != nil {
			t.Fatalf("Load after restoring byte %d: %v", off, err)
		}
	}
}

func corrupt(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, header string, data int) string {
	t.Helper()
	b := append(lenPrefix(uint64(len(header))), header...)
	b = append(b, make([]byte, data)...)
	p := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadRejects(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short.safetensors")
	if err := os.WriteFile(short, []byte{1, 2, 3}, 0o644); err != nil {
		t.Fatal(err)
	}
	pastEOF := filepath.Join(dir, "past.safetensors")
	if err := os.WriteFile(pastEOF, append(lenPrefix(100), "{}"...), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, path string
		verify     bool
		wantErr    string
	}{
		{"missing", filepath.Join(dir, "nope.safetensors"), false, "no such file"},
		{"short", short, false, "too short"},
		{"header past EOF", pastEOF, false, "past the end"},
		{"bad JSON", writeFile(t, "{nope", 0), false, "not a JSON object"},
		{"tensor past EOF", writeFile(t, `{"t":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}`, 8), false, "outside"},
		{"no seed to verify", writeFile(t, `{"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, 8), true, SeedKey},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path, tc.verify)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Load = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
	// Unseeded files still load without verification.
	p := writeFile(t, `{"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, 8)
	res, err := Load(p, false)
	if err != nil || res.Tensors != 1 || res.Bytes != 8 || res.Verified {
		t.Fatalf("Load(unseeded, no verify) = %+v, %v", res, err)
	}
}

func TestGenerateRejectsNoShards(t *testing.T) {
	if _, err := Generate(t.TempDir(), Spec{Bytes: 1 << 20, Shards: 0}); err == nil {
		t.Fatal("Generate accepted 0 shards")
	}
}

func TestDTypeSize(t *testing.T) {
	for dt, want := range map[string]int64{
		"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4,
		"F16": 2, "BF16": 2, "I16": 2, "U16": 2,
		"F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
		"": 0, "bf16": 0, "F128": 0,
	} {
		if got := DTypeSize(dt); got != want {
			t.Errorf("DTypeSize(%q) = %d, want %d", dt, got, want)
		}
	}
}
