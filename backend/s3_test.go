package backend

import (
	"encoding/pem"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestHTTPRange(t *testing.T) {
	tests := []struct {
		off, n int64
		want   string
	}{
		{0, 1, "bytes=0-0"},
		{0, 8, "bytes=0-7"},
		{5, 1, "bytes=5-5"},
		{5, 10, "bytes=5-14"},
		{8 << 20, 8 << 20, "bytes=8388608-16777215"},
		{1 << 40, 1, "bytes=1099511627776-1099511627776"},
		{math.MaxInt64 - 9, 10, "bytes=9223372036854775798-9223372036854775807"},
	}
	for _, tc := range tests {
		if got := httpRange(tc.off, tc.n); got != tc.want {
			t.Errorf("httpRange(%d, %d) = %q, want %q", tc.off, tc.n, got, tc.want)
		}
	}
}

// parseRange reads back a single "bytes=FIRST-LAST" range as RFC 9110
// defines it: both positions plain decimal digits.
func parseRange(t *testing.T, h string) (first, last int64) {
	t.Helper()
	spec, ok := strings.CutPrefix(h, "bytes=")
	if !ok {
		t.Fatalf("range %q does not start with bytes=", h)
	}
	a, b, ok := strings.Cut(spec, "-")
	if !ok || a == "" || b == "" || strings.Contains(spec, ",") {
		t.Fatalf("range %q is not a single FIRST-LAST range", h)
	}
	for _, s := range []string{a, b} {
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				t.Fatalf("range %q has a non-digit in %q", h, s)
			}
		}
	}
	first, err1 := strconv.ParseInt(a, 10, 64)
	last, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("range %q: %v %v", h, err1, err2)
	}
	return first, last
}

func FuzzRange(f *testing.F) {
	f.Add(int64(0), int64(1))
	f.Add(int64(7), int64(4096))
	f.Add(int64(1<<40), int64(8<<20))
	f.Add(int64(math.MaxInt64-1), int64(2))
	f.Fuzz(func(t *testing.T, off, n int64) {
		if off < 0 || n <= 0 || off > math.MaxInt64-n+1 {
			t.Skip() // outside Open's contract: the range must be addressable
		}
		h := httpRange(off, n)
		first, last := parseRange(t, h)
		if first != off || last != off+n-1 {
			t.Fatalf("httpRange(%d, %d) = %q, parses as [%d, %d]", off, n, h, first, last)
		}
		if last-first+1 != n {
			t.Fatalf("httpRange(%d, %d) = %q covers %d bytes", off, n, h, last-first+1)
		}
		// What a compliant server answers for that range must pass the check.
		cr := "bytes " + strconv.FormatInt(first, 10) + "-" + strconv.FormatInt(last, 10) + "/" + strconv.FormatInt(last+1, 10)
		if err := checkContentRange(cr, off); err != nil {
			t.Fatalf("checkContentRange(%q, %d) rejected the answer to %q: %v", cr, off, h, err)
		}
	})
}

func TestCheckContentRange(t *testing.T) {
	tests := []struct {
		cr   string
		off  int64
		ok   bool
		errs string // substring of the error when !ok
	}{
		// Answers to the range asked for.
		{"bytes 0-99/100", 0, true, ""},
		{"bytes 5-9/100", 5, true, ""},
		{"bytes 5-9/*", 5, true, ""},
		{"bytes 8388608-16777215/1073741824", 8 << 20, true, ""},
		{"bytes 9223372036854775806-9223372036854775806/9223372036854775807", math.MaxInt64 - 1, true, ""},
		// A server may shorten the end (object smaller than asked): the
		// start is what matters, the Reader checks the length.
		{"bytes 5-7/8", 5, true, ""},
		// No Content-Range: a plain 200 is the right data only from byte 0.
		{"", 0, true, ""},
		{"", 1, false, "ignored the Range"},
		{"", 8 << 20, false, "ignored the Range"},
		// The wrong start: the server ignored or misread the range.
		{"bytes 0-99/100", 5, false, "does not start at 5"},
		{"bytes 6-9/100", 5, false, "does not start at 5"},
		{"bytes 4-9/100", 5, false, "does not start at 5"},
		{"bytes 50-99/100", 5, false, "does not start at 5"},
		{"bytes -5-9/100", 5, false, "does not start at 5"},
		// Garbage.
		{"bytes", 0, false, "malformed"},
		{"bytes ", 0, false, "malformed"},
		{"bytes 5", 5, false, "malformed"},
		{"bytes */100", 5, false, "malformed"},
		{"bytes=5-9/100", 5, false, "malformed"},
		{"items 5-9/100", 5, false, "malformed"},
		{"Bytes 5-9/100", 5, false, "malformed"},
		{"5-9/100", 5, false, "malformed"},
		{"bytes x-9/100", 5, false, "does not start"},
		{"bytes 5x-9/100", 5, false, "does not start"},
		{"bytes -9/100", 0, false, "does not start"},
		{"bytes  5-9/100", 5, false, "does not start"},
		{"bytes 99999999999999999999-9/100", 5, false, "does not start"},
	}
	for _, tc := range tests {
		err := checkContentRange(tc.cr, tc.off)
		if tc.ok {
			if err != nil {
				t.Errorf("checkContentRange(%q, %d) = %v, want nil", tc.cr, tc.off, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("checkContentRange(%q, %d) = nil, want an error", tc.cr, tc.off)
		} else if !strings.Contains(err.Error(), tc.errs) {
			t.Errorf("checkContentRange(%q, %d) = %q, want it to contain %q", tc.cr, tc.off, err, tc.errs)
		}
	}
}

// FuzzContentRange: an answer that starts at the requested offset is always
// accepted, one that starts anywhere else is always rejected, and arbitrary
// text is only accepted when it names the requested start.
func FuzzContentRange(f *testing.F) {
	f.Add(int64(0), int64(0), "99/100", "bytes 0-99/100")
	f.Add(int64(5), int64(6), "9/*", "bytes 5-9/100")
	f.Add(int64(1<<30), int64(0), "x", "")
	f.Add(int64(3), int64(30), "", "bytes */10")
	f.Fuzz(func(t *testing.T, off, start int64, tail, raw string) {
		if off < 0 {
			t.Skip()
		}
		good := "bytes " + strconv.FormatInt(off, 10) + "-" + tail
		if err := checkContentRange(good, off); err != nil {
			t.Fatalf("checkContentRange(%q, %d) = %v, want nil", good, off, err)
		}
		if start != off {
			bad := "bytes " + strconv.FormatInt(start, 10) + "-" + tail
			if err := checkContentRange(bad, off); err == nil {
				t.Fatalf("checkContentRange(%q, %d) = nil: wrong start accepted", bad, off)
			}
		}
		if checkContentRange(raw, off) == nil {
			if raw == "" {
				if off != 0 {
					t.Fatalf("empty Content-Range accepted at offset %d", off)
				}
				return
			}
			rest, ok := strings.CutPrefix(raw, "bytes ")
			first, _, ok2 := strings.Cut(rest, "-")
			if !ok || !ok2 {
				t.Fatalf("checkContentRange(%q, %d) = nil for a malformed value", raw, off)
			}
			if v, err := strconv.ParseInt(first, 10, 64); err != nil || v != off {
				t.Fatalf("checkContentRange(%q, %d) = nil but the start is %q", raw, off, first)
			}
		}
	})
}

func TestHostNeedsPathStyle(t *testing.T) {
	tests := []struct {
		host string
		want bool
	}{
		{"127.0.0.1", true},
		{"10.0.0.5", true},
		{"192.168.1.20", true},
		{"::1", true},
		{"fd00::1", true},
		{"2001:db8::8a2e:370:7334", true},
		{"localhost", true},
		{"minio.localhost", true},
		{"a.b.localhost", true},
		{"s3.amazonaws.com", false},
		{"s3.us-west-2.amazonaws.com", false},
		{"tos-cn-beijing.volces.com", false},
		{"minio", false},
		{"minio.internal", false},
		{"localhost.example.com", false},
		{"mylocalhost", false},
		{"notlocalhost", false},
		{"localhostx", false},
		{"1.2.3", false},
		{"", false},
	}
	for _, tc := range tests {
		if got := hostNeedsPathStyle(tc.host); got != tc.want {
			t.Errorf("hostNeedsPathStyle(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
}

// listServer answers every ListObjectsV2 with one object on a page that
// claims more follow, continuing with token (none when empty).
func listServer(t *testing.T, token string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/xml")
		next := ""
		if token != "" {
			next = "<NextContinuationToken>" + token + "</NextContinuationToken>"
		}
		fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name><KeyCount>1</KeyCount>`+
			`<MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated>%s<Contents><Key>a</Key><Size>1</Size><ETag>"x"</ETag></Contents></ListBucketResult>`, next)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A server that says a listing goes on but gives no new token must fail
// the listing, not end it early (a partial tree) or loop on one page.
func TestS3ListNeedsNewContinuationToken(t *testing.T) {
	for name, token := range map[string]string{"no token": "", "same token again": "t1"} {
		t.Run(name, func(t *testing.T) {
			srv := listServer(t, token)
			st, err := NewS3(t.Context(), "bkt", Config{Endpoint: srv.URL, AccessKey: "a", SecretKey: "b"})
			if err != nil {
				t.Fatal(err)
			}
			pages := 0
			err = st.List(t.Context(), "", func(Object) error { pages++; return nil })
			if err == nil || !strings.Contains(err.Error(), "continuation token") {
				t.Fatalf("List after %d pages: %v, want an error about the continuation token", pages, err)
			}
		})
	}
}

// An endpoint that is not a plain [http(s)://]HOST[:PORT] is refused, and
// the error never repeats what may be a credential in it, whichever way
// it fails to parse, for both stores.
func TestEndpointErrorsNeverEchoSecrets(t *testing.T) {
	cases := []struct{ endpoint, want string }{
		{"http://user:s3cr3t@127.0.0.1:1", "user information"},
		{"https://AKLTxyz:wJalr/K7s3cr3t+bPx@tos-cn-beijing.volces.com", "not a URL"}, // '/' ends the host early
		{"http://u:s3cr3t%zz@127.0.0.1:1", "not a URL"},
		{"http://127.0.0.1:9000/?X-Amz-Security-Token=s3cr3t", "query"},
		{"http://127.0.0.1:9000/#s3cr3t", "fragment"},
		{"http://127.0.0.1:9000/s3cr3t", "path"},
		{"ftp://s3cr3t", "scheme"},
	}
	for _, kind := range []string{"S3", "TOS"} {
		for _, c := range cases {
			_, err := parseEndpoint(kind, c.endpoint)
			if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), c.want) ||
				!strings.Contains(err.Error(), "invalid "+kind+" endpoint") {
				t.Errorf("%s endpoint %q: %v, want an error about %q that hides the secret", kind, c.endpoint, err, c.want)
			}
		}
	}
	// Through the constructors, which reach logs and the model API.
	if _, err := NewS3(t.Context(), "bkt", Config{Endpoint: cases[1].endpoint, AccessKey: "a", SecretKey: "b"}); err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("NewS3: %v", err)
	}
	if _, err := tosEndpoint(cases[1].endpoint, "cn-beijing"); err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("tosEndpoint: %v", err)
	}
	for _, ok := range []string{"http://127.0.0.1:9000", "https://s3.example.com/", "s3.example.com:8443"} {
		if u, err := parseEndpoint("S3", ok); err != nil || u.Path != "" {
			t.Errorf("endpoint %q: %v %v, want it accepted as scheme://host", ok, u, err)
		}
	}
}

// AWS_CA_BUNDLE with a plain-HTTP endpoint: the SDK still speaks TLS to
// STS for web-identity credentials, which must trust the bundle's CA.
func TestCABundleWithHTTPEndpointKeepsSTS(t *testing.T) {
	sts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/xml")
		io.WriteString(w, `<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleWithWebIdentityResult>`+
			`<Credentials><AccessKeyId>AKID</AccessKeyId><SecretAccessKey>SECRET</SecretAccessKey><SessionToken>TOKEN</SessionToken>`+
			`<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>`)
	}))
	defer sts.Close()
	s3srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Authorization"), "AKID/") {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		w.Header().Set("Content-Type", "application/xml")
		io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name><KeyCount>1</KeyCount>`+
			`<IsTruncated>false</IsTruncated><Contents><Key>a</Key><Size>1</Size><ETag>"x"</ETag></Contents></ListBucketResult>`)
	}))
	defer s3srv.Close()
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bundle := write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: sts.Certificate().Raw}))
	empty := write("empty", nil)
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_CONFIG_FILE": empty, "AWS_SHARED_CREDENTIALS_FILE": empty, "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_CA_BUNDLE": bundle, "AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/r",
		"AWS_WEB_IDENTITY_TOKEN_FILE": write("token", []byte("jwt")), "AWS_ENDPOINT_URL_STS": sts.URL,
		"AWS_REGION": "us-east-1",
	} {
		t.Setenv(k, v)
	}
	st, err := NewS3(t.Context(), "bkt", Config{Endpoint: s3srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := st.List(t.Context(), "", func(Object) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("List over http:// with AWS_CA_BUNDLE and web-identity credentials: %d objects, %v", n, err)
	}
}
