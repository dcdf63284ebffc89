package fs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/fs"
	"github.com/modelfs/modelfs/internal/safetensors"
)

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() {
			n += "/"
		}
		out = append(out, n)
	}
	return out
}

func TestListingEdgeCases(t *testing.T) {
	b := newBucket(t)
	put(t, b, "m/a.txt", []byte("hello"))
	put(t, b, "m/dir/", nil) // a directory marker: an empty directory
	put(t, b, "m/sub/", nil)
	put(t, b, "m/sub/b.bin", []byte("bbb"))
	put(t, b, "m/sp ace/ü ñ.json", []byte(`{"k": 1}`))
	put(t, b, "m/empty", nil)
	put(t, b, "m/outside-prefix-not-shown", nil)
	put(t, b, "other/z", []byte("z"))
	const many = 1100 // more than one listing page
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := 0; i < many; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			put(t, b, fmt.Sprintf("m/many/%04d", i), []byte(fmt.Sprint(i)))
		}(i)
	}
	wg.Wait()

	mt := mountBucket(t, b, "m/", mountOpts{})
	got := names(t, mt.dir)
	want := []string{"a.txt", "dir/", "empty", "many/", "outside-prefix-not-shown", "sp ace/", "sub/"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("root lists %q, want %q", got, want)
	}
	if len(mt.tree.Skipped) != 0 {
		t.Errorf("Skipped = %q, want none", mt.tree.Skipped)
	}
	if n := len(names(t, filepath.Join(mt.dir, "many"))); n != many {
		t.Errorf("many/ has %d entries, want %d", n, many)
	}
	if n := len(names(t, filepath.Join(mt.dir, "dir"))); n != 0 {
		t.Errorf("marker directory dir/ has %d entries, want 0", n)
	}
	for path, content := range map[string]string{
		"a.txt": "hello", "sub/b.bin": "bbb", "sp ace/ü ñ.json": `{"k": 1}`, "empty": "", "many/0999": "999",
	} {
		data, err := os.ReadFile(filepath.Join(mt.dir, path))
		if err != nil || string(data) != content {
			t.Errorf("read %s = %q, %v; want %q", path, data, err, content)
		}
	}
	for path, mode := range map[string]os.FileMode{"a.txt": 0o444, "empty": 0o444, "dir": os.ModeDir | 0o555, "sp ace": os.ModeDir | 0o555} {
		st, err := os.Stat(filepath.Join(mt.dir, path))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != mode {
			t.Errorf("%s mode %v, want %v", path, st.Mode(), mode)
		}
	}
	st, _ := os.Stat(filepath.Join(mt.dir, "a.txt"))
	if st.Size() != 5 || st.ModTime().IsZero() {
		t.Errorf("a.txt: size %d mtime %v", st.Size(), st.ModTime())
	}
}

func TestWholeBucketAndSuffixFilter(t *testing.T) {
	b := newBucket(t)
	put(t, b, "config.json", []byte("{}"))
	put(t, b, "model.safetensors", []byte("x"))
	put(t, b, "README.md", []byte("r"))
	put(t, b, "sub/tokenizer.json", []byte("{}"))
	put(t, b, "sub/notes.txt", []byte("n"))
	mt := mountBucket(t, b, "", mountOpts{filter: fs.SuffixFilter([]string{"json", ".safetensors"})})
	if got := strings.Join(names(t, mt.dir), ","); got != "config.json,model.safetensors,sub/" {
		t.Errorf("root lists %s", got)
	}
	if got := strings.Join(names(t, filepath.Join(mt.dir, "sub")), ","); got != "tokenizer.json" {
		t.Errorf("sub lists %s", got)
	}
}

// objectSizes straddle every chunk boundary case.
var objectSizes = []int{0, 1, 4095, testChunk - 1, testChunk, testChunk + 1, 3*testChunk + 17, 40*testChunk + 5}

func TestReadsMatchSource(t *testing.T) {
	b := newBucket(t)
	src := map[string][]byte{}
	for i, n := range objectSizes {
		name := fmt.Sprintf("obj-%d", n)
		src[name] = randomBytes(uint64(i), n)
		put(t, b, "p/"+name, src[name])
	}
	mt := mountBucket(t, b, "p/", mountOpts{})
	for name, want := range src {
		got, err := os.ReadFile(filepath.Join(mt.dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("ReadFile %s: %d bytes, %v; want %d bytes equal to the source", name, len(got), err, len(want))
		}
		st, _ := os.Stat(filepath.Join(mt.dir, name))
		if st.Size() != int64(len(want)) {
			t.Errorf("%s size %d, want %d", name, st.Size(), len(want))
		}
	}
	// Offsets at and around chunk boundaries and EOF, through O_DIRECT so
	// every read reaches the daemon instead of the page cache.
	for name, want := range src {
		size := int64(len(want))
		f, err := os.OpenFile(filepath.Join(mt.dir, name), os.O_RDONLY|syscall.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		offsets := []int64{0, 1, testChunk - 1, testChunk, testChunk + 1, 2*testChunk - 3, size - 1, size, size + 1, size + 10*testChunk}
		for _, off := range offsets {
			if off < 0 {
				continue
			}
			for _, n := range []int{1, 4096, testChunk, 2*testChunk + 3} {
				checkPread(t, f, want, off, n)
			}
		}
		f.Close()
	}
}

func checkPread(t *testing.T, f *os.File, want []byte, off int64, n int) {
	t.Helper()
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, off)
	size := int64(len(want))
	exp := 0
	if off < size {
		exp = int(min(int64(n), size-off))
	}
	if got != exp || (err != nil && !errors.Is(err, io.EOF)) {
		t.Fatalf("%s: pread(off=%d, n=%d) = %d, %v; want %d bytes", f.Name(), off, n, got, err, exp)
	}
	if exp > 0 && !bytes.Equal(buf[:got], want[off:off+int64(exp)]) {
		t.Fatalf("%s: pread(off=%d, n=%d) returned wrong bytes", f.Name(), off, n)
	}
}

// TestRandomReadsConcurrently is a property test: random ranges read by
// concurrent readers always equal the source.
func TestRandomReadsConcurrently(t *testing.T) {
	b := newBucket(t)
	want := randomBytes(42, 100*testChunk+123)
	put(t, b, "big", want)
	// A budget of 16 chunks is far smaller than the object, so chunks are
	// evicted and refetched under the readers.
	mt := mountBucket(t, b, "", mountOpts{budget: 16 * testChunk})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			f, err := os.OpenFile(filepath.Join(mt.dir, "big"), os.O_RDONLY|syscall.O_DIRECT, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for i := 0; i < 150; i++ {
				off := r.Int64N(int64(len(want)) + testChunk)
				n := 1 + r.IntN(3*testChunk)
				buf := make([]byte, n)
				got, err := f.ReadAt(buf, off)
				exp := 0
				if off < int64(len(want)) {
					exp = int(min(int64(n), int64(len(want))-off))
				}
				if got != exp || (err != nil && !errors.Is(err, io.EOF)) || (exp > 0 && !bytes.Equal(buf[:got], want[off:off+int64(exp)])) {
					t.Errorf("reader %d: pread(%d, %d) = %d, %v: wrong", g, off, n, got, err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	if mt.cache.Stats.Misses.Load() <= 100 {
		t.Errorf("only %d misses: the small budget should have forced refetches", mt.cache.Stats.Misses.Load())
	}
}

// TestMmapLoadFromAnotherProcess loads a generated model the way vLLM does,
// from a separate process, and verifies every byte.
func TestMmapLoadFromAnotherProcess(t *testing.T) {
	b := newBucket(t)
	local := t.TempDir()
	shards, err := safetensors.Generate(local, safetensors.Spec{Bytes: 12 << 20, Shards: 2, Seed: 7, Mixed: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.PutDir(context.Background(), b, "model/", local); err != nil {
		t.Fatal(err)
	}
	var want int64
	var files []string
	for _, s := range shards {
		r, err := safetensors.Load(s, true)
		if err != nil {
			t.Fatal(err)
		}
		want += r.Bytes
	}
	mt := mountBucket(t, b, "model/", mountOpts{})
	for _, s := range shards {
		files = append(files, filepath.Join(mt.dir, filepath.Base(s)))
	}
	if got := loadInChild(t, files...); got != want {
		t.Errorf("loader copied %d tensor bytes, want %d", got, want)
	}
	// Twice: the second load is served by the page cache.
	served := mt.m.Stats().ReadBytes.Load()
	if got := loadInChild(t, files...); got != want {
		t.Errorf("second load copied %d tensor bytes, want %d", got, want)
	}
	// The page cache serves it. This machine's proactive reclaim (DAMON
	// pageout) can drop a few pages between the loads, which the kernel
	// then asks for again; a mount that lost its page cache on open would
	// be asked for all of them.
	if again := mt.m.Stats().ReadBytes.Load() - served; again > want/16 {
		t.Errorf("second load reached the daemon for %d of %d bytes; the page cache should have served it", again, want)
	}
}

func TestWritesFailWithEROFS(t *testing.T) {
	b := newBucket(t)
	put(t, b, "f", []byte("data"))
	put(t, b, "d/g", []byte("g"))
	mt := mountBucket(t, b, "", mountOpts{})
	p := func(s string) string { return filepath.Join(mt.dir, s) }
	ops := map[string]func() error{
		"create":        func() error { _, err := os.Create(p("new")); return err },
		"open O_WRONLY": func() error { _, err := os.OpenFile(p("f"), os.O_WRONLY, 0); return err },
		"open O_RDWR":   func() error { _, err := os.OpenFile(p("f"), os.O_RDWR, 0); return err },
		"open O_TRUNC":  func() error { _, err := os.OpenFile(p("f"), os.O_RDONLY|os.O_TRUNC, 0); return err },
		"open O_APPEND": func() error { _, err := os.OpenFile(p("f"), os.O_WRONLY|os.O_APPEND, 0); return err },
		"mkdir":         func() error { return os.Mkdir(p("nd"), 0o755) },
		"rmdir":         func() error { return syscall.Rmdir(p("d")) },
		"unlink":        func() error { return syscall.Unlink(p("f")) },
		"rename":        func() error { return os.Rename(p("f"), p("f2")) },
		"symlink":       func() error { return os.Symlink("f", p("l")) },
		"link":          func() error { return os.Link(p("f"), p("h")) },
		"chmod":         func() error { return os.Chmod(p("f"), 0o644) },
		"chown":         func() error { return os.Chown(p("f"), 1, 1) },
		"truncate":      func() error { return os.Truncate(p("f"), 0) },
		"utimes":        func() error { return unix.UtimesNano(p("f"), []unix.Timespec{{}, {}}) },
		"setxattr":      func() error { return unix.Setxattr(p("f"), "user.k", []byte("v"), 0) },
		"mknod":         func() error { return unix.Mknod(p("fifo"), unix.S_IFIFO|0o644, 0) },
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s: got %v, want EROFS", name, err)
		}
	}
	if data, err := os.ReadFile(p("f")); err != nil || string(data) != "data" {
		t.Errorf("f changed: %q, %v", data, err)
	}
}

func TestMissingNamesAreENOENTAndCached(t *testing.T) {
	b := newBucket(t)
	put(t, b, "config.json", []byte("{}"))
	mt := mountBucket(t, b, "", mountOpts{})
	for i := 0; i < 3; i++ {
		for _, name := range []string{"preprocessor_config.json", "sub/missing"} {
			if _, err := os.Stat(filepath.Join(mt.dir, name)); !errors.Is(err, syscall.ENOENT) {
				t.Fatalf("stat %s: %v, want ENOENT", name, err)
			}
		}
	}
	// "sub/missing" fails at "sub"; so two distinct missing names, each
	// looked up once: the kernel answered the repeats from its cache.
	if n := mt.m.Stats().NegativeLookups.Load(); n != 2 {
		t.Errorf("%d negative lookups reached the daemon, want 2", n)
	}
}

func TestMountSettings(t *testing.T) {
	b := newBucket(t)
	want := randomBytes(9, 3*testChunk)
	put(t, b, "w.bin", want)
	mt := mountBucket(t, b, "", mountOpts{})
	if kb, err := fs.ReadAheadKB(mt.dir); err != nil || kb != fs.DefaultOptions.ReadAheadKB {
		t.Errorf("read_ahead_kb = %d, %v; want %d", kb, err, fs.DefaultOptions.ReadAheadKB)
	}
	opts := mountOptions(t, mt.dir)
	if !strings.HasPrefix(opts, "ro,") {
		t.Errorf("mount options %q, want read-only", opts)
	}
	// FOPEN_KEEP_CACHE: a file read once and reopened is served from the
	// page cache, without reads reaching the daemon.
	if got, _ := os.ReadFile(filepath.Join(mt.dir, "w.bin")); !bytes.Equal(got, want) {
		t.Fatal("first read differs from the source")
	}
	served := mt.m.Stats().ReadBytes.Load()
	for i := 0; i < 3; i++ {
		if got, _ := os.ReadFile(filepath.Join(mt.dir, "w.bin")); !bytes.Equal(got, want) {
			t.Fatal("reread differs from the source")
		}
	}
	// (Proactive reclaim may drop a page or two between the reads; without
	// KEEP_CACHE each open would re-read the whole file.)
	if again := mt.m.Stats().ReadBytes.Load() - served; again > int64(len(want))/16 {
		t.Errorf("reopening the file re-read %d of its %d bytes through the daemon", again, len(want))
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(mt.dir, &sfs); err != nil || sfs.Blocks*uint64(sfs.Bsize) < uint64(len(want)) {
		t.Errorf("statfs: %+v, %v", sfs, err)
	}
}

// mountOptions returns the per-mount options of dir from mountinfo.
func mountOptions(t *testing.T, dir string) string {
	ms := fs.MountsOn(dir)
	if len(ms) == 0 {
		t.Fatalf("%s not in mountinfo", dir)
	}
	return ms[len(ms)-1].Options
}

// listing is a store that only lists, for key sets a POSIX-backed server
// cannot hold (a key that is both a file and a prefix).
type listing []backend.Object

func (l listing) List(ctx context.Context, prefix string, fn func(backend.Object) error) error {
	for _, o := range l {
		if strings.HasPrefix(o.Key, prefix) {
			if err := fn(o); err != nil {
				return err
			}
		}
	}
	return nil
}
func (listing) Stat(context.Context, string) (backend.Object, error) { return backend.Object{}, nil }
func (listing) Open(context.Context, string, string, int64, int64) (io.ReadCloser, error) {
	return nil, errors.New("not readable")
}
func (listing) String() string { return "listing" }
func (listing) Close() error   { return nil }

func TestListFileAndDirectoryOfOneName(t *testing.T) {
	// Lexical order: the file "x" comes before "x/y" and "x0".
	tree, err := fs.List(context.Background(), listing{
		{Key: "x", Size: 3}, {Key: "x/y", Size: 1}, {Key: "x0", Size: 2}, {Key: "z/", Size: 0}, {Key: "z", Size: 5},
	}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	fs.Walk(tree.Root, func(p string, e *fs.Entry) {
		if e.IsDir() {
			p += "/"
		}
		got = append(got, p)
	})
	if strings.Join(got, ",") != "x/,x/y,x0,z/" {
		t.Errorf("tree %q, want the directories to win", got)
	}
	if tree.Files != 2 || tree.Bytes != 3 || len(tree.Skipped) != 2 {
		t.Errorf("files %d bytes %d skipped %q", tree.Files, tree.Bytes, tree.Skipped)
	}
}

func TestListSkipsKeysThatCannotBePaths(t *testing.T) {
	// versitygw stores keys as POSIX paths and cleans these; S3 keeps them.
	long := strings.Repeat("n", 256)
	tree, err := fs.List(context.Background(), listing{
		{Key: "p/a//b"}, {Key: "p/c/./d"}, {Key: "p/e/../f"}, {Key: "p/" + long}, {Key: "p/ok", Size: 1},
	}, "p/", nil)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	fs.Walk(tree.Root, func(p string, e *fs.Entry) { keys = append(keys, p) })
	if strings.Join(keys, ",") != "ok" || len(tree.Skipped) != 4 {
		t.Errorf("tree has %q, skipped %q", keys, tree.Skipped)
	}
}
