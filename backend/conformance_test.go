package backend_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/internal/testenv"
)

// The conformance suite: every Store must behave the same against a real
// server of its protocol (S3 on versitygw, TOS on testenv's TOS server).
// Everything above the backend package relies on exactly this behaviour.

const conformanceBucket = "conformance"

// storeServer is one server of one protocol, seeded through its own API.
type storeServer struct {
	scheme       string
	endpoint     string
	createBucket func(ctx context.Context, bucket string) error
	put          func(ctx context.Context, bucket, key string, data []byte) error
}

func (s storeServer) config() backend.Config {
	return backend.Config{
		Endpoint:  s.endpoint,
		Region:    testenv.Region,
		AccessKey: testenv.AccessKey,
		SecretKey: testenv.SecretKey,
		MaxConns:  16,
	}
}

func (s storeServer) open(t *testing.T, bucket string, cfg backend.Config) backend.Store {
	t.Helper()
	st, err := backend.Open(t.Context(), backend.Location{Scheme: s.scheme, Bucket: bucket}, cfg)
	if err != nil {
		t.Fatalf("open %s store: %v", s.scheme, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func startS3(t *testing.T) storeServer {
	if _, err := testenv.VersitygwPath(); err != nil {
		t.Skipf("S3 conformance needs versitygw: %v", err)
	}
	srv, err := testenv.StartS3(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return storeServer{scheme: "s3", endpoint: srv.Endpoint, createBucket: srv.CreateBucket, put: srv.Put}
}

func startTOS(t *testing.T) (storeServer, *testenv.TOSServer) {
	srv, err := testenv.StartTOS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return storeServer{scheme: "tos", endpoint: srv.Endpoint, createBucket: srv.CreateBucket, put: srv.Put}, srv
}

func TestConformance(t *testing.T) {
	t.Run("s3", func(t *testing.T) {
		t.Parallel()
		runConformance(t, startS3(t))
	})
	t.Run("tos", func(t *testing.T) {
		t.Parallel()
		srv, _ := startTOS(t)
		runConformance(t, srv)
	})
}

// randBytes is deterministic content of n bytes.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// blobSize is odd on purpose: no range lines up with a power of two.
const blobSize = 256<<10 + 7

// fixture is what every store is seeded with.
func fixture() map[string][]byte {
	f := map[string][]byte{
		"data/blob.bin":  randBytes(1, blobSize),
		"data/empty":     {},
		"data/small.txt": []byte("hello, modelfs\n"),
		// Names that need escaping in a path, a query or a signature.
		"odd/with space.txt":             []byte("space"),
		"odd/ünïcödé 模型/weights.bin":     []byte("unicode"),
		"odd/plus+sign":                  []byte("plus"),
		"odd/per%cent":                   []byte("percent"),
		"odd/per%20cent":                 []byte("percent-escaped-looking"),
		"odd/question?mark":              []byte("question"),
		"odd/hash#tag":                   []byte("hash"),
		"odd/amp&eq=semi;colon":          []byte("amp"),
		"odd/tilde~star*(paren)!'quote'": []byte("tilde"),
		"odd/colon:at@dollar$comma,":     []byte("colon"),
		"odd/empty file":                 {},
		// Directory markers, explicit and beside real children.
		"tree/":            {},
		"tree/sub/":        {},
		"tree/sub/file":    []byte("file in tree"),
		"tree/empty-dir/":  {},
		"tree/sub/z-last/": {},
	}
	for i := range 1100 { // more than one listing page of 1000
		f[fmt.Sprintf("many/k%05d", i)] = []byte{byte(i)}
	}
	return f
}

func seed(t *testing.T, srv storeServer, files map[string][]byte) {
	t.Helper()
	ctx := t.Context()
	if err := srv.createBucket(ctx, conformanceBucket); err != nil {
		t.Fatalf("create bucket: %v", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for k, v := range files {
		g.Go(func() error {
			if err := srv.put(gctx, conformanceBucket, k, v); err != nil {
				return fmt.Errorf("put %q: %w", k, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

func list(t *testing.T, st backend.Store, prefix string) []backend.Object {
	t.Helper()
	var objs []backend.Object
	if err := st.List(t.Context(), prefix, func(o backend.Object) error {
		objs = append(objs, o)
		return nil
	}); err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	return objs
}

func keysOf(objs []backend.Object) []string {
	keys := make([]string, len(objs))
	for i, o := range objs {
		keys[i] = o.Key
	}
	return keys
}

func keysWithPrefix(files map[string][]byte, prefix string) []string {
	var keys []string
	for k := range files {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // byte order, what S3 and TOS promise
	return keys
}

func readAll(t *testing.T, st backend.Store, key, etag string, off, n int64) []byte {
	t.Helper()
	body, err := st.Open(t.Context(), key, etag, off, n)
	if err != nil {
		t.Fatalf("Open(%q, %d, %d): %v", key, off, n, err)
	}
	defer body.Close()
	got, err := io.ReadAll(body)
	if err != nil {
		t.Fatalf("read Open(%q, %d, %d): %v", key, off, n, err)
	}
	return got
}

func wantKind(t *testing.T, what string, err error, kinds ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %v", what, kinds)
	}
	for _, k := range kinds {
		if errors.Is(err, k) {
			if !backend.Permanent(err) {
				t.Errorf("%s: %v is not Permanent", what, err)
			}
			return
		}
	}
	t.Fatalf("%s: error %q, want one of %v", what, err, kinds)
}

func runConformance(t *testing.T, srv storeServer) {
	start := time.Now()
	files := fixture()
	seed(t, srv, files)
	st := srv.open(t, conformanceBucket, srv.config())
	blob := files["data/blob.bin"]

	listed := map[string]backend.Object{}
	t.Run("ListAll", func(t *testing.T) {
		objs := list(t, st, "")
		if got, want := keysOf(objs), keysWithPrefix(files, ""); !slices.Equal(got, want) {
			t.Fatalf("List(\"\") gave %d keys, want %d\ngot  %q\nwant %q", len(got), len(want), head(got), head(want))
		}
		for _, o := range objs {
			listed[o.Key] = o
			if o.Size != int64(len(files[o.Key])) {
				t.Errorf("%q: listed size %d, want %d", o.Key, o.Size, len(files[o.Key]))
			}
			if o.ETag == "" {
				t.Errorf("%q: listed without an ETag", o.Key)
			}
			if o.ModTime.Before(start.Add(-time.Minute)) || o.ModTime.After(time.Now().Add(time.Minute)) {
				t.Errorf("%q: listed ModTime %v, want about %v", o.Key, o.ModTime, start)
			}
		}
	})

	t.Run("ListPrefix", func(t *testing.T) {
		for _, prefix := range []string{
			"odd/", "odd", "tree/", "tree/sub/", "tree/e", "many/", "many/k0099", "many/k01099",
			"data/blob.bin", "odd/ünïcödé 模型/", "odd/per%", "odd/question?", "odd/hash#",
			"nothing/", "zzz", "data/blob.bin/",
		} {
			if got, want := keysOf(list(t, st, prefix)), keysWithPrefix(files, prefix); !slices.Equal(got, want) {
				t.Errorf("List(%q) = %q, want %q", prefix, head(got), head(want))
			}
		}
	})

	t.Run("ListStops", func(t *testing.T) {
		errStop := errors.New("stop")
		calls := 0
		err := st.List(t.Context(), "many/", func(backend.Object) error {
			calls++
			if calls == 3 {
				return errStop
			}
			return nil
		})
		if !errors.Is(err, errStop) || calls != 3 {
			t.Fatalf("List stopped by fn: err %v after %d calls, want errStop after 3", err, calls)
		}
	})

	t.Run("Stat", func(t *testing.T) {
		for _, k := range keysWithPrefix(files, "") {
			if strings.HasPrefix(k, "many/") && k != "many/k00000" && k != "many/k01099" {
				continue
			}
			o, err := st.Stat(t.Context(), k)
			if err != nil {
				t.Errorf("Stat(%q): %v", k, err)
				continue
			}
			l := listed[k]
			if o.Key != k || o.Size != int64(len(files[k])) || o.ETag != l.ETag {
				t.Errorf("Stat(%q) = %+v, want size %d and the listed ETag %s", k, o, len(files[k]), l.ETag)
			}
			if !o.ModTime.Truncate(time.Second).Equal(l.ModTime.Truncate(time.Second)) {
				t.Errorf("Stat(%q) ModTime %v, listed %v", k, o.ModTime, l.ModTime)
			}
		}
	})

	t.Run("OpenRanges", func(t *testing.T) {
		n := int64(len(blob))
		etag := listed["data/blob.bin"].ETag
		for _, c := range []struct {
			name   string
			off, n int64
		}{
			{"first byte", 0, 1},
			{"second byte", 1, 1},
			{"last byte", n - 1, 1},
			{"whole object", 0, n},
			{"all but the first byte", 1, n - 1},
			{"all but the last byte", 0, n - 1},
			{"inside, touching neither end", 1, n - 2},
			{"last two bytes", n - 2, 2},
			{"one page in the middle", n / 2, 4096},
			{"across a 64 KiB boundary", 64<<10 - 3, 7},
		} {
			for _, tag := range []string{etag, ""} {
				got := readAll(t, st, "data/blob.bin", tag, c.off, c.n)
				if !bytes.Equal(got, blob[c.off:c.off+c.n]) {
					t.Errorf("%s [%d, +%d) etag %q: got %d bytes, not the object's", c.name, c.off, c.n, tag, len(got))
				}
			}
		}
	})

	t.Run("OpenOddNames", func(t *testing.T) {
		for _, k := range keysWithPrefix(files, "") {
			if len(files[k]) == 0 || strings.HasPrefix(k, "many/") {
				continue
			}
			if got := readAll(t, st, k, listed[k].ETag, 0, int64(len(files[k]))); !bytes.Equal(got, files[k]) {
				t.Errorf("Open(%q): got %q, want %q", k, head(got), head(files[k]))
			}
		}
	})

	t.Run("NotExist", func(t *testing.T) {
		for _, k := range []string{"data/missing", "data", "tree", "odd/with space", "data/blob.bin/", "many/k9"} {
			_, err := st.Stat(t.Context(), k)
			wantKind(t, fmt.Sprintf("Stat(%q)", k), err, backend.ErrNotExist)
			_, err = st.Open(t.Context(), k, "", 0, 1)
			wantKind(t, fmt.Sprintf("Open(%q)", k), err, backend.ErrNotExist)
		}
		_, err := st.Open(t.Context(), "data/missing", listed["data/blob.bin"].ETag, 0, 1)
		wantKind(t, "Open(missing, with an ETag)", err, backend.ErrNotExist)
	})

	t.Run("NoBucket", func(t *testing.T) {
		nb := srv.open(t, "no-such-bucket", srv.config())
		err := nb.List(t.Context(), "", func(backend.Object) error { return nil })
		wantKind(t, "List", err, backend.ErrNoBucket)
		// A HEAD carries no error code: either kind is a fair answer.
		_, err = nb.Stat(t.Context(), "data/blob.bin")
		wantKind(t, "Stat", err, backend.ErrNoBucket, backend.ErrNotExist)
		_, err = nb.Open(t.Context(), "data/blob.bin", "", 0, 1)
		wantKind(t, "Open", err, backend.ErrNoBucket, backend.ErrNotExist)
	})

	t.Run("RefusedCredentials", func(t *testing.T) {
		const wrongSecret = "not-the-secret-key-0123456789"
		for _, c := range []struct{ name, ak, sk string }{
			{"wrong secret", testenv.AccessKey, wrongSecret},
			{"unknown access key", "modelfs-unknown-ak", wrongSecret},
		} {
			cfg := srv.config()
			cfg.AccessKey, cfg.SecretKey = c.ak, c.sk
			bad := srv.open(t, conformanceBucket, cfg)
			err := bad.List(t.Context(), "", func(backend.Object) error { return nil })
			wantKind(t, c.name+": List", err, backend.ErrAccess)
			if strings.Contains(err.Error(), wrongSecret) {
				t.Errorf("%s: the error shows the secret: %v", c.name, err)
			}
			_, err = bad.Stat(t.Context(), "data/blob.bin")
			if srv.scheme == "s3" && c.ak != testenv.AccessKey {
				// versitygw answers an unknown access key with its own
				// XAdminUserNotFound error, status 404: on a HEAD, which
				// has no body, that reads as a missing object. Real S3
				// answers 403 InvalidAccessKeyId.
				wantKind(t, c.name+": Stat", err, backend.ErrAccess, backend.ErrNotExist)
			} else {
				wantKind(t, c.name+": Stat", err, backend.ErrAccess)
			}
			_, err = bad.Open(t.Context(), "data/blob.bin", "", 0, 1)
			wantKind(t, c.name+": Open", err, backend.ErrAccess)
			if s := bad.String(); strings.Contains(s, wrongSecret) {
				t.Errorf("String() shows the secret: %s", s)
			}
		}
	})

	t.Run("Reader", func(t *testing.T) {
		obj, err := st.Stat(t.Context(), "data/blob.bin")
		if err != nil {
			t.Fatal(err)
		}
		r := backend.NewReader(st, backend.DefaultPolicy)
		n := int64(len(blob))
		for _, c := range [][2]int64{{0, 1}, {n - 1, 1}, {0, n}, {12345, 100000}, {n - 4097, 4097}} {
			p := make([]byte, c[1])
			if err := r.ReadAt(t.Context(), obj, p, c[0]); err != nil {
				t.Fatalf("ReadAt(%d, %d): %v", c[0], c[1], err)
			}
			if !bytes.Equal(p, blob[c[0]:c[0]+c[1]]) {
				t.Fatalf("ReadAt(%d, %d): wrong bytes", c[0], c[1])
			}
		}
		bufs := [][]byte{make([]byte, 10), make([]byte, 70000), make([]byte, 1)}
		var filled []int
		if err := r.ReadVec(t.Context(), obj, 99, bufs, func(i int) { filled = append(filled, i) }); err != nil {
			t.Fatal(err)
		}
		if got := slices.Concat(bufs...); !bytes.Equal(got, blob[99:99+len(got)]) || !slices.Equal(filled, []int{0, 1, 2}) {
			t.Fatalf("ReadVec: wrong bytes or filled order %v", filled)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				for range 8 {
					off := rng.Int64N(n)
					p := make([]byte, 1+rng.Int64N(n-off))
					if err := r.ReadAt(t.Context(), obj, p, off); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(p, blob[off:off+int64(len(p))]) {
						errs <- fmt.Errorf("concurrent ReadAt(%d, %d): wrong bytes", off, len(p))
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if f, rt := r.Stats.Failures.Load(), r.Stats.Retries.Load(); f != 0 || rt != 0 {
			t.Errorf("Reader stats: %d failures, %d retries on a healthy server", f, rt)
		}
	})

	// Last: it replaces an object.
	t.Run("Precondition", func(t *testing.T) {
		const key = "mut/object.bin"
		v1, v2 := randBytes(10, 5000), randBytes(11, 6000)
		if err := srv.put(t.Context(), conformanceBucket, key, v1); err != nil {
			t.Fatal(err)
		}
		old, err := st.Stat(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, st, key, old.ETag, 0, old.Size); !bytes.Equal(got, v1) {
			t.Fatal("Open of the first version: wrong bytes")
		}
		if err := srv.put(t.Context(), conformanceBucket, key, v2); err != nil {
			t.Fatal(err)
		}
		cur, err := st.Stat(t.Context(), key)
		if err != nil {
			t.Fatal(err)
		}
		if cur.ETag == old.ETag || cur.Size != int64(len(v2)) {
			t.Fatalf("replaced object: ETag %s (was %s), size %d", cur.ETag, old.ETag, cur.Size)
		}
		_, err = st.Open(t.Context(), key, old.ETag, 0, 1)
		wantKind(t, "Open with the replaced ETag", err, backend.ErrPrecondition)
		if got := readAll(t, st, key, cur.ETag, 100, 200); !bytes.Equal(got, v2[100:300]) {
			t.Fatal("Open of the new version: wrong bytes")
		}
		r := backend.NewReader(st, backend.DefaultPolicy)
		err = r.ReadAt(t.Context(), old, make([]byte, 10), 0)
		wantKind(t, "Reader.ReadAt of the replaced version", err, backend.ErrPrecondition)
		if r.Stats.Requests.Load() != 1 || r.Stats.Preconditions.Load() != 1 {
			t.Errorf("a changed object took %d requests (%d preconditions), want 1 without retries",
				r.Stats.Requests.Load(), r.Stats.Preconditions.Load())
		}
	})

	t.Run("TransportErrors", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		err := st.List(ctx, "", func(backend.Object) error { return nil })
		if !errors.Is(err, context.Canceled) || backend.Permanent(err) {
			t.Errorf("List with a canceled context: %v, want context.Canceled", err)
		}
		_, err = st.Stat(ctx, "data/blob.bin")
		if !errors.Is(err, context.Canceled) || backend.Permanent(err) {
			t.Errorf("Stat with a canceled context: %v, want context.Canceled", err)
		}
		_, err = st.Open(ctx, "data/blob.bin", "", 0, 1)
		if !errors.Is(err, context.Canceled) || backend.Permanent(err) {
			t.Errorf("Open with a canceled context: %v, want context.Canceled", err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg := srv.config()
		cfg.Endpoint = "http://" + ln.Addr().String()
		ln.Close() // nothing listens there now
		down := srv.open(t, conformanceBucket, cfg)
		_, err = down.Open(t.Context(), "data/blob.bin", "", 0, 1)
		var ne net.Error
		if !errors.As(err, &ne) || backend.Permanent(err) {
			t.Errorf("Open from a closed port: %v, want a net.Error", err)
		}
	})

	t.Run("String", func(t *testing.T) {
		s := st.String()
		if !strings.Contains(s, srv.scheme+"://"+conformanceBucket) || !strings.Contains(s, srv.endpoint) {
			t.Errorf("String() = %q, want the bucket URI and the endpoint", s)
		}
		if strings.Contains(s, testenv.SecretKey) || strings.Contains(s, testenv.AccessKey) {
			t.Errorf("String() = %q shows credentials", s)
		}
	})
}

// head shortens long lists and byte strings in failure messages.
func head[T any](s []T) []T {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// TOS-only behaviour: configuration, retries and range checks that need the
// test server's knobs.

func TestTOSConfig(t *testing.T) {
	srv, _ := startTOS(t)
	if err := srv.createBucket(t.Context(), "cfg-bucket"); err != nil {
		t.Fatal(err)
	}
	if err := srv.put(t.Context(), "cfg-bucket", "m/config.json", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"TOS_ENDPOINT", "TOS_REGION", "TOS_ACCESS_KEY", "TOS_SECRET_KEY", "TOS_SECURITY_TOKEN"} {
		t.Setenv(v, "")
	}
	ctx := t.Context()
	loc := backend.Location{Scheme: "tos", Bucket: "cfg-bucket"}
	works := func(t *testing.T, cfg backend.Config) {
		t.Helper()
		st, err := backend.Open(ctx, loc, cfg)
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer st.Close()
		o, err := st.Stat(ctx, "m/config.json")
		if err != nil || o.Size != 2 {
			t.Fatalf("Stat = %+v, %v", o, err)
		}
		if s := st.String(); s != "tos://cfg-bucket at "+srv.endpoint {
			t.Errorf("String() = %q", s)
		}
	}
	fails := func(t *testing.T, cfg backend.Config, want ...string) {
		t.Helper()
		st, err := backend.Open(ctx, loc, cfg)
		if err == nil {
			st.Close()
			t.Fatalf("Open(%+v) succeeded, want an error mentioning %q", cfg, want)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not mention %q", err, w)
			}
		}
		if cfg.SecretKey != "" && strings.Contains(err.Error(), cfg.SecretKey) {
			t.Errorf("error %q shows the secret", err)
		}
	}
	full := srv.config()

	t.Run("static", func(t *testing.T) { works(t, full) })
	t.Run("no region", func(t *testing.T) {
		cfg := full
		cfg.Region = ""
		fails(t, cfg, "TOS needs a region", "--region", "TOS_REGION")
	})
	t.Run("region from TOS_REGION", func(t *testing.T) {
		t.Setenv("TOS_REGION", testenv.Region)
		cfg := full
		cfg.Region = ""
		works(t, cfg)
	})
	t.Run("no credentials", func(t *testing.T) {
		cfg := full
		cfg.AccessKey, cfg.SecretKey = "", ""
		fails(t, cfg, "TOS_ACCESS_KEY", "TOS_SECRET_KEY")
	})
	t.Run("access key without secret", func(t *testing.T) {
		cfg := full
		cfg.SecretKey = ""
		fails(t, cfg, "TOS_ACCESS_KEY", "TOS_SECRET_KEY")
	})
	t.Run("credentials and endpoint from the environment", func(t *testing.T) {
		t.Setenv("TOS_ACCESS_KEY", testenv.AccessKey)
		t.Setenv("TOS_SECRET_KEY", testenv.SecretKey)
		t.Setenv("TOS_ENDPOINT", srv.endpoint)
		works(t, backend.Config{Region: testenv.Region})
	})
	t.Run("endpoint without scheme means https", func(t *testing.T) {
		cfg := full
		cfg.Endpoint = strings.TrimPrefix(srv.endpoint, "http://")
		st, err := backend.Open(ctx, loc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if !strings.HasSuffix(st.String(), " at https://"+cfg.Endpoint) {
			t.Errorf("String() = %q, want an https endpoint", st.String())
		}
	})
	t.Run("public endpoint of a known region", func(t *testing.T) {
		cfg := full
		cfg.Endpoint, cfg.Region = "", "cn-beijing"
		st, err := backend.Open(ctx, loc, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if want := "tos://cfg-bucket at https://tos-cn-beijing.volces.com"; st.String() != want {
			t.Errorf("String() = %q, want %q", st.String(), want)
		}
	})
	t.Run("no endpoint for an unknown region", func(t *testing.T) {
		cfg := full
		cfg.Endpoint = ""
		fails(t, cfg, "TOS_ENDPOINT", testenv.Region)
	})
	t.Run("S3-compatible endpoint", func(t *testing.T) {
		cfg := full
		cfg.Endpoint = "https://tos-s3-cn-beijing.volces.com"
		fails(t, cfg, "S3-compatible", "s3://")
	})
	t.Run("localhost", func(t *testing.T) {
		cfg := full
		cfg.Endpoint = strings.Replace(srv.endpoint, "127.0.0.1", "localhost", 1)
		fails(t, cfg, "127.0.0.1")
	})
	t.Run("malformed endpoints", func(t *testing.T) {
		for _, e := range []string{"ftp://host", "http://", "http://host/path", "http://host?x=1"} {
			cfg := full
			cfg.Endpoint = e
			fails(t, cfg, "invalid TOS endpoint")
		}
		cfg := full
		cfg.Endpoint = "http://user:hunter2@127.0.0.1:1"
		fails(t, cfg, "user information")
		if _, err := backend.Open(ctx, loc, cfg); err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error shows the endpoint's password: %v", err)
		}
	})
}

func TestTOSSessionToken(t *testing.T) {
	srv, ts := startTOS(t)
	ts.AddCredentials("sts-ak", "sts-secret", "sts-token")
	if err := srv.createBucket(t.Context(), "tok-bucket"); err != nil {
		t.Fatal(err)
	}
	cfg := srv.config()
	cfg.AccessKey, cfg.SecretKey, cfg.SessionToken = "sts-ak", "sts-secret", "sts-token"
	st := srv.open(t, "tok-bucket", cfg)
	if err := st.List(t.Context(), "", func(backend.Object) error { return nil }); err != nil {
		t.Fatalf("List with a session token: %v", err)
	}
	t.Setenv("TOS_ACCESS_KEY", "sts-ak")
	t.Setenv("TOS_SECRET_KEY", "sts-secret")
	t.Setenv("TOS_SECURITY_TOKEN", "sts-token")
	env := srv.open(t, "tok-bucket", backend.Config{Endpoint: srv.endpoint, Region: testenv.Region})
	if err := env.List(t.Context(), "", func(backend.Object) error { return nil }); err != nil {
		t.Fatalf("List with TOS_SECURITY_TOKEN: %v", err)
	}
	cfg.SessionToken = ""
	bad := srv.open(t, "tok-bucket", cfg)
	err := bad.List(t.Context(), "", func(backend.Object) error { return nil })
	wantKind(t, "List without the session token", err, backend.ErrAccess)
}

// TestTOSRetries: a GET is one request (Reader owns its retries, stall
// detection included); a listing page or HEAD is retried 3 times on a
// transient error and never on a permanent one.
func TestTOSRetries(t *testing.T) {
	srv, ts := startTOS(t)
	if err := srv.createBucket(t.Context(), "retry-bucket"); err != nil {
		t.Fatal(err)
	}
	if err := srv.put(t.Context(), "retry-bucket", "k", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	st := srv.open(t, "retry-bucket", srv.config())
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusInternalServerError} {
		ts.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			if r.Method != http.MethodHead {
				fmt.Fprintf(w, `{"Code":"ServiceUnavailable","Message":"injected %d","RequestId":"x","EC":"9999-0"}`, status)
			}
			return true
		})
		calls := []struct {
			name string
			do   func() error
			want int64
		}{
			// Listing pages and HEADs retry 3 times in the store, as the
			// S3 SDK does; GETs once, Reader owning their retries.
			{"List", func() error { return st.List(t.Context(), "", func(backend.Object) error { return nil }) }, 3},
			{"Stat", func() error { _, err := st.Stat(t.Context(), "k"); return err }, 3},
			{"Open", func() error { _, err := st.Open(t.Context(), "k", "", 0, 1); return err }, 1},
		}
		for _, c := range calls {
			before := ts.Requests()
			err := c.do()
			if err == nil || backend.Permanent(err) {
				t.Errorf("%s on %d: error %v, want a transient one", c.name, status, err)
			}
			if n := ts.Requests() - before; n != c.want {
				t.Errorf("%s on %d: %d requests, want %d", c.name, status, n, c.want)
			}
		}
	}
	ts.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusForbidden)
		return true
	})
	before := ts.Requests()
	if _, err := st.Stat(t.Context(), "k"); !backend.Permanent(err) {
		t.Errorf("Stat on 403: %v, want a permanent error", err)
	}
	if n := ts.Requests() - before; n != 1 {
		t.Errorf("Stat on 403: %d requests, want 1", n)
	}
	// Reader retries the same failure itself, with its own backoff.
	ts.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusServiceUnavailable)
		return true
	})
	r := backend.NewReader(st, backend.Policy{Attempts: 3, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond})
	before = ts.Requests()
	if err := r.ReadAt(t.Context(), backend.Object{Key: "k", Size: 10}, make([]byte, 4), 0); err == nil {
		t.Fatal("ReadAt through a failing server succeeded")
	}
	if n := ts.Requests() - before; n != 3 {
		t.Errorf("Reader with 3 attempts made %d requests", n)
	}
}

// TestTOSOpenChecksRange: bytes from anywhere but the asked offset are refused.
func TestTOSOpenChecksRange(t *testing.T) {
	srv, ts := startTOS(t)
	if err := srv.createBucket(t.Context(), "range-bucket"); err != nil {
		t.Fatal(err)
	}
	if err := srv.put(t.Context(), "range-bucket", "k", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	st := srv.open(t, "range-bucket", srv.config())
	for _, c := range []struct {
		name    string
		status  int
		cr      string
		body    string
		wantErr string
	}{
		{"range ignored", http.StatusOK, "", "0123456789", "status code"},
		{"other range", http.StatusPartialContent, "bytes 0-3/10", "0123", "does not start at 5"},
		{"no Content-Range", http.StatusPartialContent, "", "5678", "ignored the Range"},
	} {
		ts.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
			if c.cr != "" {
				w.Header().Set("Content-Range", c.cr)
			}
			w.WriteHeader(c.status)
			io.WriteString(w, c.body)
			return true
		})
		body, err := st.Open(t.Context(), "k", "", 5, 4)
		if err == nil {
			body.Close()
			t.Errorf("%s: Open succeeded", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.wantErr) || backend.Permanent(err) {
			t.Errorf("%s: error %q, want a transient one mentioning %q", c.name, err, c.wantErr)
		}
	}
	ts.SetHook(nil)
	if got := readAll(t, st, "k", "", 5, 4); string(got) != "5678" {
		t.Errorf("Open(5, 4) = %q", got)
	}
	if got := readAll(t, st, "k", "", 0, 1); string(got) != "0" {
		t.Errorf("Open(0, 1) = %q", got)
	}
}
