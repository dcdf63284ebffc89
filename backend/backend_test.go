package backend

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestParseURI(t *testing.T) {
	long := strings.Repeat("a", 63)
	tests := []struct {
		in      string
		want    Location
		wantErr string // substring of the error; "" means success
	}{
		// Valid, with and without a prefix.
		{in: "s3://bucket", want: Location{Scheme: "s3", Bucket: "bucket"}},
		{in: "tos://bucket", want: Location{Scheme: "tos", Bucket: "bucket"}},
		{in: "s3://bucket/", want: Location{Scheme: "s3", Bucket: "bucket"}},
		{in: "tos://bucket/", want: Location{Scheme: "tos", Bucket: "bucket"}},
		{in: "s3://bucket/models", want: Location{Scheme: "s3", Bucket: "bucket", Prefix: "models/"}},
		{in: "s3://bucket/models/", want: Location{Scheme: "s3", Bucket: "bucket", Prefix: "models/"}},
		{in: "tos://my.bucket-1/org/llama-3-8b", want: Location{Scheme: "tos", Bucket: "my.bucket-1", Prefix: "org/llama-3-8b/"}},
		{in: "s3://b-2/a/b/c/", want: Location{Scheme: "s3", Bucket: "b-2", Prefix: "a/b/c/"}},
		{in: "s3://123/x", want: Location{Scheme: "s3", Bucket: "123", Prefix: "x/"}},
		{in: "s3://" + long + "/p", want: Location{Scheme: "s3", Bucket: long, Prefix: "p/"}},
		// Anything but control characters is allowed in a prefix.
		{in: "s3://bucket/Über Model/v1.0", want: Location{Scheme: "s3", Bucket: "bucket", Prefix: "Über Model/v1.0/"}},
		{in: "s3://bucket/a:b/c", want: Location{Scheme: "s3", Bucket: "bucket", Prefix: "a:b/c/"}},
		{in: "s3://bucket/a://b", wantErr: "empty path element"},

		// Scheme problems.
		{in: "", wantErr: "invalid model URI"},
		{in: "bucket/prefix", wantErr: "invalid model URI"},
		{in: "://bucket", wantErr: "invalid model URI"},
		{in: "gs://bucket", wantErr: "unsupported URI scheme"},
		{in: "S3://bucket", wantErr: "unsupported URI scheme"},
		{in: "https://bucket", wantErr: "unsupported URI scheme"},
		{in: "s3:/bucket", wantErr: "invalid model URI"},

		// Bucket rules.
		{in: "s3://", wantErr: "missing bucket"},
		{in: "s3:///prefix", wantErr: "missing bucket"},
		{in: "s3://ab", wantErr: "3 to 63"},
		{in: "s3://" + long + "a", wantErr: "3 to 63"},
		{in: "s3://Bucket", wantErr: "lower-case"},
		{in: "s3://buck_et", wantErr: "lower-case"},
		{in: "s3://buck et", wantErr: "lower-case"},
		{in: "s3://bucket:9000/x", wantErr: "lower-case"},
		{in: "s3://-bucket", wantErr: "start and end"},
		{in: "s3://bucket-", wantErr: "start and end"},
		{in: "s3://.bucket", wantErr: "start and end"},
		{in: "s3://bucket./x", wantErr: "start and end"},

		// Prefix problems.
		{in: "s3://bucket//", wantErr: "empty path element"},
		{in: "s3://bucket//models", wantErr: "empty path element"},
		{in: "s3://bucket/a//b", wantErr: "empty path element"},
		{in: "s3://bucket/a/b//", wantErr: "empty path element"},
		{in: "s3://bucket/a\x00b", wantErr: "control character"},
		{in: "s3://bucket/a\nb/", wantErr: "control character"},
		{in: "s3://bucket/a\tb", wantErr: "control character"},
		{in: "s3://bucket/a\x7f", wantErr: "control character"},
		{in: "s3://bucket/\x1f", wantErr: "control character"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			got, err := ParseURI(tc.in)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("ParseURI(%q) = %+v, want error containing %q", tc.in, got, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseURI(%q) error %q, want it to contain %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseURI(%q): %v", tc.in, err)
			}
			if got != tc.want {
				t.Fatalf("ParseURI(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

// ParseURI accepts every scheme the package lists as served.
func TestParseURISchemes(t *testing.T) {
	for _, s := range Schemes {
		loc, err := ParseURI(s + "://bucket/p")
		if err != nil {
			t.Fatalf("scheme %q listed in Schemes but rejected: %v", s, err)
		}
		if loc.Scheme != s {
			t.Fatalf("scheme %q parsed as %q", s, loc.Scheme)
		}
	}
}

func TestLocationStringRoundTrip(t *testing.T) {
	for _, in := range []string{
		"s3://bucket", "s3://bucket/", "tos://bucket/a", "tos://bucket/a/",
		"s3://b.c-d/x/y/z", "s3://abc/a b/ü/", "s3://abc/a:b/",
	} {
		loc, err := ParseURI(in)
		if err != nil {
			t.Fatalf("ParseURI(%q): %v", in, err)
		}
		s := loc.String()
		if !strings.HasSuffix(s, "/") {
			t.Errorf("%q.String() = %q, want a trailing slash", in, s)
		}
		again, err := ParseURI(s)
		if err != nil {
			t.Fatalf("ParseURI(%q) (String of %q): %v", s, in, err)
		}
		if again != loc {
			t.Errorf("round trip of %q: %+v -> %q -> %+v", in, loc, s, again)
		}
		if again.String() != s {
			t.Errorf("String not canonical: %q then %q", s, again.String())
		}
	}
}

func TestLocationString(t *testing.T) {
	tests := []struct {
		loc  Location
		want string
	}{
		{Location{Scheme: "s3", Bucket: "bucket"}, "s3://bucket/"},
		{Location{Scheme: "tos", Bucket: "bucket", Prefix: "a/b/"}, "tos://bucket/a/b/"},
	}
	for _, tc := range tests {
		if got := tc.loc.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.loc, got, tc.want)
		}
	}
}

func TestLocationName(t *testing.T) {
	tests := []struct {
		uri  string
		want string
	}{
		{"s3://bucket", "bucket"},
		{"s3://bucket/", "bucket"},
		{"s3://bucket/model", "model"},
		{"s3://bucket/model/", "model"},
		{"tos://bucket/org/llama-3-8b", "llama-3-8b"},
		{"tos://bucket/org/llama-3-8b/", "llama-3-8b"},
		{"s3://bucket/a/b/c/v1.0", "v1.0"},
	}
	for _, tc := range tests {
		loc, err := ParseURI(tc.uri)
		if err != nil {
			t.Fatalf("ParseURI(%q): %v", tc.uri, err)
		}
		if got := loc.Name(); got != tc.want {
			t.Errorf("ParseURI(%q).Name() = %q, want %q", tc.uri, got, tc.want)
		}
	}
}

func TestValidBucket(t *testing.T) {
	for _, b := range []string{"abc", "a-b", "a.b", "0ab", "ab9", "a--b", "a..b", strings.Repeat("z", 63)} {
		if err := validBucket(b); err != nil {
			t.Errorf("validBucket(%q) = %v, want nil", b, err)
		}
	}
	for _, b := range []string{"", "ab", strings.Repeat("z", 64), "ABC", "a_b", "-ab", "ab-", ".ab", "ab.", "a/b", "a b", "ab\x00", "äbc"} {
		if err := validBucket(b); err == nil {
			t.Errorf("validBucket(%q) = nil, want an error", b)
		}
	}
}

func FuzzParseURI(f *testing.F) {
	for _, s := range []string{
		"s3://bucket", "tos://bucket/", "s3://bucket/a/b", "s3://bucket/a/b/",
		"s3://bucket//a", "s3://bucket/a//b", "gs://bucket", "s3://AB", "s3://a\x00b/c",
		"s3://bucket/a\x7f", "://", "s3://", "s3:///", "tos://b.c-d/x://y", "s3://abc/\xff/",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		loc, err := ParseURI(s)
		if err != nil {
			if loc.Bucket != "" || loc.Prefix != "" {
				t.Fatalf("ParseURI(%q) failed (%v) but returned a partial location %+v", s, err, loc)
			}
			return
		}
		if loc.Scheme != "s3" && loc.Scheme != "tos" {
			t.Fatalf("ParseURI(%q): scheme %q", s, loc.Scheme)
		}
		if !strings.HasPrefix(s, loc.Scheme+"://"+loc.Bucket) {
			t.Fatalf("ParseURI(%q) = %+v: scheme and bucket are not the URI's", s, loc)
		}
		if err := validBucket(loc.Bucket); err != nil {
			t.Fatalf("ParseURI(%q) accepted bucket %q: %v", s, loc.Bucket, err)
		}
		if p := loc.Prefix; p != "" {
			if !strings.HasSuffix(p, "/") {
				t.Fatalf("ParseURI(%q): prefix %q does not end in /", s, p)
			}
			if strings.HasPrefix(p, "/") {
				t.Fatalf("ParseURI(%q): prefix %q starts with /", s, p)
			}
			if strings.Contains(p, "//") {
				t.Fatalf("ParseURI(%q): prefix %q has an empty element", s, p)
			}
			for i := 0; i < len(p); i++ {
				if p[i] < 0x20 || p[i] == 0x7f {
					t.Fatalf("ParseURI(%q): prefix %q has control byte %#x", s, p, p[i])
				}
			}
		}
		name := loc.Name()
		if name == "" || strings.Contains(name, "/") {
			t.Fatalf("ParseURI(%q).Name() = %q", s, name)
		}
		again, err := ParseURI(loc.String())
		if err != nil {
			t.Fatalf("ParseURI(%q) = %+v but its String %q does not parse: %v", s, loc, loc.String(), err)
		}
		if again != loc {
			t.Fatalf("round trip of %q: %+v -> %q -> %+v", s, loc, loc.String(), again)
		}
	})
}

func TestPermanentAndWithKind(t *testing.T) {
	inner := errors.New("api error NoSuchKey: The specified key does not exist")
	kinds := []error{ErrNotExist, ErrNoBucket, ErrPrecondition, ErrAccess}
	for _, kind := range kinds {
		err := WithKind(kind, inner)
		if !errors.Is(err, kind) {
			t.Errorf("errors.Is(WithKind(%v, ...), %v) = false", kind, kind)
		}
		if !errors.Is(err, inner) {
			t.Errorf("WithKind(%v, inner) does not wrap inner", kind)
		}
		for _, other := range kinds {
			if other != kind && errors.Is(err, other) {
				t.Errorf("WithKind(%v, ...) also matches %v", kind, other)
			}
		}
		msg := err.Error()
		if !strings.Contains(msg, kind.Error()) || !strings.Contains(msg, inner.Error()) {
			t.Errorf("WithKind message %q lacks the kind %q or the inner %q", msg, kind, inner)
		}
		if !Permanent(err) {
			t.Errorf("Permanent(WithKind(%v, ...)) = false", kind)
		}
		// Still recognised after more wrapping, as callers do.
		wrapped := fmt.Errorf("read model.safetensors: %w", err)
		if !Permanent(wrapped) || !errors.Is(wrapped, kind) {
			t.Errorf("wrapped WithKind(%v) lost its kind", kind)
		}
		if !Permanent(kind) {
			t.Errorf("Permanent(%v) = false for the bare sentinel", kind)
		}
	}
	for _, err := range []error{
		nil,
		errors.New("connection reset by peer"),
		ErrStalled, ErrTooSlow, ErrTruncated,
		fmt.Errorf("attempt: %w", ErrTruncated),
		WithKind(errors.New("throttled"), errors.New("503 SlowDown")),
	} {
		if Permanent(err) {
			t.Errorf("Permanent(%v) = true, want false", err)
		}
	}
}
