package fs

import (
	"context"
	"fmt"
	"strings"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/modelfs/modelfs/prefetch"
)

// Attach shows src as the directory name at the top of the mount, without
// remounting, and returns the fetch state of its files (for warming it).
func (m *Mount) Attach(name string, src *Source) ([]*prefetch.File, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	r := m.root
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.models[name]; ok || r.GetChild(name) != nil {
		return nil, fmt.Errorf("%q already exists in the mount", name)
	}
	st := &subtree{src: src, files: r.files(src)}
	st.tree.Store(src.Tree)
	d := &dir{mtime: src.Tree.Root.ModTime, stats: r.stats, attached: true}
	ctx := context.Background()
	st.top = r.NewPersistentInode(ctx, d, gofs.StableAttr{Mode: fuse.S_IFDIR})
	r.build(ctx, st)
	if !r.AddChild(name, st.top, false) { // a re-list of the mount's own source added it meanwhile
		return nil, fmt.Errorf("%q already exists in the mount", name)
	}
	r.NotifyEntry(name) // the kernel may have cached that name as missing
	r.models[name] = st
	m.startRefresh(st)
	return st.files, nil
}

// Detach removes the attached model name and drops its cached chunks.
// Files still open read what the kernel caches; the rest fails.
func (m *Mount) Detach(name string) error {
	r := m.root
	r.mu.Lock()
	st, ok := r.models[name]
	delete(r.models, name)
	r.mu.Unlock()
	if !ok {
		return fmt.Errorf("no model %q is attached", name)
	}
	st.stop()
	r.remove(&r.Inode, name, st.top)
	return nil
}

// ValidName accepts a name for an attached model: a single path element.
func ValidName(name string) error {
	if why := badPath([]string{name}); why != "" || strings.Contains(name, "/") {
		if why == "" {
			why = "contains '/'"
		}
		return fmt.Errorf("model name %q: %s", name, why)
	}
	return nil
}
