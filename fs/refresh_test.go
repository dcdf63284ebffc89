package fs_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/modelfs/modelfs/fs"
)

// TestRefreshNeverMixesVersions: an object replaced under an open handle
// gives that handle its old bytes or ESTALE, never a byte of the new
// version; new opens see the new version; added and deleted objects
// appear and disappear, even where the kernel had cached a miss.
func TestRefreshNeverMixesVersions(t *testing.T) {
	b := newBucket(t)
	const size = 10 * testChunk
	oldData, newData := bytes.Repeat([]byte{'A'}, size), bytes.Repeat([]byte{'B'}, size)
	put(t, b, "w", oldData)
	put(t, b, "gone", []byte("bye"))
	mt := mountBucket(t, b, "", mountOpts{})
	p := func(s string) string { return filepath.Join(mt.dir, s) }

	if _, err := os.Stat(p("new")); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("stat new before it exists: %v", err) // the kernel now caches the miss
	}
	f, err := os.OpenFile(p("w"), os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, testChunk)
	if _, err := f.ReadAt(buf, 0); err != nil || buf[0] != 'A' {
		t.Fatalf("first read: %v %q", err, buf[:1])
	}

	put(t, b, "w", newData)
	put(t, b, "new", []byte("hello"))
	if _, err := srv.Client().DeleteObject(context.Background(), deleteInput(b, "gone")); err != nil {
		t.Fatal(err)
	}
	c, err := mt.m.Refresh(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c != (fs.Changes{Added: 1, Changed: 1, Removed: 1}) {
		t.Errorf("refresh changes %+v, want one of each", c)
	}

	stale := 0
	for off := int64(0); off < size; off += testChunk {
		n, err := f.ReadAt(buf, off)
		switch {
		case errors.Is(err, syscall.ESTALE):
			stale++
		case err != nil:
			t.Fatalf("old handle at %d: %v, want its old bytes or ESTALE", off, err)
		case bytes.IndexByte(buf[:n], 'B') >= 0:
			t.Fatalf("old handle read bytes of the new version at %d", off)
		}
	}
	if stale == 0 {
		t.Error("the old handle never saw ESTALE after its object was replaced")
	}
	if got, err := os.ReadFile(p("w")); err != nil || !bytes.Equal(got, newData) {
		t.Errorf("a new open read %d bytes (%v), want the new version", len(got), err)
	}
	if got, err := os.ReadFile(p("new")); err != nil || string(got) != "hello" {
		t.Errorf("added file: %q, %v", got, err)
	}
	if _, err := os.Stat(p("gone")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("deleted file: %v, want ENOENT", err)
	}
}

// TestRefreshOldHandleKeepsItsPages: the page cache cannot mix versions.
// A buffered handle reads some of the old version; the object is replaced
// by a larger one and a new open reads it all into the page cache; the old
// handle then still gets only old bytes (or ESTALE), and stat and new opens
// show the new size although the old handle is still open.
func TestRefreshOldHandleKeepsItsPages(t *testing.T) {
	b := newBucket(t)
	const oldSize, newSize = 10 * testChunk, 20 * testChunk
	put(t, b, "w", bytes.Repeat([]byte{'A'}, oldSize))
	mt := mountBucket(t, b, "", mountOpts{})
	p := filepath.Join(mt.dir, "w")
	old, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	buf := make([]byte, testChunk)
	if _, err := old.ReadAt(buf, 0); err != nil || buf[0] != 'A' {
		t.Fatalf("first read: %v %q", err, buf[:1])
	}

	newData := bytes.Repeat([]byte{'B'}, newSize)
	put(t, b, "w", newData)
	if _, err := mt.m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p); err != nil || st.Size() != newSize {
		t.Fatalf("stat with the old handle open: %v, %v; want size %d", st, err, newSize)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, newData) {
		t.Fatalf("a new open read %d bytes (%v), want the %d new ones", len(got), err, newSize)
	}
	for off := int64(0); off < oldSize; off += testChunk {
		n, err := old.ReadAt(buf, off)
		switch {
		case errors.Is(err, syscall.ESTALE):
		case err != nil:
			t.Fatalf("old handle at %d: %v, want its old bytes or ESTALE", off, err)
		case bytes.IndexByte(buf[:n], 'B') >= 0:
			t.Fatalf("old handle read bytes of the new version at %d", off)
		}
	}
	if st, err := old.Stat(); err != nil || st.Size() != oldSize {
		t.Errorf("fstat of the old handle: %v, %v; want its own size %d", st, err, oldSize)
	}
}
