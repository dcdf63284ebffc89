package testenv

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc64"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/volcengine/ve-tos-golang-sdk/v2/tos"
)

// TOSServer is an in-process server speaking the Volcengine TOS protocol as
// the native TOS SDK (ve-tos-golang-sdk v2) speaks it, over objects held in
// memory:
//
//   - path-style addressing, /{bucket} and /{bucket}/{key} (what the SDK
//     uses for an IP endpoint);
//   - TOS4-HMAC-SHA256 header signatures, verified in full against the
//     canonical request the SDK builds (method, URI-encoded path, sorted
//     query, signed content-type/x-tos-*/host headers, payload hash), with
//     the access key, credential scope, X-Tos-Date skew and optional
//     security token checked;
//   - PUT/HEAD/DELETE bucket; ListObjectsType2 (GET /{bucket}?list-type=2)
//     with prefix, delimiter, start-after, max-keys (at most 1000) and real
//     continuation tokens, answering JSON;
//   - PUT object (Content-MD5, X-Tos-Content-Sha256, user metadata; answers
//     ETag and X-Tos-Hash-Crc64ecma, which the SDK checks), HEAD and GET
//     object (single ranges → 206 with Content-Range, unsatisfiable → 416,
//     If-Match/If-Unmodified-Since → 412, If-None-Match/If-Modified-Since →
//     304), DELETE object;
//   - errors as JSON {Code, Message, RequestId, HostId, Resource, EC} with
//     X-Tos-Ec and X-Tos-Request-Id headers, and no body for HEAD.
//
// Only the EC values of NoSuchKey (0017-00000003) and NoSuchBucket
// (0006-00000001) are TOS's own (the SDK tests them); the others are
// placeholders of the form 9999-xxxxxxxx that no real TOS sends.
// Not implemented: virtual-host addressing, pre-signed URLs, multipart
// uploads, versioning, ACLs and other sub-resources (answered 501).
type TOSServer struct {
	Endpoint string // http://127.0.0.1:PORT
	Region   string // the region requests must be signed for

	srv *http.Server
	ln  net.Listener

	mu      sync.RWMutex
	buckets map[string]*tosBucket
	creds   map[string]tosCred
	hook    func(http.ResponseWriter, *http.Request) bool

	seq      atomic.Uint64
	requests atomic.Int64

	clientOnce sync.Once
	client     *tos.ClientV2
	clientErr  error
}

type tosCred struct{ secret, token string }

type tosBucket struct {
	objects map[string]*tosObject
}

// tosObject is immutable once stored: a PUT replaces the pointer.
type tosObject struct {
	data        []byte
	etag        string // quoted, as TOS sends it
	crc         uint64 // CRC-64/ECMA-182 as the SDK computes it
	modTime     time.Time
	contentType string
	meta        http.Header // X-Tos-Meta-* headers as stored
}

// TOS limits the test server enforces.
const (
	tosMaxKeys   = 1000 // objects per listing page
	tosMaxKeyLen = 696  // bytes in an object key
	tosMaxSkew   = 15 * time.Minute
	tosHostID    = "modelfs-testenv-tos"
	tosOwnerID   = "modelfs-test-owner"
)

var crcTable = crc64.MakeTable(crc64.ECMA)

// StartTOS starts a TOS server on a free loopback port. It knows the test
// credentials AccessKey/SecretKey, signed for Region, and no buckets.
func StartTOS() (*TOSServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &TOSServer{
		Endpoint: "http://" + ln.Addr().String(),
		Region:   Region,
		ln:       ln,
		buckets:  make(map[string]*tosBucket),
		creds:    map[string]tosCred{AccessKey: {secret: SecretKey}},
	}
	// A plain handler, not a ServeMux: a mux would "clean" keys holding
	// "//" or ".." and redirect.
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

// Stop closes the listener and every connection.
func (s *TOSServer) Stop() {
	s.srv.Close()
	s.clientOnce.Do(func() { s.clientErr = errTOSStopped }) // also orders s.client before the read below
	if s.client != nil {
		s.client.Close()
	}
}

// AddCredentials lets another access key in; a non-empty token must then
// come with every request of that key as X-Tos-Security-Token (temporary
// credentials).
func (s *TOSServer) AddCredentials(accessKey, secretKey, token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.creds[accessKey] = tosCred{secret: secretKey, token: token}
}

// SetHook installs fn, called for every authenticated request before it is
// served; when fn returns true it has answered the request itself (a fault:
// an error status, a wrong range, a stalled body). nil removes the hook.
func (s *TOSServer) SetHook(fn func(w http.ResponseWriter, r *http.Request) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hook = fn
}

// Requests counts the requests received, refused ones included.
func (s *TOSServer) Requests() int64 { return s.requests.Load() }

// Client returns the server's own TOS SDK client (test credentials, no
// retries), shared by CreateBucket and Put. Stop closes it.
func (s *TOSServer) Client() (*tos.ClientV2, error) {
	s.clientOnce.Do(func() {
		s.client, s.clientErr = tos.NewClientV2(s.Endpoint,
			tos.WithRegion(s.Region),
			tos.WithCredentials(tos.NewStaticCredentials(AccessKey, SecretKey)),
			tos.WithMaxRetryCount(0))
	})
	return s.client, s.clientErr
}

// CreateBucket makes a bucket through the TOS API.
func (s *TOSServer) CreateBucket(ctx context.Context, bucket string) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	_, err = c.CreateBucketV2(ctx, &tos.CreateBucketV2Input{Bucket: bucket})
	return err
}

// Put uploads one object through the TOS API (replacing any object of that
// key with new content and a new ETag).
func (s *TOSServer) Put(ctx context.Context, bucket, key string, data []byte) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	_, err = c.PutObjectV2(ctx, &tos.PutObjectV2Input{
		PutObjectBasicInput: tos.PutObjectBasicInput{Bucket: bucket, Key: key, ContentLength: int64(len(data))},
		Content:             bytes.NewReader(data),
	})
	return err
}

// tosError is one error answer.
type tosError struct {
	status        int
	code, message string
}

func (e *tosError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.message) }

func tosErrorf(status int, code, format string, args ...any) *tosError {
	return &tosError{status: status, code: code, message: fmt.Sprintf(format, args...)}
}

// tosEC gives the X-Tos-Ec value of an error code. See TOSServer.
func tosEC(code string) string {
	switch code {
	case "NoSuchKey":
		return "0017-00000003"
	case "NoSuchBucket":
		return "0006-00000001"
	}
	var h uint32 = 2166136261 // FNV-1a: a stable placeholder per code
	for i := 0; i < len(code); i++ {
		h = (h ^ uint32(code[i])) * 16777619
	}
	return fmt.Sprintf("9999-%08d", h%100000000)
}

func (s *TOSServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	id := fmt.Sprintf("%016x%08x", time.Now().UnixNano(), s.seq.Add(1))
	h := w.Header()
	h.Set("X-Tos-Request-Id", id)
	h.Set("X-Tos-Id-2", tosHostID)
	h.Set("Server", tosHostID)

	bucket, key := "", ""
	if p, ok := strings.CutPrefix(r.URL.Path, "/"); ok {
		bucket, key, _ = strings.Cut(p, "/")
	}
	resource := "/" + bucket
	if key != "" {
		resource += "/" + key
	}
	fail := func(e *tosError) { s.writeError(w, r, e, id, resource) }

	var body []byte
	if r.Method == http.MethodPut {
		// Read first: the payload hash may be signed. The server answers
		// Expect: 100-continue on this first read.
		var err error
		if body, err = io.ReadAll(io.LimitReader(r.Body, 5<<30+1)); err != nil {
			fail(tosErrorf(http.StatusBadRequest, "IncompleteBody", "reading the request body: %v", err))
			return
		}
		if len(body) > 5<<30 {
			fail(tosErrorf(http.StatusBadRequest, "EntityTooLarge", "an object holds at most 5 GiB in one PUT"))
			return
		}
	}
	if e := s.authenticate(r, body); e != nil {
		fail(e)
		return
	}
	s.mu.RLock()
	hook := s.hook
	s.mu.RUnlock()
	if hook != nil && hook(w, r) {
		return
	}
	var e *tosError
	switch {
	case bucket == "":
		e = tosErrorf(http.StatusNotImplemented, "NotImplemented", "ListBuckets is not implemented by this test server")
	case key == "":
		e = s.serveBucket(w, r, bucket, body)
	default:
		e = s.serveObject(w, r, bucket, key, body)
	}
	if e != nil {
		fail(e)
	}
}

func (s *TOSServer) writeError(w http.ResponseWriter, r *http.Request, e *tosError, id, resource string) {
	h := w.Header()
	h.Set("X-Tos-Ec", tosEC(e.code))
	if r.Method == http.MethodHead {
		h.Set("Content-Length", "0")
		w.WriteHeader(e.status)
		return
	}
	b, _ := json.Marshal(struct {
		Code      string `json:"Code"`
		Message   string `json:"Message"`
		RequestID string `json:"RequestId"`
		HostID    string `json:"HostId"`
		Resource  string `json:"Resource"`
		EC        string `json:"EC"`
	}{e.code, e.message, id, tosHostID, resource, tosEC(e.code)})
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(e.status)
	w.Write(b)
}

// authenticate checks the TOS4-HMAC-SHA256 Authorization header the way the
// SDK computes it (tos/sign_v4.go):
//
//	canonical = METHOD \n URIEncode(path, keep "/") \n sorted query \n
//	            "name:value\n" per signed header \n signed;names \n payload hash
//	string to sign = TOS4-HMAC-SHA256 \n X-Tos-Date \n DATE/REGION/tos/request \n hex(sha256(canonical))
//	key = HMAC(HMAC(HMAC(HMAC(secret, DATE), REGION), "tos"), "request")
func (s *TOSServer) authenticate(r *http.Request, body []byte) *tosError {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		if r.URL.Query().Get("X-Tos-Algorithm") != "" {
			return tosErrorf(http.StatusForbidden, "AccessDenied", "pre-signed URLs are not supported by this test server")
		}
		return tosErrorf(http.StatusForbidden, "AccessDenied", "Access Denied: anonymous requests are refused")
	}
	alg, params, _ := strings.Cut(auth, " ")
	if alg != "TOS4-HMAC-SHA256" {
		return tosErrorf(http.StatusForbidden, "AccessDenied", "unsupported authorization algorithm %q, want TOS4-HMAC-SHA256", alg)
	}
	var credential, signedHeaders, signature string
	for _, p := range strings.Split(params, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		switch k {
		case "Credential":
			credential = v
		case "SignedHeaders":
			signedHeaders = v
		case "Signature":
			signature = v
		}
	}
	scope := strings.Split(credential, "/")
	if len(scope) != 5 || signedHeaders == "" || signature == "" {
		return tosErrorf(http.StatusForbidden, "AccessDenied", "malformed Authorization header")
	}
	ak, date, region, service, terminal := scope[0], scope[1], scope[2], scope[3], scope[4]
	s.mu.RLock()
	cred, ok := s.creds[ak]
	s.mu.RUnlock()
	if !ok {
		return tosErrorf(http.StatusForbidden, "InvalidAccessKeyId", "The access key ID you provided does not exist in our records.")
	}
	xdate := r.Header.Get("X-Tos-Date")
	when, err := time.Parse("20060102T150405Z", xdate)
	if err != nil {
		return tosErrorf(http.StatusForbidden, "AccessDenied", "missing or malformed X-Tos-Date header %q", xdate)
	}
	if d := time.Since(when); d > tosMaxSkew || d < -tosMaxSkew {
		return tosErrorf(http.StatusForbidden, "RequestTimeTooSkewed",
			"The difference between the request time and the server's time is too large.")
	}
	if date != xdate[:8] || region != s.Region || service != "tos" || terminal != "request" {
		return tosErrorf(http.StatusForbidden, "SignatureDoesNotMatch",
			"credential scope %s/%s/%s/%s does not match %s/%s/tos/request", date, region, service, terminal, xdate[:8], s.Region)
	}
	names := strings.Split(signedHeaders, ";")
	if !slices.IsSorted(names) || !slices.Contains(names, "host") || !slices.Contains(names, "x-tos-date") {
		return tosErrorf(http.StatusForbidden, "SignatureDoesNotMatch", "SignedHeaders %q must be sorted and hold host and x-tos-date", signedHeaders)
	}
	for k := range r.Header {
		lk := strings.ToLower(k)
		if (lk == "content-type" || strings.HasPrefix(lk, "x-tos-")) && !slices.Contains(names, lk) {
			return tosErrorf(http.StatusForbidden, "AccessDenied", "header %s is present in the request but not signed", k)
		}
	}
	token := r.Header.Get("X-Tos-Security-Token")
	if token != cred.token {
		return tosErrorf(http.StatusForbidden, "InvalidToken", "The provided security token is missing or invalid.")
	}

	var c strings.Builder
	c.WriteString(r.Method + "\n")
	path := r.URL.Path
	if path == "" {
		path = "/"
	}
	c.WriteString(tosURIEncode(path, false) + "\n")
	c.WriteString(tosCanonicalQuery(r.URL.Query()) + "\n")
	for _, n := range names {
		var vals []string
		if n == "host" {
			vals = []string{r.Host}
		} else {
			vals = r.Header.Values(n)
		}
		norm := make([]string, len(vals))
		for i, v := range vals {
			norm[i] = strings.Join(strings.Fields(v), " ")
		}
		c.WriteString(n + ":" + strings.Join(norm, ",") + "\n")
	}
	c.WriteString("\n" + signedHeaders + "\n")
	payload := r.Header.Get("X-Tos-Content-Sha256")
	if payload == "" {
		payload = hex.EncodeToString(sha256.New().Sum(nil)) // what the SDK signs without the header
	}
	c.WriteString(payload)
	sum := sha256.Sum256([]byte(c.String()))
	toSign := "TOS4-HMAC-SHA256\n" + xdate + "\n" + date + "/" + region + "/tos/request\n" + hex.EncodeToString(sum[:])
	k := tosHMAC([]byte(cred.secret), date)
	k = tosHMAC(k, region)
	k = tosHMAC(k, "tos")
	k = tosHMAC(k, "request")
	want := hex.EncodeToString(tosHMAC(k, toSign))
	if !hmac.Equal([]byte(want), []byte(signature)) {
		return tosErrorf(http.StatusForbidden, "SignatureDoesNotMatch",
			"The request signature we calculated does not match the signature you provided. Check your key and signing method.")
	}
	if p := r.Header.Get("X-Tos-Content-Sha256"); p != "" && p != "UNSIGNED-PAYLOAD" {
		got := sha256.Sum256(body)
		if hex.EncodeToString(got[:]) != strings.ToLower(p) {
			return tosErrorf(http.StatusBadRequest, "BadDigest", "the body does not match X-Tos-Content-Sha256")
		}
	}
	return nil
}

func tosHMAC(key []byte, s string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(s))
	return m.Sum(nil)
}

// tosURIEncode percent-encodes every byte but A-Z a-z 0-9 - _ . ~ (and "/"
// unless encodeSlash), upper-case hex: RFC 3986 as TOS signs it.
func tosURIEncode(s string, encodeSlash bool) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == '~':
			b.WriteByte(c)
		case c == '/' && !encodeSlash:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// tosCanonicalQuery sorts the parameters by name, keeping each name's values
// in order, and leaves out the signature itself.
func tosCanonicalQuery(q url.Values) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if strings.ToLower(k) == "x-tos-signature" {
			continue
		}
		for _, v := range q[k] {
			parts = append(parts, tosURIEncode(k, true)+"="+tosURIEncode(v, true))
		}
	}
	return strings.Join(parts, "&")
}

// validTOSBucket applies TOS's bucket naming rules.
func validTOSBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 || b[0] == '-' || b[len(b)-1] == '-' {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func (s *TOSServer) serveBucket(w http.ResponseWriter, r *http.Request, bucket string, body []byte) *tosError {
	switch r.Method {
	case http.MethodPut:
		if len(r.URL.Query()) > 0 {
			return tosErrorf(http.StatusNotImplemented, "NotImplemented", "bucket sub-resources are not implemented by this test server")
		}
		if !validTOSBucket(bucket) {
			return tosErrorf(http.StatusBadRequest, "InvalidBucketName", "The specified bucket is not valid.")
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.buckets[bucket]; ok {
			return tosErrorf(http.StatusConflict, "BucketAlreadyExists", "The requested bucket name is not available.")
		}
		s.buckets[bucket] = &tosBucket{objects: make(map[string]*tosObject)}
		w.Header().Set("Location", "/"+bucket)
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return nil
	case http.MethodHead:
		if s.bucket(bucket) == nil {
			return tosErrorf(http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist.")
		}
		w.Header().Set("X-Tos-Bucket-Region", s.Region)
		w.Header().Set("X-Tos-Storage-Class", "STANDARD")
		w.WriteHeader(http.StatusOK)
		return nil
	case http.MethodDelete:
		s.mu.Lock()
		defer s.mu.Unlock()
		b := s.buckets[bucket]
		switch {
		case b == nil:
			return tosErrorf(http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist.")
		case len(b.objects) > 0:
			return tosErrorf(http.StatusConflict, "BucketNotEmpty", "The bucket you tried to delete is not empty.")
		}
		delete(s.buckets, bucket)
		w.WriteHeader(http.StatusNoContent)
		return nil
	case http.MethodGet:
		return s.list(w, r, bucket)
	}
	return tosErrorf(http.StatusMethodNotAllowed, "MethodNotAllowed", "%s is not allowed on a bucket", r.Method)
}

func (s *TOSServer) bucket(name string) *tosBucket {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.buckets[name]
}

// tosListed is one entry of Contents, with the field names and formats the
// SDK's listObjectsType2Output decodes.
type tosListed struct {
	Key           string    `json:"Key"`
	LastModified  string    `json:"LastModified"`
	ETag          string    `json:"ETag"`
	Size          int64     `json:"Size"`
	Owner         *tosOwner `json:"Owner,omitempty"`
	StorageClass  string    `json:"StorageClass"`
	HashCrc64ecma string    `json:"HashCrc64ecma"`
	Type          string    `json:"Type,omitempty"`
}

type tosOwner struct {
	ID          string `json:"ID"`
	DisplayName string `json:"DisplayName"`
}

type tosPrefix struct {
	Prefix string `json:"Prefix"`
}

type tosListOutput struct {
	Name                  string      `json:"Name"`
	Prefix                string      `json:"Prefix"`
	StartAfter            string      `json:"StartAfter,omitempty"`
	ContinuationToken     string      `json:"ContinuationToken,omitempty"`
	KeyCount              int         `json:"KeyCount"`
	MaxKeys               int         `json:"MaxKeys"`
	Delimiter             string      `json:"Delimiter,omitempty"`
	IsTruncated           bool        `json:"IsTruncated"`
	NextContinuationToken string      `json:"NextContinuationToken,omitempty"`
	CommonPrefixes        []tosPrefix `json:"CommonPrefixes"`
	Contents              []tosListed `json:"Contents"`
}

// list serves ListObjectsType2. A continuation token is the base64 of the
// last key ("k" + key) or common prefix ("p" + prefix) of the page before.
func (s *TOSServer) list(w http.ResponseWriter, r *http.Request, bucket string) *tosError {
	q := r.URL.Query()
	if q.Get("list-type") != "2" {
		return tosErrorf(http.StatusNotImplemented, "NotImplemented", "only ListObjectsType2 (list-type=2) is implemented by this test server")
	}
	if q.Get("encoding-type") != "" {
		return tosErrorf(http.StatusBadRequest, "InvalidArgument", "encoding-type is not supported by this test server")
	}
	prefix, delim := q.Get("prefix"), q.Get("delimiter")
	maxKeys := tosMaxKeys
	if v := q.Get("max-keys"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return tosErrorf(http.StatusBadRequest, "InvalidArgument", "invalid max-keys %q", v)
		}
		maxKeys = min(n, tosMaxKeys)
	}
	after := q.Get("start-after")
	token := q.Get("continuation-token")
	rolledUp := "" // the common prefix that ended the page before
	if token != "" {
		raw, err := base64.RawURLEncoding.DecodeString(token)
		if err != nil || len(raw) == 0 || (raw[0] != 'k' && raw[0] != 'p') {
			return tosErrorf(http.StatusBadRequest, "InvalidArgument", "The continuation token provided is incorrect.")
		}
		after = string(raw[1:])
		if raw[0] == 'p' {
			rolledUp = after
		}
	}
	s.mu.RLock()
	b := s.buckets[bucket]
	var keys []string
	var objs map[string]*tosObject
	if b != nil {
		objs = maps.Clone(b.objects)
	}
	s.mu.RUnlock()
	if b == nil {
		return tosErrorf(http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist.")
	}
	for k := range objs {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // byte order, as TOS lists

	out := tosListOutput{Name: bucket, Prefix: prefix, StartAfter: q.Get("start-after"), ContinuationToken: token,
		MaxKeys: maxKeys, Delimiter: delim, CommonPrefixes: []tosPrefix{}, Contents: []tosListed{}}
	owner := (*tosOwner)(nil)
	if q.Get("fetch-owner") == "true" {
		owner = &tosOwner{ID: tosOwnerID, DisplayName: tosOwnerID}
	}
	last, lastIsPrefix := after, false // last entry returned, for the next token
	for _, k := range keys {
		if k <= after || (rolledUp != "" && strings.HasPrefix(k, rolledUp)) {
			continue // before the page or inside the common prefix that ended the page before
		}
		entry, isPrefix := k, false
		if delim != "" {
			if i := strings.Index(k[len(prefix):], delim); i >= 0 {
				entry, isPrefix = k[:len(prefix)+i+len(delim)], true
			}
		}
		if isPrefix && entry == last {
			continue // already rolled up
		}
		if out.KeyCount == maxKeys {
			out.IsTruncated = true
			break
		}
		if isPrefix {
			out.CommonPrefixes = append(out.CommonPrefixes, tosPrefix{Prefix: entry})
		} else {
			o := objs[k]
			out.Contents = append(out.Contents, tosListed{
				Key: k, LastModified: o.modTime.UTC().Format("2006-01-02T15:04:05.000Z"), ETag: o.etag,
				Size: int64(len(o.data)), Owner: owner, StorageClass: "STANDARD",
				HashCrc64ecma: strconv.FormatUint(o.crc, 10), Type: "Normal",
			})
		}
		out.KeyCount++
		last, lastIsPrefix = entry, isPrefix
	}
	if out.IsTruncated {
		kind := "k"
		if lastIsPrefix {
			kind = "p"
		}
		out.NextContinuationToken = base64.RawURLEncoding.EncodeToString([]byte(kind + last))
	}
	b2, err := json.Marshal(out)
	if err != nil {
		return tosErrorf(http.StatusInternalServerError, "InternalError", "%v", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b2)))
	w.WriteHeader(http.StatusOK)
	w.Write(b2)
	return nil
}

func (s *TOSServer) serveObject(w http.ResponseWriter, r *http.Request, bucket, key string, body []byte) *tosError {
	if len(r.URL.Query()) > 0 {
		return tosErrorf(http.StatusNotImplemented, "NotImplemented", "object sub-resources and query parameters are not implemented by this test server")
	}
	if len(key) > tosMaxKeyLen {
		return tosErrorf(http.StatusBadRequest, "KeyTooLong", "Your key is too long.")
	}
	switch r.Method {
	case http.MethodPut:
		return s.putObject(w, r, bucket, key, body)
	case http.MethodGet, http.MethodHead:
		return s.getObject(w, r, bucket, key)
	case http.MethodDelete:
		s.mu.Lock()
		defer s.mu.Unlock()
		b := s.buckets[bucket]
		if b == nil {
			return tosErrorf(http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist.")
		}
		delete(b.objects, key)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return tosErrorf(http.StatusMethodNotAllowed, "MethodNotAllowed", "%s is not allowed on an object", r.Method)
}

func (s *TOSServer) putObject(w http.ResponseWriter, r *http.Request, bucket, key string, body []byte) *tosError {
	if v := r.Header.Get("Content-MD5"); v != "" {
		want, err := base64.StdEncoding.DecodeString(v)
		if err != nil || len(want) != md5.Size {
			return tosErrorf(http.StatusBadRequest, "InvalidDigest", "The Content-MD5 you specified is not valid.")
		}
		if got := md5.Sum(body); !bytes.Equal(got[:], want) {
			return tosErrorf(http.StatusBadRequest, "BadDigest", "The Content-MD5 you specified did not match what we received.")
		}
	}
	sum := md5.Sum(body)
	o := &tosObject{
		data:        body,
		etag:        `"` + hex.EncodeToString(sum[:]) + `"`,
		crc:         crc64.Checksum(body, crcTable),
		modTime:     time.Now().UTC().Truncate(time.Second), // Last-Modified has whole seconds
		contentType: r.Header.Get("Content-Type"),
		meta:        make(http.Header),
	}
	if o.contentType == "" {
		o.contentType = "application/octet-stream"
	}
	for k, v := range r.Header {
		if strings.HasPrefix(k, "X-Tos-Meta-") {
			o.meta[k] = v
		}
	}
	s.mu.Lock()
	b := s.buckets[bucket]
	if b != nil {
		b.objects[key] = o
	}
	s.mu.Unlock()
	if b == nil {
		return tosErrorf(http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist.")
	}
	h := w.Header()
	h.Set("ETag", o.etag)
	h.Set("X-Tos-Hash-Crc64ecma", strconv.FormatUint(o.crc, 10))
	h.Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
	return nil
}

func (s *TOSServer) getObject(w http.ResponseWriter, r *http.Request, bucket, key string) *tosError {
	s.mu.RLock()
	b := s.buckets[bucket]
	var o *tosObject
	if b != nil {
		o = b.objects[key]
	}
	s.mu.RUnlock()
	switch {
	case b == nil:
		return tosErrorf(http.StatusNotFound, "NoSuchBucket", "The specified bucket does not exist.")
	case o == nil:
		return tosErrorf(http.StatusNotFound, "NoSuchKey", "The specified key does not exist.")
	}
	h := w.Header()
	h.Set("ETag", o.etag)
	h.Set("Last-Modified", o.modTime.Format(http.TimeFormat))
	h.Set("Accept-Ranges", "bytes")
	// Conditions in RFC 9110 order.
	if im := r.Header.Get("If-Match"); im != "" {
		if !tosETagIn(o.etag, im) {
			return tosErrorf(http.StatusPreconditionFailed, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.")
		}
	} else if ius := r.Header.Get("If-Unmodified-Since"); ius != "" {
		if t, err := http.ParseTime(ius); err == nil && o.modTime.After(t) {
			return tosErrorf(http.StatusPreconditionFailed, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold.")
		}
	}
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		if tosETagIn(o.etag, inm) {
			w.WriteHeader(http.StatusNotModified)
			return nil
		}
	} else if ims := r.Header.Get("If-Modified-Since"); ims != "" {
		if t, err := http.ParseTime(ims); err == nil && !o.modTime.After(t) {
			w.WriteHeader(http.StatusNotModified)
			return nil
		}
	}
	size := int64(len(o.data))
	h.Set("Content-Type", o.contentType)
	h.Set("X-Tos-Hash-Crc64ecma", strconv.FormatUint(o.crc, 10)) // of the whole object, also on a 206
	h.Set("X-Tos-Storage-Class", "STANDARD")
	h.Set("X-Tos-Object-Type", "Normal")
	maps.Copy(h, o.meta)
	first, last, ranged, satisfiable := tosParseRange(r.Header.Get("Range"), size)
	if r.Method == http.MethodHead || !ranged {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			w.Write(o.data)
		}
		return nil
	}
	if !satisfiable {
		h.Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
		return tosErrorf(http.StatusRequestedRangeNotSatisfiable, "InvalidRange", "The requested range is not satisfiable.")
	}
	h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first, last, size))
	h.Set("Content-Length", strconv.FormatInt(last-first+1, 10))
	w.WriteHeader(http.StatusPartialContent)
	w.Write(o.data[first : last+1])
	return nil
}

// tosETagIn reports whether etag matches the If-Match / If-None-Match list
// (quoted or bare, "*" for any).
func tosETagIn(etag, list string) bool {
	e := strings.Trim(etag, `"`)
	for _, c := range strings.Split(list, ",") {
		c = strings.TrimPrefix(strings.TrimSpace(c), "W/")
		if c == "*" || strings.Trim(c, `"`) == e {
			return true
		}
	}
	return false
}

// tosParseRange reads a single "bytes=" range. A header that is absent,
// malformed or holds several ranges is ignored (ranged false), as RFC 9110
// allows; a well-formed range outside the object is unsatisfiable.
func tosParseRange(h string, size int64) (first, last int64, ranged, satisfiable bool) {
	spec, ok := strings.CutPrefix(h, "bytes=")
	if !ok || strings.Contains(spec, ",") {
		return 0, 0, false, false
	}
	a, z, ok := strings.Cut(strings.TrimSpace(spec), "-")
	if !ok {
		return 0, 0, false, false
	}
	digits := func(s string) bool {
		return s != "" && strings.Trim(s, "0123456789") == ""
	}
	switch {
	case digits(a) && (z == "" || digits(z)):
		f, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return 0, 0, false, false
		}
		l := int64(math.MaxInt64) // "N-" and an overlong last position run to the end
		if z != "" {
			if v, err := strconv.ParseInt(z, 10, 64); err == nil {
				l = v
			}
			if l < f {
				return 0, 0, false, false // invalid: ignored
			}
		}
		if f >= size {
			return 0, 0, true, false
		}
		return f, min(l, size-1), true, true
	case a == "" && digits(z):
		n, err := strconv.ParseInt(z, 10, 64)
		if err != nil {
			n = math.MaxInt64
		}
		if n == 0 || size == 0 {
			return 0, 0, true, false
		}
		return max(size-n, 0), size - 1, true, true
	}
	return 0, 0, false, false
}

// errTOSStopped is what Client returns after Stop.
var errTOSStopped = errors.New("tos test server stopped")
