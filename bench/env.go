package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/internal/safetensors"
	"github.com/modelfs/modelfs/internal/testenv"
)

// world is a server seeded with a model, and what to tear down.
type world struct {
	dir      string
	srv      *testenv.S3Server
	s3       *target // the model on srv
	bucket   string
	prefix   string // ends in "/"
	files    []string
	size     int64 // bytes of all objects
	shards   []string
	cleanups []func()
}

// target is a store holding the model: what the bench mounts and what it
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

// newWorld starts versitygw and seeds it with a generated model of spec
// under s3://models/<name>/. With keep set, the server's files live in that
// directory and survive the run, and a model seeded there before with the
// same name and spec is reused instead of generated again.
func newWorld(name, keep string, spec safetensors.Spec) (*world, error) {
	dir := keep
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "modelfs-bench-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	w := &world{dir: dir, bucket: "models", prefix: name + "/"}
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
	if err := w.seed(spec); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *world) seed(spec safetensors.Spec) error {
	var err error
	w.srv, err = testenv.StartS3(filepath.Join(w.dir, "s3"))
	if err != nil {
		return err
	}
	w.defer_(w.srv.Stop)
	fmt.Printf("versitygw serving %s\n", w.srv.Endpoint)
	w.s3 = &target{
		uri: "s3://" + w.bucket + "/" + strings.TrimSuffix(w.prefix, "/"), endpoint: w.srv.Endpoint,
		env: w.srv.Env(), pid: w.srv.Pid(),
		open: func(conns int) (backend.Store, error) {
			return backend.NewS3(context.Background(), w.bucket, backend.Config{Endpoint: w.srv.Endpoint,
				AccessKey: testenv.AccessKey, SecretKey: testenv.SecretKey, MaxConns: conns})
		},
	}
	stamp := filepath.Join(w.dir, strings.TrimSuffix(w.prefix, "/")+".seeded")
	want, _ := json.Marshal(spec)
	if have, err := os.ReadFile(stamp); err == nil && bytes.Equal(have, want) {
		fmt.Printf("reusing the model seeded in %s\n", w.dir)
		return w.inventory(w.localDir())
	}
	start := time.Now()
	local := filepath.Join(w.dir, "model")
	defer os.RemoveAll(local)
	if _, err := safetensors.Generate(local, spec); err != nil {
		return err
	}
	ctx := context.Background()
	if err := w.srv.CreateBucket(ctx, w.bucket); err != nil && !strings.Contains(err.Error(), "BucketAlreadyOwnedByYou") {
		return err
	}
	if err := w.srv.PutDir(ctx, w.bucket, w.prefix, local); err != nil {
		return err
	}
	if err := w.inventory(local); err != nil {
		return err
	}
	fmt.Printf("seeded s3://%s/%s: %d files, %s, in %.1f s\n", w.bucket, w.prefix, len(w.files),
		mib(w.size), time.Since(start).Seconds())
	return os.WriteFile(stamp, want, 0o644)
}

// inventory records the model's files from a directory holding them.
func (w *world) inventory(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			return err
		}
		w.files = append(w.files, e.Name())
		w.size += info.Size()
		if strings.HasSuffix(e.Name(), ".safetensors") {
			w.shards = append(w.shards, e.Name())
		}
	}
	return nil
}

// localDir is where the server keeps the model's files: a local copy.
func (w *world) localDir() string { return filepath.Join(w.srv.Root, w.bucket, w.prefix) }

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
	})
	return d, nil
}

func (w *world) shardPaths(dir string) []string {
	var ps []string
	for _, s := range w.shards {
		ps = append(ps, filepath.Join(dir, s))
	}
	return ps
}

func mib(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// mounted reports whether dir is a mount point, from /proc/self/mountinfo.
func mounted(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// tosTarget starts the TOS protocol server in this process and seeds it
// with the model's files. Stop the server when done: it holds them in RAM.
func (w *world) tosTarget() (*target, func(), error) {
	srv, err := testenv.StartTOS()
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	if err := srv.CreateBucket(ctx, w.bucket); err != nil {
		srv.Stop()
		return nil, nil, err
	}
	for _, f := range w.files {
		data, err := os.ReadFile(filepath.Join(w.localDir(), f))
		if err == nil {
			err = srv.Put(ctx, w.bucket, w.prefix+f, data)
		}
		if err != nil {
			srv.Stop()
			return nil, nil, err
		}
	}
	fmt.Printf("TOS protocol server serving %s\n", srv.Endpoint)
	return &target{
		uri: "tos://" + w.bucket + "/" + strings.TrimSuffix(w.prefix, "/"), endpoint: srv.Endpoint,
		flags: []string{"--region", srv.Region},
		env:   append(os.Environ(), "TOS_ACCESS_KEY="+testenv.AccessKey, "TOS_SECRET_KEY="+testenv.SecretKey),
		pid:   os.Getpid(),
		open: func(conns int) (backend.Store, error) {
			return backend.NewTOS(ctx, w.bucket, backend.Config{Endpoint: srv.Endpoint, Region: srv.Region,
				AccessKey: testenv.AccessKey, SecretKey: testenv.SecretKey, MaxConns: conns})
		},
	}, srv.Stop, nil
}
