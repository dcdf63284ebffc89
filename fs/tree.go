package fs

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/modelfs/modelfs/backend"
)

// Entry is a file or directory of a listed tree. Obj is nil for directories.
type Entry struct {
	Name     string
	Obj      *backend.Object
	Children map[string]*Entry // directories only
	ModTime  time.Time
}

// IsDir reports whether e is a directory.
func (e *Entry) IsDir() bool { return e.Obj == nil }

// Sorted returns a directory's children by name.
func (e *Entry) Sorted() []*Entry {
	out := make([]*Entry, 0, len(e.Children))
	for _, c := range e.Children {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Tree is the directory a bucket prefix presents, listed once.
type Tree struct {
	Root  *Entry
	Files int
	Bytes int64
	// Skipped names the keys that cannot be shown as files, with the reason.
	Skipped []string
}

// Filter decides whether a file (by its path inside the tree) is shown.
type Filter func(name string) bool

// SuffixFilter shows only files whose names end in one of the suffixes
// ("json" and ".json" both match "config.json"); no suffixes shows all.
func SuffixFilter(suffixes []string) Filter {
	var want []string
	for _, s := range suffixes {
		if s = strings.TrimSpace(s); s != "" {
			want = append(want, "."+strings.TrimPrefix(s, "."))
		}
	}
	if len(want) == 0 {
		return nil
	}
	return func(name string) bool {
		for _, s := range want {
			if strings.HasSuffix(name, s) {
				return true
			}
		}
		return false
	}
}

// List builds the tree of every object under prefix (which is "" or ends
// in "/"). Keys ending in "/" are directory markers and become directories.
// Keys whose path has an empty, "." or ".." element, or an element longer
// than a file name may be, are skipped and reported in Skipped, as is a
// file whose name a directory also uses (the directory wins).
func List(ctx context.Context, store backend.Store, prefix string, show Filter) (*Tree, error) {
	t := &Tree{Root: &Entry{Children: map[string]*Entry{}}}
	err := store.List(ctx, prefix, func(o backend.Object) error {
		rel := strings.TrimPrefix(o.Key, prefix)
		if rel == "" {
			return nil // the prefix's own marker
		}
		marker := strings.HasSuffix(rel, "/")
		elems := strings.Split(strings.TrimSuffix(rel, "/"), "/")
		if why := badPath(elems); why != "" {
			t.Skipped = append(t.Skipped, fmt.Sprintf("%q: %s", o.Key, why))
			return nil
		}
		if !marker && show != nil && !show(rel) {
			return nil
		}
		dirs := elems
		if !marker {
			dirs = elems[:len(elems)-1]
		}
		d := t.Root
		for i, name := range dirs {
			c := d.Children[name]
			if c != nil && !c.IsDir() {
				t.Skipped = append(t.Skipped, fmt.Sprintf("%q: hidden by directory %q",
					prefix+path.Join(elems[:i+1]...), path.Join(elems[:i+1]...)))
				t.Files--
				t.Bytes -= c.Obj.Size
				c = nil
			}
			if c == nil {
				c = &Entry{Name: name, Children: map[string]*Entry{}, ModTime: o.ModTime}
				d.Children[name] = c
			}
			if o.ModTime.After(c.ModTime) {
				c.ModTime = o.ModTime
			}
			d = c
		}
		if marker {
			return nil
		}
		name := elems[len(elems)-1]
		if c := d.Children[name]; c != nil {
			t.Skipped = append(t.Skipped, fmt.Sprintf("%q: hidden by directory %q", o.Key, rel))
			return nil
		}
		obj := o
		d.Children[name] = &Entry{Name: name, Obj: &obj, ModTime: o.ModTime}
		t.Files++
		t.Bytes += o.Size
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, c := range t.Root.Children {
		if c.ModTime.After(t.Root.ModTime) {
			t.Root.ModTime = c.ModTime
		}
	}
	return t, nil
}

// badPath says why a key's path elements cannot be a file system path.
func badPath(elems []string) string {
	for _, e := range elems {
		switch {
		case e == "":
			return "empty path element"
		case e == "." || e == "..":
			return "path element " + e
		case len(e) > 255:
			return "path element longer than 255 bytes"
		case strings.IndexByte(e, 0) >= 0:
			return "NUL byte in name"
		}
	}
	return ""
}

// Walk calls fn for every entry below e, parents before children, with its
// slash-separated path.
func Walk(e *Entry, fn func(p string, e *Entry)) {
	var walk func(p string, e *Entry)
	walk = func(p string, e *Entry) {
		for _, c := range e.Sorted() {
			cp := path.Join(p, c.Name)
			fn(cp, c)
			if c.IsDir() {
				walk(cp, c)
			}
		}
	}
	walk("", e)
}
