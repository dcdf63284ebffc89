// Package fs presents a listed bucket prefix as a read-only FUSE file
// system (go-fuse v2). The tree is listed once, before mounting, and built
// into persistent inodes; file contents come from a prefetch.Fetcher, whose
// chunk buffers go to the kernel without a copy: a reply holds references
// on its chunks until go-fuse has written it (see reply).
//
// The kernel caches everything it is told: entries, attributes and negative
// lookups live for Options.Timeout and open files keep their page cache
// (FOPEN_KEEP_CACHE), so a second load never reaches this process.
//
// Each file inode is one object version. A re-list (Mount.Refresh) that
// finds a new version puts a new inode under the name, so the kernel's
// cached pages never mix versions: handles opened before the change keep
// the old inode, read what it still caches and get ESTALE for the rest
// (the store refuses the old ETag).
package fs

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/prefetch"
)

// blockSize is the st_blksize files report: tools like cat and cp size
// their reads by it, and 1 MiB matches the largest FUSE read.
const blockSize = 1 << 20

type root struct {
	dir
	fetcher *prefetch.Fetcher
	own     *subtree // the mount's own source; nil for a mount that only holds attached models

	mu     sync.Mutex
	models map[string]*subtree // attached by name, each a directory under the root
}

// subtree is one source as the mount shows it: its tree, listed last, and
// the fetch state of its files as listed at mount or attach time.
type subtree struct {
	src   *Source
	top   *gofs.Inode
	tree  atomic.Pointer[Tree]
	files []*prefetch.File // in Walk order
	stop  context.CancelFunc
}

// Stats counts metadata operations that reached this process; the kernel
// answers repeats from its caches.
type Stats struct {
	Lookups         atomic.Int64
	NegativeLookups atomic.Int64 // lookups of names that do not exist
	Reads           atomic.Int64 // read requests answered with data
	ReadBytes       atomic.Int64 // bytes in those answers, counted before they are sent
}

type dir struct {
	gofs.Inode
	mtime time.Time
	stats *Stats
	// attached marks the top directory of an attached model: refreshes of
	// the mount's own source leave it alone.
	attached bool
}

// file is one object version: a file whose object changes is replaced by
// a new inode (see Mount.Refresh), so an inode's attributes and bytes never
// change and neither do the pages the kernel caches for it.
type file struct {
	gofs.Inode
	f       *prefetch.File
	fetcher *prefetch.Fetcher
	stats   *Stats
}

var (
	_ = (gofs.NodeOnAdder)((*root)(nil))
	_ = (gofs.NodeStatfser)((*root)(nil))
	_ = (gofs.NodeGetattrer)((*dir)(nil))
	_ = (gofs.NodeLookuper)((*dir)(nil))
	_ = (gofs.NodeGetattrer)((*file)(nil))
	_ = (gofs.NodeOpener)((*file)(nil))
	_ = (gofs.NodeReader)((*file)(nil))
)

func newRoot(src *Source, f *prefetch.Fetcher) *root {
	r := &root{fetcher: f, models: map[string]*subtree{}}
	r.stats = new(Stats)
	r.mtime = time.Now()
	if src != nil {
		r.own = &subtree{src: src, files: r.files(src)}
		r.own.tree.Store(src.Tree)
		r.mtime = src.Tree.Root.ModTime
	}
	return r
}

// files makes the fetch state of every file of src, in Walk order.
func (r *root) files(src *Source) []*prefetch.File {
	var fs []*prefetch.File
	Walk(src.Tree.Root, func(p string, e *Entry) {
		if !e.IsDir() {
			fs = append(fs, r.fetcher.File(p, *e.Obj, src.Reader))
		}
	})
	return fs
}

// OnAdd builds the mount's own tree as persistent inodes.
func (r *root) OnAdd(ctx context.Context) {
	if r.own != nil {
		r.own.top = &r.Inode
		r.build(ctx, r.own)
	}
}

// build adds the inodes of st's tree under st.top.
func (r *root) build(ctx context.Context, st *subtree) {
	i := 0
	var add func(p *gofs.Inode, e *Entry)
	add = func(p *gofs.Inode, e *Entry) {
		for _, c := range e.Sorted() {
			if c.IsDir() {
				add(r.newDir(ctx, p, c), c)
				continue
			}
			r.newFile(ctx, p, c.Name, st.files[i], false)
			i++
		}
	}
	add(st.top, st.tree.Load().Root)
}

func (r *root) newDir(ctx context.Context, parent *gofs.Inode, e *Entry) *gofs.Inode {
	d := &dir{mtime: e.ModTime, stats: r.stats}
	ch := parent.NewPersistentInode(ctx, d, gofs.StableAttr{Mode: fuse.S_IFDIR})
	parent.AddChild(e.Name, ch, false)
	return ch
}

// newFile adds (or, with replace, swaps in) the inode of one object
// version.
func (r *root) newFile(ctx context.Context, parent *gofs.Inode, name string, f *prefetch.File, replace bool) {
	n := &file{f: f, fetcher: r.fetcher, stats: r.stats}
	parent.AddChild(name, parent.NewPersistentInode(ctx, n, gofs.StableAttr{Mode: fuse.S_IFREG}), replace)
}

func (r *root) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	out.Bsize = blockSize
	out.Frsize = blockSize
	var bytes int64
	var files int
	for _, st := range r.subtrees() {
		t := st.tree.Load()
		bytes += t.Bytes
		files += t.Files
	}
	out.Blocks = uint64((bytes + blockSize - 1) / blockSize)
	out.Files = uint64(files)
	out.NameLen = 255
	return 0
}

// subtrees are the mount's own source and the attached models.
func (r *root) subtrees() []*subtree {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*subtree
	if r.own != nil {
		out = append(out, r.own)
	}
	for _, st := range r.models {
		out = append(out, st)
	}
	return out
}

// Lookup answers from the tree built at mount. A miss is answered with
// ENOENT, which the kernel caches for the negative timeout.
func (d *dir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	d.stats.Lookups.Add(1)
	ch := d.GetChild(name)
	if ch == nil {
		d.stats.NegativeLookups.Add(1)
		return nil, syscall.ENOENT
	}
	var a fuse.AttrOut
	if ga, ok := ch.Operations().(gofs.NodeGetattrer); ok && ga.Getattr(ctx, nil, &a) == 0 {
		out.Attr = a.Attr
	}
	return ch, 0
}

func (d *dir) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFDIR | 0o555
	out.Nlink = 2
	setTimes(&out.Attr, d.mtime)
	return 0
}

func (n *file) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	obj := n.f.Obj
	out.Mode = fuse.S_IFREG | 0o444
	out.Nlink = 1
	out.Size = uint64(obj.Size)
	out.Blocks = (out.Size + 511) / 512
	out.Blksize = blockSize
	setTimes(&out.Attr, obj.ModTime)
	return 0
}

func setTimes(a *fuse.Attr, t time.Time) {
	if t.IsZero() {
		return
	}
	s, ns := uint64(t.Unix()), uint32(t.Nanosecond())
	a.Mtime, a.Atime, a.Ctime = s, s, s
	a.Mtimensec, a.Atimensec, a.Ctimensec = ns, ns, ns
}

// Open keeps the kernel's page cache across opens: an inode's bytes never
// change (a new object version gets a new inode).
func (n *file) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC|syscall.O_APPEND) != 0 {
		return nil, 0, syscall.EROFS
	}
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

func (n *file) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f := n.f
	spans, err := n.fetcher.Read(ctx, f, off, len(dest))
	if err != nil {
		e := errno(ctx, err)
		if e != syscall.EINTR {
			slog.Warn("read failed", "file", f.Name, "offset", off, "size", len(dest), "errno", e.Error(), "err", err)
		}
		return nil, e
	}
	r := &reply{fetcher: n.fetcher, f: f, spans: spans}
	size := r.Size()
	if size == 0 {
		// go-fuse never calls Done on an empty reply.
		r.Done()
		return fuse.ReadResultData(nil), 0
	}
	n.stats.Reads.Add(1)
	n.stats.ReadBytes.Add(int64(size))
	return r, 0
}

// reply answers a read straight from chunk buffers. go-fuse writes the
// slices with writev after Read returns and then calls Done, which is when
// the chunks may be released: until then the kernel has not copied them.
type reply struct {
	fetcher *prefetch.Fetcher
	f       *prefetch.File
	spans   []prefetch.Span
}

func (r *reply) Size() int {
	n := 0
	for _, s := range r.spans {
		n += s.To - s.From
	}
	return n
}

// Slices lets go-fuse write the chunk slices without copying them.
func (r *reply) Slices() ([][]byte, fuse.Status) {
	v := make([][]byte, len(r.spans))
	for i, s := range r.spans {
		v[i] = s.Bytes()
	}
	return v, fuse.OK
}

// Bytes is the fallback when go-fuse cannot write slices.
func (r *reply) Bytes(buf []byte) ([]byte, fuse.Status) {
	buf = buf[:0]
	for _, s := range r.spans {
		buf = append(buf, s.Bytes()...)
	}
	return buf, fuse.OK
}

func (r *reply) Done() {
	r.fetcher.Delivered(r.f, r.spans)
	r.spans = nil
}

// errno maps a read error to the status a reader sees, in one place: an
// object replaced or deleted since it was listed is stale, a read the
// kernel interrupted (its request context is done) is EINTR, and
// everything else is an I/O error. Store timeouts match
// context.DeadlineExceeded too, so only the request's own context decides
// EINTR: readers retry EINTR at once, and a store that keeps timing out
// would have them retry for ever.
func errno(ctx context.Context, err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, backend.ErrPrecondition), errors.Is(err, backend.ErrNotExist):
		return syscall.ESTALE
	case ctx.Err() != nil:
		return syscall.EINTR
	}
	return syscall.EIO
}
