package fs

import (
	"context"
	"errors"
	"log/slog"
	"path"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"

	"github.com/modelfs/modelfs/backend"
)

// Changes counts what a refresh did.
type Changes struct{ Added, Changed, Removed int }

// Refresh lists the mount's own source again and applies the differences
// to the mounted tree: new files and directories appear (and the kernel
// forgets that they were missing), deleted ones disappear, and a file whose
// object has a new version becomes a new inode under the same name, which
// opens from now on get. Handles opened before keep the old inode: they
// read the old bytes the kernel still caches and get ESTALE for the rest.
func (m *Mount) Refresh(ctx context.Context) (Changes, error) {
	if m.root.own == nil {
		return Changes{}, errors.New("this mount has no source of its own")
	}
	return m.root.refresh(ctx, m.root.own)
}

func (r *root) refresh(ctx context.Context, st *subtree) (Changes, error) {
	if st.src.Relist == nil {
		return Changes{}, errors.New("this source cannot be listed again")
	}
	t, err := st.src.Relist(ctx)
	if err != nil {
		return Changes{}, err
	}
	return r.apply(ctx, st, t), nil
}

// startRefresh starts st's re-list loop (when the mount has a TTL); st.stop
// ends it and waits for a re-list under way to finish, so that nothing
// changes st's inodes afterwards.
func (m *Mount) startRefresh(st *subtree) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	st.stop = func() { cancel(); <-done }
	if m.ttl <= 0 || st.src.Relist == nil {
		close(done)
		return
	}
	go func() {
		defer close(done)
		t := time.NewTicker(m.ttl)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			c, err := m.root.refresh(ctx, st)
			switch {
			case err != nil && ctx.Err() == nil:
				slog.Warn("re-listing failed; keeping the tree as it was", "err", err)
			case c != Changes{}:
				slog.Info("re-listed", "added", c.Added, "changed", c.Changed, "removed", c.Removed)
			}
		}
	}()
}

// apply makes st's inodes match t.
func (r *root) apply(ctx context.Context, st *subtree, t *Tree) Changes {
	var c Changes
	var walk func(p *gofs.Inode, e *Entry, dirPath string)
	walk = func(p *gofs.Inode, e *Entry, dirPath string) {
		for name, want := range e.Children {
			childPath := path.Join(dirPath, name)
			have := p.GetChild(name)
			if have != nil && isAttached(have) {
				continue // an attached model keeps its name
			}
			if have != nil {
				if _, isDir := have.Operations().(*dir); isDir != want.IsDir() {
					r.remove(p, name, have)
					c.Removed++
					have = nil
				}
			}
			switch {
			case have == nil && want.IsDir():
				walk(r.newDir(ctx, p, want), want, childPath)
				p.NotifyEntry(name) // the kernel may hold a negative entry
				c.Added++
			case have == nil:
				r.newFile(ctx, p, name, r.fetcher.File(childPath, *want.Obj, st.src.Reader), false)
				p.NotifyEntry(name)
				c.Added++
			case want.IsDir():
				walk(have, want, childPath)
			default:
				old := have.Operations().(*file).f
				if !sameVersion(old.Obj, *want.Obj) {
					// A new inode: the old one keeps its pages for the
					// handles open on it, and new lookups find this one.
					r.newFile(ctx, p, name, r.fetcher.File(childPath, *want.Obj, st.src.Reader), true)
					p.NotifyEntry(name)
					r.fetcher.Forget(old)
					c.Changed++
				}
			}
		}
		for name, have := range p.Children() {
			if isAttached(have) {
				continue // an attached model, not part of this source
			}
			if _, ok := e.Children[name]; !ok {
				r.remove(p, name, have)
				c.Removed++
			}
		}
	}
	walk(st.top, t.Root, "")
	st.tree.Store(t)
	return c
}

// remove takes a file or directory out of the tree and drops the cached
// chunks of every file below it. Handles open on them read what the kernel
// still caches and get ESTALE for the rest.
func (r *root) remove(p *gofs.Inode, name string, ch *gofs.Inode) {
	p.RmChild(name)
	p.NotifyEntry(name)
	r.forget(ch)
}

// forget drops the cached chunks of every file at or below in.
func (r *root) forget(in *gofs.Inode) {
	if n, ok := in.Operations().(*file); ok {
		r.fetcher.Forget(n.f)
		return
	}
	for _, c := range in.Children() {
		r.forget(c)
	}
}

func isAttached(in *gofs.Inode) bool {
	d, ok := in.Operations().(*dir)
	return ok && d.attached
}

// sameVersion reports whether two listings of an object name the same
// bytes. The ETag does where the store gives one: a copy in place that
// only changes metadata moves LastModified and keeps the ETag, and must not
// cost the page cache and the prefetched chunks of an unchanged file.
func sameVersion(a, b backend.Object) bool {
	if a.Key != b.Key || a.Size != b.Size || a.ETag != b.ETag {
		return false
	}
	return a.ETag != "" || a.ModTime.Equal(b.ModTime)
}
