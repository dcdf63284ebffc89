package fs_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/cache"
	"github.com/modelfs/modelfs/fs"
	"github.com/modelfs/modelfs/internal/testenv"
	"github.com/modelfs/modelfs/prefetch"
)

// srv is the versitygw every test in this package talks to; each test uses
// buckets of its own.
var srv *testenv.S3Server

func TestMain(m *testing.M) {
	testenv.ServeLoader()
	os.Exit(testenv.MainWithS3("fs", func(s *testenv.S3Server, _ string) error {
		srv = s
		return nil
	}, m.Run))
}

var buckets atomic.Int64

// newBucket creates a bucket of the test's own.
func newBucket(t *testing.T) string {
	t.Helper()
	b := fmt.Sprintf("fs-test-%d", buckets.Add(1))
	if err := srv.CreateBucket(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return b
}

func put(t *testing.T, bucket, key string, data []byte) {
	t.Helper()
	if err := srv.Put(context.Background(), bucket, key, data); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func store(t *testing.T, bucket string) backend.Store {
	t.Helper()
	st, err := backend.NewS3(context.Background(), bucket, backend.Config{
		Endpoint: srv.Endpoint, AccessKey: testenv.AccessKey, SecretKey: testenv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// mounted is a mount under test with its parts.
type mounted struct {
	dir     string
	m       *fs.Mount
	fetcher *prefetch.Fetcher
	cache   *cache.Cache
	reader  *backend.Reader
	tree    *fs.Tree
}

// small chunks and a small budget make every test cross chunk boundaries
// and fill the window.
const testChunk = 64 << 10

type mountOpts struct {
	filter fs.Filter
	budget int64
	fetch  prefetch.Config
}

func mountBucket(t *testing.T, bucket, prefix string, o mountOpts) *mounted {
	t.Helper()
	ctx := context.Background()
	st := store(t, bucket)
	tree, err := fs.List(ctx, st, prefix, o.filter)
	if err != nil {
		t.Fatal(err)
	}
	if o.budget == 0 {
		o.budget = 64 * testChunk
	}
	if o.fetch.Concurrency == 0 {
		o.fetch = prefetch.Config{Concurrency: 8, PartSize: 4 * testChunk}
	}
	c, err := cache.New(cache.Config{Budget: o.budget, ChunkSize: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	r := backend.NewReader(st, backend.DefaultPolicy)
	f := prefetch.New(c, r.Stats, o.fetch)
	dir := t.TempDir()
	src := &fs.Source{Tree: tree, Reader: r,
		Relist: func(ctx context.Context) (*fs.Tree, error) { return fs.List(ctx, st, prefix, o.filter) }}
	m, err := fs.MountTree(dir, src, f, fs.DefaultOptions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
		if !m.Wait(10 * time.Second) {
			t.Errorf("server did not stop after unmount")
		}
		f.Close()
		c.Close()
	})
	return &mounted{dir: dir, m: m, fetcher: f, cache: c, reader: r, tree: tree}
}

// loadInChild loads safetensors files from another process with
// verification and returns the tensor bytes it copied.
func loadInChild(t *testing.T, files ...string) int64 {
	t.Helper()
	out, err := testenv.Loader(files...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("loader: %v: %s", err, stderr)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatalf("loader output %q: %v", out, err)
	}
	return n
}

func deleteInput(bucket, key string) *s3.DeleteObjectInput {
	return &s3.DeleteObjectInput{Bucket: &bucket, Key: &key}
}
