package faultproxy

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const blobSize = 1 << 20

var blob = func() []byte {
	b := make([]byte, blobSize)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}()

// upstream is a plain HTTP server standing in for S3: objects under
// /bucket/KEY (ranges honoured), a listing at /bucket, and PUTs. It records
// the Host header of every request.
type upstream struct {
	*httptest.Server
	mu    sync.Mutex
	hosts []string
	puts  int
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.hosts = append(u.hosts, r.Host)
		u.mu.Unlock()
		switch {
		case r.Method == http.MethodPut:
			io.Copy(io.Discard, r.Body)
			u.mu.Lock()
			u.puts++
			u.mu.Unlock()
		case r.URL.Path == "/bucket":
			w.Header().Set("Content-Type", "application/xml")
			io.WriteString(w, "<ListBucketResult></ListBucketResult>")
		default:
			w.Header().Set("ETag", `"v1"`)
			http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(blob))
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func newProxy(t *testing.T, up *upstream) *Proxy {
	p, err := New(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

var client = &http.Client{Transport: &http.Transport{Proxy: nil}}

func get(t *testing.T, ctx context.Context, url string, hdr ...string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return client.Do(req)
}

// readAll GETs url and returns the status, the body bytes that arrived and
// the error that ended the body, if any.
func readAll(t *testing.T, url string, hdr ...string) (int, []byte, error) {
	t.Helper()
	resp, err := get(t, context.Background(), url, hdr...)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func TestPassThrough(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up)
	code, b, err := readAll(t, p.URL+"/bucket/a/b.bin")
	if err != nil || code != 200 || !bytes.Equal(b, blob) {
		t.Fatalf("GET: %d, %d bytes, %v", code, len(b), err)
	}
	resp, err := get(t, context.Background(), p.URL+"/bucket/a/b.bin", "Range", "bytes=1000-1999")
	if err != nil {
		t.Fatal(err)
	}
	b, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusPartialContent || !bytes.Equal(b, blob[1000:2000]) ||
		resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 1000-1999/%d", blobSize) || resp.Header.Get("ETag") != `"v1"` {
		t.Fatalf("ranged GET: %d %q %q, %d bytes, %v", resp.StatusCode, resp.Header.Get("Content-Range"),
			resp.Header.Get("ETag"), len(b), err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	want := strings.TrimPrefix(p.URL, "http://")
	for _, h := range up.hosts {
		if h != want {
			t.Errorf("upstream saw Host %q, want the proxy's %q (signatures cover it)", h, want)
		}
	}
	if p.TotalFired() != 0 || p.ObjectGets() != 2 {
		t.Errorf("fired %d, object GETs %d; want 0 and 2", p.TotalFired(), p.ObjectGets())
	}
}

// TestFaultsSpareOtherRequests: listings, HEADs and PUTs pass while a fault
// strikes every object GET.
func TestFaultsSpareOtherRequests(t *testing.T) {
	up := newUpstream(t)
	p := newProxy(t, up)
	p.Set(Fault{Kind: SlowDown})
	if code, b, err := readAll(t, p.URL+"/bucket?list-type=2&prefix=a%2F"); err != nil || code != 200 || !bytes.Contains(b, []byte("ListBucketResult")) {
		t.Errorf("list: %d %q %v", code, b, err)
	}
	if code, _, err := readAll(t, p.URL+"/bucket/"); err != nil || code != 200 {
		t.Errorf("list with a trailing slash: %d %v", code, err)
	}
	resp, err := client.Head(p.URL + "/bucket/k")
	if err != nil || resp.StatusCode != 200 || resp.ContentLength != blobSize {
		t.Errorf("HEAD: %v %v", resp, err)
	}
	req, _ := http.NewRequest(http.MethodPut, p.URL+"/bucket/k", bytes.NewReader(blob[:1000]))
	if resp, err := client.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("PUT: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if code, _, _ := readAll(t, p.URL+"/bucket/k"); code != http.StatusServiceUnavailable {
		t.Errorf("object GET: %d, want 503", code)
	}
	if n := p.Fired(SlowDown); n != 1 {
		t.Errorf("fired %d times, want 1", n)
	}
	if p.Requests() != 5 || p.ObjectGets() != 1 {
		t.Errorf("requests %d, object GETs %d; want 5 and 1", p.Requests(), p.ObjectGets())
	}
}

func TestSlowDownBurst(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	p.Set(Fault{Kind: SlowDown, Limit: 3})
	for i := 0; i < 5; i++ {
		code, b, err := readAll(t, p.URL+"/bucket/k")
		if err != nil {
			t.Fatal(err)
		}
		if i >= 3 {
			if code != 200 || !bytes.Equal(b, blob) {
				t.Errorf("GET %d after the burst: %d, %d bytes", i, code, len(b))
			}
			continue
		}
		var e struct{ Code, Message, Resource, RequestId string }
		if code != http.StatusServiceUnavailable || xml.Unmarshal(b, &e) != nil || e.Code != "SlowDown" ||
			e.Resource != "/bucket/k" || e.RequestId == "" {
			t.Errorf("GET %d: %d %q, want a 503 SlowDown error", i, code, b)
		}
	}
	if n := p.Fired(SlowDown); n != 3 {
		t.Errorf("fired %d, want 3", n)
	}
}

func TestResetAfterBytes(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	p.Set(Fault{Kind: Reset, After: 100 << 10})
	code, b, err := readAll(t, p.URL+"/bucket/k")
	if code != 200 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("status %d, body error %v; want 200 and a connection reset", code, err)
	}
	if len(b) != 100<<10 || !bytes.Equal(b, blob[:len(b)]) {
		t.Errorf("got %d bytes before the reset, want exactly the first %d", len(b), 100<<10)
	}
	if n := p.Fired(Reset); n != 1 {
		t.Errorf("fired %d, want 1", n)
	}
}

func TestTruncateAfterBytes(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	p.Set(Fault{Kind: Truncate, After: 100 << 10})
	code, b, err := readAll(t, p.URL+"/bucket/k", "Range", "bytes=10-")
	if code != http.StatusPartialContent || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("status %d, body error %v; want 206 and an unexpected EOF", code, err)
	}
	if len(b) != 100<<10 || !bytes.Equal(b, blob[10:10+len(b)]) {
		t.Errorf("got %d bytes, want exactly the first %d", len(b), 100<<10)
	}
	if n := p.Fired(Truncate); n != 1 {
		t.Errorf("fired %d, want 1", n)
	}
}

// TestShortBodyPasses: a body no longer than After is forwarded whole and
// the fault does not count; nor are error responses struck.
func TestShortBodyPasses(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	p.Set(Fault{Kind: Reset, After: 4096, Limit: 1})
	if code, b, err := readAll(t, p.URL+"/bucket/k", "Range", "bytes=0-4095"); err != nil || code != 206 || !bytes.Equal(b, blob[:4096]) {
		t.Fatalf("short GET: %d, %d bytes, %v", code, len(b), err)
	}
	if code, _, err := readAll(t, p.URL+"/bucket/k", "Range", "bytes=2000000-"); err != nil || code != http.StatusRequestedRangeNotSatisfiable {
		t.Fatalf("unsatisfiable GET: %d, %v", code, err)
	}
	if n := p.Fired(Reset); n != 0 {
		t.Fatalf("fired %d on responses it could not strike", n)
	}
	// The firing those GETs reserved against Limit was given back.
	if _, _, err := readAll(t, p.URL+"/bucket/k"); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("full GET: %v, want a reset", err)
	}
}

func TestStallHoldsUntilClientLeaves(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	p.Set(Fault{Kind: Stall, After: 64 << 10})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := get(t, ctx, p.URL+"/bucket/k")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	head := make([]byte, 64<<10)
	if _, err := io.ReadFull(resp.Body, head); err != nil || !bytes.Equal(head, blob[:len(head)]) {
		t.Fatalf("first bytes: %v", err)
	}
	rest := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(make([]byte, 1))
		rest <- err
	}()
	select {
	case err := <-rest:
		t.Fatalf("read past the stall point returned %v", err)
	case <-time.After(200 * time.Millisecond): // the stall holds
	}
	if n := p.Fired(Stall); n != 1 {
		t.Errorf("fired %d, want 1", n)
	}
	cancel()
	select {
	case err := <-rest:
		if err == nil {
			t.Error("read after giving up succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("read still blocked after the client gave up")
	}
}

func TestCloseReleasesStalls(t *testing.T) {
	p, err := New(newUpstream(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	p.Set(Fault{Kind: Stall})
	resp, err := get(t, context.Background(), p.URL+"/bucket/k")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs on a stalled connection")
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Error("stalled body ended cleanly after Close")
	}
}

func TestDrip(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	p.Set(Fault{Kind: Drip, Rate: 256 << 10})
	start := time.Now()
	code, b, err := readAll(t, p.URL+"/bucket/k", "Range", "bytes=0-65535")
	took := time.Since(start)
	if err != nil || code != 206 || !bytes.Equal(b, blob[:65536]) {
		t.Fatalf("drip: %d, %d bytes, %v", code, len(b), err)
	}
	// 64 KiB at 256 KiB/s: four slices, three ticks apart.
	if took < 3*dripTick {
		t.Errorf("64 KiB at 256 KiB/s took %v", took)
	}
	if n := p.Fired(Drip); n != 1 {
		t.Errorf("fired %d, want 1", n)
	}
}

func TestDelay(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	p.Set(Fault{Kind: Delay, Delay: 150 * time.Millisecond})
	start := time.Now()
	code, b, err := readAll(t, p.URL+"/bucket/k")
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("delayed GET answered in %v", took)
	}
	if err != nil || code != 200 || !bytes.Equal(b, blob) {
		t.Fatalf("delayed GET: %d, %d bytes, %v", code, len(b), err)
	}
	if n := p.Fired(Delay); n != 1 {
		t.Errorf("fired %d, want 1", n)
	}
}

// TestSelection: Every, Match, Limit and Off decide which GETs are struck.
func TestSelection(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	struck := func(key string) bool {
		code, _, err := readAll(t, p.URL+"/bucket/"+key)
		if err != nil {
			t.Fatal(err)
		}
		return code == http.StatusServiceUnavailable
	}
	p.Set(Fault{Kind: SlowDown, Every: 3, Match: func(k string) bool { return strings.HasPrefix(k, "a/") }})
	var got []int
	for i := 1; i <= 9; i++ {
		if struck("b") {
			t.Fatal("a GET the fault does not match was struck")
		}
		if struck("a/x") {
			got = append(got, i)
		}
	}
	if fmt.Sprint(got) != "[3 6 9]" {
		t.Errorf("Every 3 struck GETs %v, want [3 6 9]", got)
	}
	p.Set(Fault{Kind: SlowDown, Probability: 1, Limit: 2})
	n := 0
	for i := 0; i < 5; i++ {
		if struck("k") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("Limit 2 struck %d GETs", n)
	}
	p.Set(Fault{Kind: SlowDown})
	p.Off()
	if struck("k") {
		t.Error("struck after Off")
	}
	if total := p.Fired(SlowDown); total != 5 {
		t.Errorf("fired %d in all, want 5", total)
	}
}

// TestConcurrentFaults swaps faults while GETs run, for the race detector:
// every GET either completes or fails, and the counters add up.
func TestConcurrentFaults(t *testing.T) {
	p := newProxy(t, newUpstream(t))
	kinds := []Kind{Reset, Truncate, SlowDown, None}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				p.Set(Fault{Kind: kinds[(w+i)%len(kinds)], After: 1000, Every: 2})
				readAll(t, p.URL+"/bucket/k", "Range", "bytes=0-200000")
				p.Fired(Reset)
			}
		}()
	}
	wg.Wait()
	if p.ObjectGets() != 160 {
		t.Errorf("object GETs %d, want 160", p.ObjectGets())
	}
	if p.TotalFired() == 0 || p.TotalFired() > 160 {
		t.Errorf("fired %d times over 160 GETs", p.TotalFired())
	}
}
