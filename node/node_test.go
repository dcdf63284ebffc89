package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/cache"
	"github.com/modelfs/modelfs/fs"
	"github.com/modelfs/modelfs/internal/testenv"
	"github.com/modelfs/modelfs/node"
	"github.com/modelfs/modelfs/prefetch"
)

var (
	srv     *testenv.S3Server
	buckets atomic.Int64
)

func TestMain(m *testing.M) {
	os.Exit(testenv.MainWithS3("node", func(s *testenv.S3Server, _ string) error {
		srv = s
		return nil
	}, m.Run))
}

// logs captures what the node logs, to check that no secret appears.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func start(t *testing.T, root *backend.Location) (*node.Node, *logs) {
	t.Helper()
	lg := &logs{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(lg, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })
	n, err := node.Start(context.Background(), node.Config{
		Mountpoint: t.TempDir(),
		Root:       root,
		// The node's own store defaults: endpoint and region only. Models
		// attached below bring their credentials in the request.
		Store:      backend.Config{Endpoint: srv.Endpoint, Region: testenv.Region},
		Policy:     backend.DefaultPolicy,
		Cache:      cache.Config{Budget: 64 << 20, ChunkSize: 1 << 20},
		Fetch:      prefetch.Config{Concurrency: 4, PartSize: 2 << 20},
		Prefetch:   prefetch.All,
		FS:         fs.DefaultOptions,
		StatusAddr: "127.0.0.1:0",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return n, lg
}

func call(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func models(t *testing.T, n *node.Node) map[string]node.ModelStatus {
	t.Helper()
	code, body := call(t, "GET", n.StatusURL+"/v1/model/list", "")
	if code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	var out struct{ Models []node.ModelStatus }
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("list body %q: %v", body, err)
	}
	m := map[string]node.ModelStatus{}
	for _, s := range out.Models {
		m[s.Name] = s
	}
	return m
}

// metric reads one unlabeled sample from /metrics.
func metric(t *testing.T, n *node.Node, name string) float64 {
	t.Helper()
	_, body := call(t, "GET", n.StatusURL+"/metrics", "")
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no metric %s in:\n%s", name, body)
	return 0
}

// TestModelAPI attaches a model through the API, polls it to downloaded,
// reads it byte for byte through the mount, watches the metrics move and
// detaches it. The request's credentials never come back or reach a log.
func TestModelAPI(t *testing.T) {
	ctx := context.Background()
	bucket := fmt.Sprintf("api-models-%d", buckets.Add(1))
	if err := srv.CreateBucket(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"llama/config.json":                      []byte(`{"model_type": "llama"}`),
		"llama/model-00001-of-00002.safetensors": bytes.Repeat([]byte("0123456789abcdef"), 300_000),
		"llama/model-00002-of-00002.safetensors": bytes.Repeat([]byte("fedcba9876543210"), 200_001),
		"llama/notes.txt":                        []byte("not shown: filtered out"),
	}
	for k, v := range files {
		if err := srv.Put(ctx, bucket, k, v); err != nil {
			t.Fatal(err)
		}
	}
	n, lg := start(t, nil)

	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := call(t, "GET", n.StatusURL+path, ""); code != 200 {
			t.Errorf("%s: %d %s", path, code, body)
		}
	}
	// Concurrent readiness checks share one probe of the mount.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, body := call(t, "GET", n.StatusURL+"/readyz", ""); code != 200 {
				t.Errorf("concurrent /readyz: %d %s", code, body)
			}
		}()
	}
	wg.Wait()
	for _, bad := range []string{`{`, `{"model_uri": ""}`, `{"model_uri": "gs://b/m"}`, `{"model_uri": "s3://bkt/m", "model_name": "a/b"}`,
		`{"model_uri": "s3://bkt/m", "download_extra_config": {"ak": "only-the-key"}}`,
		`{"model_uri": "s3://bkt/m", "download_extra_config": {"allow_file_suffix": 7}}`,
		`{"model_uri": "s3://bkt/m", "download_extra_config": {"endpoint": "http://elsewhere:9000"}}`} {
		if code, body := call(t, "POST", n.StatusURL+"/v1/model/download", bad); code != 400 || !strings.Contains(body, `"error"`) {
			t.Errorf("POST %s: %d %s, want 400 with a JSON error", bad, code, body)
		}
	}

	served0 := metric(t, n, "modelfs_bytes_served_total")
	req := fmt.Sprintf(`{"model_uri": "s3://%s/llama", "model_name": "llama-7b", "download_extra_config":
		{"ak": %q, "sk": %q, "endpoint": %q, "region": %q, "allow_file_suffix": ["json", "safetensors"]}}`,
		bucket, testenv.AccessKey, testenv.SecretKey, srv.Endpoint, testenv.Region)
	code, body := call(t, "POST", n.StatusURL+"/v1/model/download", req)
	if code != 200 || !strings.Contains(body, `"model_name":"llama-7b"`) || !strings.Contains(body, `"status":"downloading"`) {
		t.Fatalf("POST download: %d %s", code, body)
	}
	if code, _ := call(t, "POST", n.StatusURL+"/v1/model/download", req); code != 409 {
		t.Errorf("attaching the same name twice: %d, want 409", code)
	}
	st := settled(t, n, "llama-7b")
	if st.Status != node.StatusDownloaded || st.BytesDone != st.BytesTotal || st.Files != 3 {
		t.Fatalf("model status %+v, want downloaded with 3 files", st)
	}

	dir := filepath.Join(n.Mount().Dir, "llama-7b")
	for k, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, strings.TrimPrefix(k, "llama/")))
		if k == "llama/notes.txt" {
			if !os.IsNotExist(err) {
				t.Errorf("notes.txt should be filtered out, read %q %v", got, err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, %v; want the %d stored bytes", k, len(got), err, len(want))
		}
	}
	if served := metric(t, n, "modelfs_bytes_served_total"); served <= served0 {
		t.Errorf("bytes served did not move: %v then %v", served0, served)
	}
	if fetched := metric(t, n, "modelfs_bytes_fetched_total"); fetched < float64(len(files["llama/model-00001-of-00002.safetensors"])) {
		t.Errorf("bytes fetched %v is less than one shard", fetched)
	}
	_, mbody := call(t, "GET", n.StatusURL+"/metrics", "")
	if !strings.Contains(mbody, `modelfs_model_status{model="llama-7b",status="downloaded"} 1`) {
		t.Errorf("metrics lack the model's status")
	}
	noSecret(t, n, lg, []string{testenv.SecretKey}, body)

	code, dbody := call(t, "DELETE", n.StatusURL+"/v1/model/llama-7b", "")
	if code != 200 {
		t.Fatalf("DELETE: %d %s", code, dbody)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("detached model still visible: %v", err)
	}
	if _, ok := models(t, n)["llama-7b"]; ok {
		t.Error("detached model still listed")
	}
	if code, _ := call(t, "DELETE", n.StatusURL+"/v1/model/llama-7b", ""); code != 404 {
		t.Errorf("second DELETE: %d, want 404", code)
	}

	noSecret(t, n, lg, []string{testenv.SecretKey}, dbody)
}

// noSecret fails if any of secrets appears in the model list, the metrics,
// the daemon's logs or the other replies given.
func noSecret(t *testing.T, n *node.Node, lg fmt.Stringer, secrets []string, replies ...string) {
	t.Helper()
	_, list := call(t, "GET", n.StatusURL+"/v1/model/list", "")
	_, metrics := call(t, "GET", n.StatusURL+"/metrics", "")
	texts := map[string]string{"model list": list, "metrics": metrics, "logs": lg.String(),
		"replies": strings.Join(replies, "\n")}
	for where, text := range texts {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("a secret (%.4s…) appears in the %s", s, where)
			}
		}
	}
}

// TestModelAPIFailure: a model the store refuses shows as failed, with
// the reason, and the mount is unaffected.
func TestModelAPIFailure(t *testing.T) {
	n, lg := start(t, nil)
	req := fmt.Sprintf(`{"model_uri": "s3://no-such-bucket/m", "download_extra_config": {"ak": %q, "sk": "wrong-secret-value"}}`, testenv.AccessKey)
	if code, body := call(t, "POST", n.StatusURL+"/v1/model/download", req); code != 200 {
		t.Fatalf("POST: %d %s", code, body)
	}
	st := settled(t, n, "m")
	if st.Status != node.StatusFailed || st.Error == "" {
		t.Fatalf("status %+v, want failed with an error", st)
	}
	// Endpoints that carry a password, in forms that do not parse as a
	// URL (a '/' in the secret ends the host early; a bad escape).
	for i, ep := range []string{"http://AK:pw/s3cr3t-in-endpoint@127.0.0.1:1", "http://u:s3cr3t-in-endpoint%zz@127.0.0.1:1",
		"http://127.0.0.1:1/?X-Amz-Security-Token=s3cr3t-in-endpoint"} {
		name := fmt.Sprintf("ep%d", i)
		req := fmt.Sprintf(`{"model_uri": "s3://bkt/m", "model_name": %q, "download_extra_config": {"ak": "a", "sk": "b", "endpoint": %q}}`, name, ep)
		if code, body := call(t, "POST", n.StatusURL+"/v1/model/download", req); code != 200 {
			t.Fatalf("POST: %d %s", code, body)
		}
		if st := settled(t, n, name); st.Status != node.StatusFailed || !strings.Contains(st.Error, "endpoint") {
			t.Errorf("%s: status %+v, want failed naming the endpoint", ep, st)
		}
	}
	noSecret(t, n, lg, []string{"wrong-secret-value", "s3cr3t-in-endpoint"})
	if code, _ := call(t, "GET", n.StatusURL+"/readyz", ""); code != 200 {
		t.Errorf("readyz after a failed attach: %d", code)
	}
}

// settled polls the model list, as a client does, until the model is no
// longer downloading (or 30 s pass), and returns its status.
func settled(t *testing.T, n *node.Node, name string) node.ModelStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := models(t, n)[name]
		if st.Status != node.StatusDownloading || time.Now().After(deadline) {
			return st
		}
		time.Sleep(50 * time.Millisecond) // polling the API
	}
}
