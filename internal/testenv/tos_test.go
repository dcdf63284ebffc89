package testenv

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/volcengine/ve-tos-golang-sdk/v2/tos"
)

func startTOS(t *testing.T) (*TOSServer, *tos.ClientV2) {
	t.Helper()
	s, err := StartTOS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	c, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateBucket(t.Context(), "bkt"); err != nil {
		t.Fatal(err)
	}
	return s, c
}

func serverErr(t *testing.T, err error, status int, code string) {
	t.Helper()
	var se *tos.TosServerError
	if !errors.As(err, &se) {
		t.Fatalf("error %v (%T), want a TosServerError %d %s", err, err, status, code)
	}
	if se.StatusCode != status || se.Code != code {
		t.Fatalf("error %d %q (%v), want %d %q", se.StatusCode, se.Code, err, status, code)
	}
	if se.RequestID == "" || se.EC == "" {
		t.Errorf("error without RequestId or EC: %+v", se)
	}
}

// TestTOSServerObjects drives the server with the SDK it imitates.
func TestTOSServerObjects(t *testing.T) {
	s, c := startTOS(t)
	ctx := t.Context()
	data := bytes.Repeat([]byte("0123456789abcdef"), 10000) // over the SDK's 64 KiB Expect: 100-continue threshold
	put, err := c.PutObjectV2(ctx, &tos.PutObjectV2Input{
		PutObjectBasicInput: tos.PutObjectBasicInput{
			Bucket: "bkt", Key: "dir/obj.json", ContentType: "application/json",
			Meta: map[string]string{"origin": "test"},
		},
		Content: bytes.NewReader(data),
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(data)
	wantETag := `"` + hex.EncodeToString(sum[:]) + `"`
	wantCRC := crc64.Checksum(data, crc64.MakeTable(crc64.ECMA))
	if put.ETag != wantETag || put.HashCrc64ecma != wantCRC {
		t.Fatalf("PUT answered ETag %s crc %d, want %s %d", put.ETag, put.HashCrc64ecma, wantETag, wantCRC)
	}

	head, err := c.HeadObjectV2(ctx, &tos.HeadObjectV2Input{Bucket: "bkt", Key: "dir/obj.json"})
	if err != nil {
		t.Fatal(err)
	}
	if head.ETag != wantETag || head.ContentLength != int64(len(data)) || head.HashCrc64ecma != wantCRC ||
		head.ContentType != "application/json" || time.Since(head.LastModified) > time.Minute || head.RequestID == "" {
		t.Fatalf("HEAD = %+v", head.ObjectMetaV2)
	}
	if v, ok := head.Meta.Get("origin"); !ok || v != "test" {
		t.Errorf("user metadata origin = %q, %v", v, ok)
	}

	// A full GET: the SDK checks X-Tos-Hash-Crc64ecma at EOF.
	get, err := c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "dir/obj.json"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(get.Content)
	get.Content.Close()
	if err != nil || !bytes.Equal(got, data) || get.StatusCode != http.StatusOK {
		t.Fatalf("full GET: status %d, %d bytes, %v", get.StatusCode, len(got), err)
	}

	// A ranged GET.
	get, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "dir/obj.json", RangeStart: 10, RangeEnd: 25})
	if err != nil {
		t.Fatal(err)
	}
	got, _ = io.ReadAll(get.Content)
	get.Content.Close()
	if get.StatusCode != http.StatusPartialContent || get.ContentRange != fmt.Sprintf("bytes 10-25/%d", len(data)) || !bytes.Equal(got, data[10:26]) {
		t.Fatalf("ranged GET: %d %q %q", get.StatusCode, get.ContentRange, got)
	}
	for _, r := range []string{"bytes=0-0", "bytes=-3", fmt.Sprintf("bytes=%d-", len(data)-2), fmt.Sprintf("bytes=5-%d", 10*len(data))} {
		get, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "dir/obj.json", Range: r})
		if err != nil {
			t.Fatalf("GET %s: %v", r, err)
		}
		get.Content.Close()
		if get.StatusCode != http.StatusPartialContent {
			t.Errorf("GET %s: status %d", r, get.StatusCode)
		}
	}
	_, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "dir/obj.json", Range: fmt.Sprintf("bytes=%d-", len(data))})
	serverErr(t, err, http.StatusRequestedRangeNotSatisfiable, "InvalidRange")

	// Conditions.
	_, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "dir/obj.json", IfMatch: `"0123"`, Range: "bytes=0-0"})
	serverErr(t, err, http.StatusPreconditionFailed, "PreconditionFailed")
	get, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "dir/obj.json", IfMatch: wantETag, Range: "bytes=0-0"})
	if err != nil {
		t.Fatalf("GET with the right If-Match: %v", err)
	}
	get.Content.Close()
	_, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "dir/obj.json", IfNoneMatch: wantETag})
	if tos.StatusCode(err) != http.StatusNotModified {
		t.Errorf("If-None-Match with the current ETag: %v, want 304", err)
	}

	// Not found, and HEAD errors without a body.
	_, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "missing"})
	serverErr(t, err, http.StatusNotFound, "NoSuchKey")
	_, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "nobkt", Key: "missing"})
	serverErr(t, err, http.StatusNotFound, "NoSuchBucket")
	_, err = c.HeadObjectV2(ctx, &tos.HeadObjectV2Input{Bucket: "bkt", Key: "missing"})
	var se *tos.TosServerError
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || se.Code != "" || se.EC != "0017-00000003" {
		t.Errorf("HEAD of a missing key: %#v", err)
	}
	_, err = c.HeadObjectV2(ctx, &tos.HeadObjectV2Input{Bucket: "nobkt", Key: "missing"})
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound || se.EC != "0006-00000001" {
		t.Errorf("HEAD in a missing bucket: %#v", err)
	}
	_, err = c.PutObjectV2(ctx, &tos.PutObjectV2Input{PutObjectBasicInput: tos.PutObjectBasicInput{Bucket: "nobkt", Key: "k"}, Content: strings.NewReader("x")})
	serverErr(t, err, http.StatusNotFound, "NoSuchBucket")

	// Integrity headers on PUT.
	md5sum := md5.Sum([]byte("other"))
	_, err = c.PutObjectV2(ctx, &tos.PutObjectV2Input{
		PutObjectBasicInput: tos.PutObjectBasicInput{Bucket: "bkt", Key: "md5", ContentMD5: base64.StdEncoding.EncodeToString(md5sum[:])},
		Content:             strings.NewReader("payload"),
	})
	serverErr(t, err, http.StatusBadRequest, "BadDigest")
	shasum := sha256.Sum256([]byte("payload"))
	if _, err = c.PutObjectV2(ctx, &tos.PutObjectV2Input{
		PutObjectBasicInput: tos.PutObjectBasicInput{Bucket: "bkt", Key: "sha", ContentSHA256: hex.EncodeToString(shasum[:])},
		Content:             strings.NewReader("payload"),
	}); err != nil {
		t.Errorf("PUT with the right X-Tos-Content-Sha256: %v", err)
	}
	_, err = c.PutObjectV2(ctx, &tos.PutObjectV2Input{
		PutObjectBasicInput: tos.PutObjectBasicInput{Bucket: "bkt", Key: "sha", ContentSHA256: hex.EncodeToString(shasum[:])},
		Content:             strings.NewReader("tampered"),
	})
	serverErr(t, err, http.StatusBadRequest, "BadDigest")

	// A wrong CRC header on a full GET is caught by the SDK at EOF.
	s.SetHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet && r.Header.Get("Range") == "" {
			w.Header().Set("X-Tos-Hash-Crc64ecma", "12345")
			w.Header().Set("Content-Length", "7")
			io.WriteString(w, "payload")
			return true
		}
		return false
	})
	get, err = c.GetObjectV2(ctx, &tos.GetObjectV2Input{Bucket: "bkt", Key: "sha"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(get.Content)
	get.Content.Close()
	if err == nil || !strings.Contains(err.Error(), "crc") {
		t.Errorf("GET with a wrong CRC header: %v, want a crc error", err)
	}
	s.SetHook(nil)

	// Replacing and deleting.
	if err := s.Put(ctx, "bkt", "dir/obj.json", []byte("new")); err != nil {
		t.Fatal(err)
	}
	head, err = c.HeadObjectV2(ctx, &tos.HeadObjectV2Input{Bucket: "bkt", Key: "dir/obj.json"})
	if err != nil || head.ETag == wantETag || head.ContentLength != 3 {
		t.Fatalf("replaced object: %+v %v", head, err)
	}
	if _, err := c.DeleteObjectV2(ctx, &tos.DeleteObjectV2Input{Bucket: "bkt", Key: "dir/obj.json"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.HeadObjectV2(ctx, &tos.HeadObjectV2Input{Bucket: "bkt", Key: "dir/obj.json"})
	if tos.StatusCode(err) != http.StatusNotFound {
		t.Errorf("HEAD after DELETE: %v", err)
	}

	// Buckets.
	err = s.CreateBucket(ctx, "bkt")
	serverErr(t, err, http.StatusConflict, "BucketAlreadyExists")
	hb, err := c.HeadBucket(ctx, &tos.HeadBucketInput{Bucket: "bkt"})
	if err != nil || hb.Region != Region {
		t.Errorf("HeadBucket: %+v %v", hb, err)
	}
	_, err = c.HeadBucket(ctx, &tos.HeadBucketInput{Bucket: "nobkt"})
	if ok, _ := c.DoesBucketExist(ctx, &tos.DoesBucketExistInput{Bucket: "nobkt"}); ok || tos.StatusCode(err) != http.StatusNotFound {
		t.Errorf("missing bucket: exists %v, HEAD %v", ok, err)
	}
}

func TestTOSServerList(t *testing.T) {
	s, c := startTOS(t)
	ctx := t.Context()
	var want []string
	for i := range 2500 {
		k := fmt.Sprintf("p/%04d", i)
		if i%1000 == 999 {
			k = fmt.Sprintf("p/%04d/", i) // directory markers on the page boundaries
		}
		want = append(want, k)
	}
	for _, k := range want {
		if err := s.Put(ctx, "bkt", k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"q/a/1", "q/a/2", "q/b/1", "q/c", "q/d/x/y"} {
		if err := s.Put(ctx, "bkt", k, nil); err != nil {
			t.Fatal(err)
		}
	}

	// Pages of at most 1000, whatever max-keys asks.
	var got []string
	token, pages := "", 0
	for {
		out, err := c.ListObjectsType2(ctx, &tos.ListObjectsType2Input{Bucket: "bkt", Prefix: "p/", ContinuationToken: token, MaxKeys: 5000, ListOnlyOnce: true})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(out.Contents) > 1000 || out.KeyCount != len(out.Contents) || out.Name != "bkt" || out.Prefix != "p/" {
			t.Fatalf("page %d: %d objects, KeyCount %d, Name %q", pages, len(out.Contents), out.KeyCount, out.Name)
		}
		for _, o := range out.Contents {
			if o.Size != int64(len(o.Key)) || o.ETag == "" || o.LastModified.IsZero() || o.HashCrc64ecma == 0 || o.StorageClass != "STANDARD" || o.Owner.ID == "" {
				t.Fatalf("listed %+v", o)
			}
			got = append(got, o.Key)
		}
		if !out.IsTruncated {
			break
		}
		token = out.NextContinuationToken
	}
	if pages != 3 || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%d pages, %d keys", pages, len(got))
	}

	// The SDK's own paging (ListOnlyOnce false) with small pages.
	out, err := c.ListObjectsType2(ctx, &tos.ListObjectsType2Input{Bucket: "bkt", Prefix: "p/00", MaxKeys: 100})
	if err != nil || len(out.Contents) != 100 {
		t.Fatalf("SDK paging: %d keys, %v", len(out.Contents), err)
	}

	// Delimiter: common prefixes count towards max-keys and are not
	// repeated on the next page.
	var entries []string
	token = ""
	for {
		out, err := c.ListObjectsType2(ctx, &tos.ListObjectsType2Input{Bucket: "bkt", Prefix: "q/", Delimiter: "/", ContinuationToken: token, MaxKeys: 1, ListOnlyOnce: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range out.CommonPrefixes {
			entries = append(entries, p.Prefix)
		}
		for _, o := range out.Contents {
			entries = append(entries, o.Key)
		}
		if !out.IsTruncated {
			break
		}
		token = out.NextContinuationToken
	}
	if got, want := strings.Join(entries, ","), "q/a/,q/b/,q/c,q/d/"; got != want {
		t.Errorf("delimited listing %s, want %s", got, want)
	}

	_, err = c.ListObjectsType2(ctx, &tos.ListObjectsType2Input{Bucket: "bkt", ContinuationToken: "!!", ListOnlyOnce: true})
	serverErr(t, err, http.StatusBadRequest, "InvalidArgument")
	_, err = c.ListObjectsType2(ctx, &tos.ListObjectsType2Input{Bucket: "nobkt", ListOnlyOnce: true})
	serverErr(t, err, http.StatusNotFound, "NoSuchBucket")
	out, err = c.ListObjectsType2(ctx, &tos.ListObjectsType2Input{Bucket: "bkt", Prefix: "none/", ListOnlyOnce: true})
	if err != nil || len(out.Contents) != 0 || out.IsTruncated {
		t.Errorf("empty listing: %+v %v", out, err)
	}
}

// signedRequest builds a request signed by the SDK's own signer, which the
// test may then tamper with.
func signedRequest(t *testing.T, s *TOSServer, signer *tos.SignV4, method, path string, query url.Values, hdr http.Header, date time.Time) *http.Request {
	t.Helper()
	u, _ := url.Parse(s.Endpoint)
	if hdr == nil {
		hdr = make(http.Header)
	}
	req := &tos.Request{Method: method, Host: u.Host, Path: path, Query: query, Header: hdr, RequestDate: date}
	for k, v := range signer.SignHeader(req) {
		hdr[k] = v
	}
	hr, err := http.NewRequestWithContext(t.Context(), method, (&url.URL{Scheme: "http", Host: u.Host, Path: path, RawQuery: query.Encode()}).String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	hr.Header = hdr
	return hr
}

type wireError struct {
	Code, Message, RequestId, HostId, Resource, EC string
}

func do(t *testing.T, r *http.Request) (*http.Response, wireError) {
	t.Helper()
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var we wireError
	if resp.StatusCode >= 400 && r.Method != http.MethodHead {
		if err := json.Unmarshal(body, &we); err != nil {
			t.Fatalf("error body %q is not JSON: %v", body, err)
		}
		if we.RequestId == "" || we.RequestId != resp.Header.Get("X-Tos-Request-Id") || we.EC == "" || we.EC != resp.Header.Get("X-Tos-Ec") || we.HostId == "" {
			t.Errorf("error body %s with headers %v", body, resp.Header)
		}
	}
	if r.Method == http.MethodHead && len(body) != 0 {
		t.Errorf("HEAD answered a body: %q", body)
	}
	return resp, we
}

func TestTOSServerAuth(t *testing.T) {
	s, _ := startTOS(t)
	ctx := t.Context()
	if err := s.Put(ctx, "bkt", "a b+c%d", []byte("x")); err != nil {
		t.Fatal(err)
	}
	good := tos.NewSignV4(tos.NewStaticCredentials(AccessKey, SecretKey), Region)
	now := time.Now().UTC()
	list := url.Values{"list-type": {"2"}, "prefix": {"a b+"}}

	resp, _ := do(t, signedRequest(t, s, good, "GET", "/bkt", list, nil, now))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("signed listing: %s", resp.Status)
	}
	resp, _ = do(t, signedRequest(t, s, good, "HEAD", "/bkt/a b+c%d", url.Values{}, nil, now))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Tos-Hash-Crc64ecma") == "" || resp.ContentLength != 1 {
		t.Fatalf("signed HEAD of an odd key: %s %v", resp.Status, resp.Header)
	}

	for _, c := range []struct {
		name   string
		req    func() *http.Request
		status int
		code   string
	}{
		{"anonymous", func() *http.Request {
			r, _ := http.NewRequestWithContext(ctx, "GET", s.Endpoint+"/bkt?list-type=2", nil)
			return r
		}, 403, "AccessDenied"},
		{"wrong secret", func() *http.Request {
			return signedRequest(t, s, tos.NewSignV4(tos.NewStaticCredentials(AccessKey, "wrong"), Region), "GET", "/bkt", list, nil, now)
		}, 403, "SignatureDoesNotMatch"},
		{"unknown access key", func() *http.Request {
			return signedRequest(t, s, tos.NewSignV4(tos.NewStaticCredentials("nobody", SecretKey), Region), "GET", "/bkt", list, nil, now)
		}, 403, "InvalidAccessKeyId"},
		{"wrong region", func() *http.Request {
			return signedRequest(t, s, tos.NewSignV4(tos.NewStaticCredentials(AccessKey, SecretKey), "cn-beijing"), "GET", "/bkt", list, nil, now)
		}, 403, "SignatureDoesNotMatch"},
		{"old date", func() *http.Request {
			return signedRequest(t, s, good, "GET", "/bkt", list, nil, now.Add(-time.Hour))
		}, 403, "RequestTimeTooSkewed"},
		{"tampered path", func() *http.Request {
			r := signedRequest(t, s, good, "GET", "/bkt/a b+c%d", url.Values{}, nil, now)
			r.URL.Path = "/bkt/a b+c%e"
			return r
		}, 403, "SignatureDoesNotMatch"},
		{"tampered query", func() *http.Request {
			r := signedRequest(t, s, good, "GET", "/bkt", list, nil, now)
			r.URL.RawQuery = url.Values{"list-type": {"2"}, "prefix": {"a b"}}.Encode()
			return r
		}, 403, "SignatureDoesNotMatch"},
		{"tampered signed header", func() *http.Request {
			r := signedRequest(t, s, good, "GET", "/bkt", list, http.Header{"X-Tos-Meta-A": {"1"}}, now)
			r.Header.Set("X-Tos-Meta-A", "2")
			return r
		}, 403, "SignatureDoesNotMatch"},
		{"unsigned x-tos header", func() *http.Request {
			r := signedRequest(t, s, good, "GET", "/bkt", list, nil, now)
			r.Header.Set("X-Tos-Traffic-Limit", "1")
			return r
		}, 403, "AccessDenied"},
		{"unexpected security token", func() *http.Request {
			creds := tos.NewStaticCredentials(AccessKey, SecretKey)
			creds.WithSecurityToken("tok")
			return signedRequest(t, s, tos.NewSignV4(creds, Region), "GET", "/bkt", list, nil, now)
		}, 403, "InvalidToken"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, we := do(t, c.req())
			if resp.StatusCode != c.status || we.Code != c.code {
				t.Errorf("%s %s, want %d %s", resp.Status, we.Code, c.status, c.code)
			}
		})
	}

	// HEAD errors: status and X-Tos-Ec, no body.
	r, _ := http.NewRequestWithContext(ctx, "HEAD", s.Endpoint+"/bkt/x", nil)
	resp, _ = do(t, r)
	if resp.StatusCode != 403 || resp.Header.Get("X-Tos-Ec") == "" || resp.Header.Get("X-Tos-Request-Id") == "" {
		t.Errorf("anonymous HEAD: %s %v", resp.Status, resp.Header)
	}
}

func TestTOSServerStop(t *testing.T) {
	s, err := StartTOS()
	if err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := s.Put(context.Background(), "bkt", "k", nil); err == nil {
		t.Error("Put after Stop succeeded")
	}
}
