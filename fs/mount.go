package fs

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/prefetch"
)

// Options configure a mount.
type Options struct {
	// FsName is the mount's source in /proc/mounts (the model URI).
	FsName string
	// AllowOther lets other users (and pods) read the mount.
	AllowOther bool
	// ReadAheadKB is written to the mount's read_ahead_kb after mounting;
	// 0 leaves the kernel's default (128). FUSE can only lower it at INIT.
	ReadAheadKB int
	// MaxBackground bounds the kernel's asynchronous (readahead) requests.
	MaxBackground int
	// MaxRead is the largest read request, at most 1 MiB.
	MaxRead int
	// Timeout is how long the kernel caches entries, attributes and
	// negative lookups.
	Timeout time.Duration
	// Debug logs every FUSE request.
	Debug bool
	// MetadataTTL > 0 re-lists every source that often (Source.Relist).
	MetadataTTL time.Duration
}

// Source is a listed store prefix, as a mounted directory shows it.
type Source struct {
	Tree   *Tree
	Reader *backend.Reader // reads the source's objects
	// Relist lists the prefix again, for refreshes; nil: the tree never
	// changes.
	Relist func(context.Context) (*Tree, error)
}

// DefaultOptions are measured on the benchmark (see README): 1 MiB reads,
// 64 background requests and a 16 MiB kernel readahead keep enough reads in
// flight for the prefetcher to stay ahead.
var DefaultOptions = Options{
	ReadAheadKB:   16 << 10,
	MaxBackground: 64,
	MaxRead:       1 << 20,
	Timeout:       24 * time.Hour,
}

// Mount is a mounted tree.
type Mount struct {
	Dir    string
	server *fuse.Server
	root   *root
	ttl    time.Duration
}

// CheckMountpoint makes sure dir can be mounted on: it must be an existing
// directory. A stale FUSE mount left by a killed daemon ("transport endpoint
// is not connected") is detached first.
func CheckMountpoint(dir string) error {
	st, err := os.Stat(dir)
	if err == nil {
		// A dead FUSE mount still answers stat(2) from the kernel's
		// attribute cache; a forced-sync statx asks the file system.
		err = statSync(dir)
	}
	if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) {
		slog.Warn("detaching a stale mount left by a previous daemon", "mountpoint", dir)
		if err := unmount(dir, true); err != nil {
			return fmt.Errorf("mountpoint %s: stale mount that cannot be detached: %w", dir, err)
		}
		st, err = os.Stat(dir)
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("mountpoint %s does not exist", dir)
	case err != nil:
		return fmt.Errorf("mountpoint %s: %w", dir, err)
	case !st.IsDir():
		return fmt.Errorf("mountpoint %s is not a directory", dir)
	case liveModelfs(dir):
		// Mounting on top would hide it, and its daemon's shutdown
		// would then unmount ours.
		return fmt.Errorf("mountpoint %s is already served by a running modelfs: stop it or unmount first", dir)
	}
	return nil
}

// liveModelfs reports whether the topmost mount on dir is a modelfs mount
// (which, having passed the stale check, answers).
func liveModelfs(dir string) bool {
	ms := MountsOn(dir)
	return len(ms) > 0 && ms[len(ms)-1].FSType == "fuse.modelfs"
}

// MountTree mounts src read-only on dir, reading file contents through f.
// A nil src mounts an empty directory that models can be attached to.
func MountTree(dir string, src *Source, f *prefetch.Fetcher, o Options) (*Mount, error) {
	if err := CheckMountpoint(dir); err != nil {
		return nil, err
	}
	r := newRoot(src, f)
	timeout := o.Timeout
	root := os.Geteuid() == 0
	mo := fuse.MountOptions{
		FsName:            o.FsName,
		Name:              "modelfs",
		AllowOther:        o.AllowOther,
		MaxWrite:          o.MaxRead,
		MaxBackground:     o.MaxBackground,
		DisableXAttrs:     true,
		DirectMountStrict: root,
		DirectMountFlags:  syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV,
		Options:           []string{"default_permissions"},
		Debug:             o.Debug,
		Logger:            log.New(os.Stderr, "fuse: ", 0),
	}
	if !root {
		mo.Options = append(mo.Options, "ro")
	}
	srv, err := gofs.Mount(dir, r, &gofs.Options{
		MountOptions:    mo,
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &timeout,
	})
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", dir, err)
	}
	m := &Mount{Dir: dir, server: srv, root: r, ttl: o.MetadataTTL}
	if r.own != nil {
		m.startRefresh(r.own)
	}
	if o.ReadAheadKB > 0 {
		if err := setReadAhead(dir, o.ReadAheadKB); err != nil {
			slog.Warn("cannot raise the mount's readahead; sequential reads will be slower", "err", err)
		}
	}
	return m, nil
}

// Stats are the mount's metadata counters.
func (m *Mount) Stats() *Stats { return m.root.stats }

// Files is the fetch state of every file of the mount's own source as
// listed at mount, in path order.
func (m *Mount) Files() []*prefetch.File {
	if m.root.own == nil {
		return nil
	}
	return m.root.own.files
}

// Unmount unmounts, lazily when files are still open: the mount point is
// free at once and the kernel ends the connection when the last file
// closes (or when this process exits).
func (m *Mount) Unmount() error {
	for _, st := range m.root.subtrees() {
		st.stop()
	}
	err := unmount(m.Dir, false)
	if errors.Is(err, syscall.EBUSY) {
		err = unmount(m.Dir, true)
	}
	if errors.Is(err, syscall.EINVAL) {
		err = nil // already unmounted from outside (a preStop `umount -l`)
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", m.Dir, err)
	}
	return nil
}

// Wait waits until the kernel has ended the connection, or timeout.
// It reports whether the connection ended.
func (m *Mount) Wait(timeout time.Duration) bool {
	done := make(chan struct{})
	go func() {
		m.server.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// statSync stats dir bypassing the kernel's attribute cache, so that a
// file system that does not answer is found out.
func statSync(dir string) error {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_STATX_FORCE_SYNC, unix.STATX_TYPE, &stx)
	if err != nil && !errors.Is(err, unix.ENOSYS) {
		return &os.PathError{Op: "statx", Path: dir, Err: err}
	}
	return nil
}

// Alive checks that the mount answers, through the kernel to this process.
func (m *Mount) Alive() error { return statSync(m.Dir) }

func unmount(dir string, lazy bool) error {
	if os.Geteuid() == 0 {
		flags := 0
		if lazy {
			flags = syscall.MNT_DETACH
		}
		return syscall.Unmount(dir, flags)
	}
	// Without root only fusermount3 may unmount; it cannot tell us EBUSY
	// apart, so always detach.
	out, err := exec.Command("fusermount3", "-u", "-z", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fusermount3 -u -z: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setReadAhead writes the mount's backing-device readahead, which bounds
// how far the kernel reads ahead for read(2) and page faults alike.
func setReadAhead(dir string, kb int) error {
	p, err := readAheadPath(dir)
	if err != nil {
		return err
	}
	return os.WriteFile(p, []byte(strconv.Itoa(kb)), 0)
}

// ReadAheadKB reads back the mount's readahead (for tests and status).
func ReadAheadKB(dir string) (int, error) {
	p, err := readAheadPath(dir)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// readAheadPath is the sysfs file of the backing device of the file system
// mounted on dir.
func readAheadPath(dir string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)), nil
}
