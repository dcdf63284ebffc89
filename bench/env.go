package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/fs"
	"github.com/modelfs/modelfs/internal/safetensors"
	"github.com/modelfs/modelfs/internal/testenv"
)

// world is a versitygw server holding generated models, and what to tear
// down.
type world struct {
	dir      string
	srv      *testenv.S3Server
	bucket   string
	cleanups []func()
}

// model is a generated safetensors model seeded on the world's server.
type model struct {
	spec   safetensors.Spec
	prefix string // ends in "/"
	files  []string
	size   int64 // bytes of all objects
	shards []string
	bytes  int64   // bytes of the shards: what a load reads
	s3     *target // the model on the world's server
	local  string  // the server's directory holding the model: a local copy
}

// target is a store holding a model: what the bench mounts and what it
// reads directly for the ceiling.
type target struct {
	uri      string   // of the model
	endpoint string   // for --endpoint
	flags    []string // further mount flags the store needs
	env      []string // credentials for the daemon
	open     func(conns int) (backend.Store, error)
	// pid is the server process, whose CPU time and written bytes the
	// bench reads (this process for an in-process server).
	pid int
}

// newWorld starts versitygw. With keep set, the server's files live in
// that directory and survive the run, and models seeded there before are
// reused instead of generated again.
func newWorld(keep string) (*world, error) {
	dir := keep
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "modelfs-bench-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	} else if dir, err = filepath.Abs(dir); err != nil { // mount points are matched against mountinfo
		return nil, err
	}
	w := &world{dir: dir, bucket: "models"}
	if keep == "" {
		w.defer_(func() { os.RemoveAll(dir) })
	}
	// Tear down on Ctrl-C too: a mount or server left behind would outlive us.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		w.close()
		os.Exit(130)
	}()
	var err error
	if w.srv, err = testenv.StartS3(filepath.Join(w.dir, "s3")); err != nil {
		w.close()
		return nil, err
	}
	w.defer_(w.srv.Stop)
	fmt.Printf("versitygw serving %s\n", w.srv.Endpoint)
	if err := w.srv.CreateBucket(context.Background(), w.bucket); err != nil && !strings.Contains(err.Error(), "BucketAlreadyOwnedByYou") {
		w.close()
		return nil, err
	}
	return w, nil
}

// modelName names a model by its spec, so that a kept directory can hold
// several.
func modelName(spec safetensors.Spec) string {
	return fmt.Sprintf("bench-%dm-%ds-mixed-%v", spec.Bytes>>20, spec.Shards, spec.Mixed)
}

// model seeds the server with a generated model of spec under
// s3://models/<name>/, or reuses one a kept directory already holds.
func (w *world) model(name string, spec safetensors.Spec) (*model, error) {
	m := &model{spec: spec, prefix: name + "/"}
	m.local = filepath.Join(w.srv.Root, w.bucket, m.prefix)
	m.s3 = &target{
		uri: "s3://" + w.bucket + "/" + name, endpoint: w.srv.Endpoint,
		env: w.srv.Env(), pid: w.srv.Pid(),
		open: func(conns int) (backend.Store, error) {
			return backend.NewS3(context.Background(), w.bucket, backend.Config{Endpoint: w.srv.Endpoint,
				AccessKey: testenv.AccessKey, SecretKey: testenv.SecretKey, MaxConns: conns})
		},
	}
	stamp := filepath.Join(w.dir, name+".seeded")
	want, _ := json.Marshal(spec)
	if have, err := os.ReadFile(stamp); err == nil && bytes.Equal(have, want) {
		fmt.Printf("reusing %s seeded in %s\n", name, w.dir)
		return m, m.inventory(m.local)
	}
	// Seeding PUTs each file whole: S3 takes at most 5 GiB in one PUT.
	if spec.Bytes/int64(max(spec.Shards, 1)) > 5<<30-64<<20 {
		return nil, fmt.Errorf("%w: %s: shards over 5 GiB cannot be seeded with one PUT each", errSkip, name)
	}
	// Generating needs room for the generated copy and the server's.
	if free := freeBytes(w.dir); free < 2*spec.Bytes+(1<<30) {
		return nil, fmt.Errorf("%w: seeding %s needs %s free in %s, %s is", errSkip, name, mib(2*spec.Bytes+(1<<30)), w.dir, mib(free))
	}
	start := time.Now()
	gen := filepath.Join(w.dir, "generated-"+name)
	defer os.RemoveAll(gen)
	if _, err := safetensors.Generate(gen, spec); err != nil {
		return nil, err
	}
	if err := w.srv.PutDir(context.Background(), w.bucket, m.prefix, gen); err != nil {
		return nil, err
	}
	if err := m.inventory(gen); err != nil {
		return nil, err
	}
	fmt.Printf("seeded s3://%s/%s: %d files, %s, in %.1f s\n", w.bucket, m.prefix, len(m.files),
		mib(m.size), time.Since(start).Seconds())
	return m, os.WriteFile(stamp, want, 0o644)
}

// inventory records the model's files from a directory holding them.
func (m *model) inventory(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			return err
		}
		m.files = append(m.files, e.Name())
		m.size += info.Size()
		if strings.HasSuffix(e.Name(), ".safetensors") {
			m.shards = append(m.shards, e.Name())
			m.bytes += info.Size()
		}
	}
	return nil
}

// shardPaths are the model's shards under dir.
func (m *model) shardPaths(dir string) []string {
	var ps []string
	for _, s := range m.shards {
		ps = append(ps, filepath.Join(dir, s))
	}
	return ps
}

// warmServer puts the server's copy of m in the page cache, so that rows
// measure the path to the server, not the server's disk. The cache is
// filled the way a mount's is, by reading: pages the server wrote when the
// model was seeded come in larger folios than reads create, and would make
// the local baseline depend on how the bench seeded it.
func (m *model) warmServer() error {
	local := m.shardPaths(m.local)
	if err := testenv.Evict(local...); err != nil {
		return err
	}
	_, err := runLoader(false, local)
	return err
}

// pagedCopy writes a second local copy of m's shards under dir in 4 KiB
// writes, which leave it in the page cache as single 4 KiB pages, the way
// a FUSE mount holds a file on this kernel: the like-for-like baseline
// for a warm reload. It returns the copy's paths, or none where dir lacks
// the room.
func (m *model) pagedCopy(dir string) ([]string, error) {
	if freeBytes(dir) < m.bytes+1<<30 {
		return nil, nil
	}
	var paths []string
	for _, src := range m.shardPaths(m.local) {
		dst := filepath.Join(dir, filepath.Base(src))
		if err := copyInPages(dst, src); err != nil {
			return nil, err
		}
		paths = append(paths, dst)
	}
	return paths, nil
}

func copyInPages(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	// Through plain Reader and Writer, so that os.File's ReadFrom (an
	// in-kernel copy) cannot take over: every write is one 4 KiB read.
	if _, err := io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{in}, make([]byte, 4096)); err != nil {
		out.Close()
		return err
	}
	// Written back now, so that no loads measured later share the machine
	// with the writeback; the pages stay cached.
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func (w *world) defer_(f func()) { w.cleanups = append(w.cleanups, f) }

// close runs the cleanups, newest first.
func (w *world) close() {
	for i := len(w.cleanups) - 1; i >= 0; i-- {
		w.cleanups[i]()
	}
	w.cleanups = nil
}

// mount starts a modelfs daemon serving t on a new mountpoint with extra
// flags.
func (w *world) mount(t *target, extra ...string) (*testenv.Daemon, error) {
	mnt, err := os.MkdirTemp(w.dir, "mnt-")
	if err != nil {
		return nil, err
	}
	args := append(append([]string{"--endpoint", t.endpoint}, t.flags...), extra...)
	args = append(args, t.uri, mnt)
	d, err := testenv.StartDaemon(t.env, time.Minute, args...)
	if err != nil {
		return nil, err
	}
	w.defer_(func() {
		if d.Stop(10*time.Second) != nil {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
		os.Remove(mnt)
	})
	return d, nil
}

func mib(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// freeBytes is the room left for an unprivileged writer on dir's file system.
func freeBytes(dir string) int64 {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0
	}
	return int64(st.Bavail) * st.Bsize
}

// mounted reports whether dir is a mount point, from /proc/self/mountinfo.
func mounted(dir string) bool { return len(fs.MountsOn(dir)) > 0 }

// tosTarget starts the TOS protocol server in this process and seeds it
// with m's files. Stop the server when done: it holds them in RAM.
func (w *world) tosTarget(m *model) (*target, func(), error) {
	srv, err := testenv.StartTOS()
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	if err := srv.CreateBucket(ctx, w.bucket); err != nil {
		srv.Stop()
		return nil, nil, err
	}
	for _, f := range m.files {
		data, err := os.ReadFile(filepath.Join(m.local, f))
		if err == nil {
			err = srv.Put(ctx, w.bucket, m.prefix+f, data)
		}
		if err != nil {
			srv.Stop()
			return nil, nil, err
		}
	}
	fmt.Printf("TOS protocol server serving %s\n", srv.Endpoint)
	return &target{
		uri: "tos://" + w.bucket + "/" + strings.TrimSuffix(m.prefix, "/"), endpoint: srv.Endpoint,
		flags: []string{"--region", srv.Region},
		env:   append(os.Environ(), "TOS_ACCESS_KEY="+testenv.AccessKey, "TOS_SECRET_KEY="+testenv.SecretKey),
		pid:   os.Getpid(),
		open: func(conns int) (backend.Store, error) {
			return backend.NewTOS(ctx, w.bucket, backend.Config{Endpoint: srv.Endpoint, Region: srv.Region,
				AccessKey: testenv.AccessKey, SecretKey: testenv.SecretKey, MaxConns: conns})
		},
	}, srv.Stop, nil
}
