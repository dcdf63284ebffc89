// Package backend is the object-store layer of modelfs: one small Store
// interface with an S3 and a TOS implementation, the URI syntax that names a
// bucket prefix, and Reader, which turns ranged GETs into reliable ReadAt calls
// (timeouts, stall detection, retries) the same way for every store.
//
// Nothing above this package knows which store it reads. Errors returned by a
// Store wrap exactly one of the sentinel kinds below when the store said so,
// so callers decide with errors.Is and never inspect SDK types.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// MetadataTimeout bounds a listing or a HEAD as a whole: the SDKs set no
// response timeout of their own, and a server that accepts and never
// answers would otherwise hold the caller forever.
const MetadataTimeout = 2 * time.Minute

// Sentinel error kinds. A Store wraps the SDK error together with one of these.
var (
	// ErrNotExist: the object (or key) does not exist.
	ErrNotExist = errors.New("object does not exist")
	// ErrNoBucket: the bucket does not exist.
	ErrNoBucket = errors.New("bucket does not exist")
	// ErrPrecondition: the object no longer has the ETag the caller pinned.
	ErrPrecondition = errors.New("object changed (ETag precondition failed)")
	// ErrAccess: the store refused the credentials or the request.
	ErrAccess = errors.New("access denied")
)

// Permanent reports whether err can never succeed on retry: missing objects
// or buckets, refused credentials and changed objects.
func Permanent(err error) bool {
	return errors.Is(err, ErrNotExist) || errors.Is(err, ErrNoBucket) ||
		errors.Is(err, ErrPrecondition) || errors.Is(err, ErrAccess)
}

// kindError carries a sentinel kind next to the store's own error so that
// errors.Is matches the kind and the message keeps the store's detail.
type kindError struct {
	kind error
	err  error
}

func (e *kindError) Error() string   { return e.kind.Error() + ": " + e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// WithKind wraps err so that errors.Is(result, kind) holds.
func WithKind(kind, err error) error { return &kindError{kind: kind, err: err} }

// Object is one stored object as listed. ETag identifies its content version:
// every read of it is pinned to that ETag.
type Object struct {
	Key     string // full key inside the bucket
	Size    int64
	ETag    string
	ModTime time.Time
}

// Store is the interface each object store implements. All methods are safe
// for concurrent use and honour ctx cancellation.
type Store interface {
	// List calls fn for every object whose key starts with prefix, in the
	// store's (lexical) order, following continuation tokens until the listing
	// is exhausted. An error from fn stops the listing and is returned.
	// Listing a missing bucket fails with ErrNoBucket.
	List(ctx context.Context, prefix string, fn func(Object) error) error

	// Stat returns the object stored at key, or an error wrapping ErrNotExist.
	Stat(ctx context.Context, key string) (Object, error)

	// Open starts a ranged GET of n > 0 bytes of key from off, sent with
	// If-Match: etag. The body yields at most n bytes; it may yield fewer if
	// the connection breaks (the caller checks). A changed object fails with
	// ErrPrecondition. Open does not retry: Reader does.
	Open(ctx context.Context, key, etag string, off, n int64) (io.ReadCloser, error)

	// String names the store and bucket for logs (never credentials).
	String() string

	// Close releases connections and background goroutines.
	Close() error
}

// Location is a parsed model URI: scheme://bucket/prefix.
type Location struct {
	Scheme string // "s3" or "tos"
	Bucket string
	Prefix string // "" or ends in "/"
}

// String gives the URI back in canonical form.
func (l Location) String() string {
	return l.Scheme + "://" + l.Bucket + "/" + l.Prefix
}

// Name is the last element of the prefix, or the bucket for a whole bucket:
// the default name of a model attached under a mount.
func (l Location) Name() string {
	p := l.Prefix
	if p == "" {
		return l.Bucket
	}
	p = strings.TrimSuffix(p, "/")
	return p[strings.LastIndexByte(p, '/')+1:]
}

// Schemes lists the URI schemes modelfs serves.
var Schemes = []string{"s3", "tos"}

// ParseURI parses s3://BUCKET[/PREFIX] and tos://BUCKET[/PREFIX]. The prefix
// is normalised to end in "/" (a prefix names a directory, never a partial
// key); repeated slashes are rejected because no store lists them sensibly.
func ParseURI(s string) (Location, error) {
	var l Location
	i := strings.Index(s, "://")
	if i <= 0 {
		return l, fmt.Errorf("invalid model URI %q: want s3://BUCKET[/PREFIX] or tos://BUCKET[/PREFIX]", s)
	}
	l.Scheme = s[:i]
	if l.Scheme != "s3" && l.Scheme != "tos" {
		return l, fmt.Errorf("unsupported URI scheme %q in %q: supported are s3:// and tos://", l.Scheme, s)
	}
	rest := s[i+3:]
	j := strings.Index(rest, "/")
	if j < 0 {
		l.Bucket = rest
	} else {
		l.Bucket, l.Prefix = rest[:j], rest[j+1:]
	}
	if err := validBucket(l.Bucket); err != nil {
		return Location{}, fmt.Errorf("invalid model URI %q: %w", s, err)
	}
	if l.Prefix != "" {
		if strings.Contains(l.Prefix, "//") || l.Prefix[0] == '/' {
			return Location{}, fmt.Errorf("invalid model URI %q: empty path element in prefix", s)
		}
		for k := 0; k < len(l.Prefix); k++ {
			if l.Prefix[k] < 0x20 || l.Prefix[k] == 0x7f {
				return Location{}, fmt.Errorf("invalid model URI %q: control character in prefix", s)
			}
		}
		if l.Prefix[len(l.Prefix)-1] != '/' {
			l.Prefix += "/"
		}
	}
	return l, nil
}

// validBucket applies the naming rules S3 and TOS share: 3–63 characters of
// lower-case letters, digits, '-' and '.', starting and ending alphanumeric.
func validBucket(b string) error {
	if b == "" {
		return errors.New("missing bucket name")
	}
	if len(b) < 3 || len(b) > 63 {
		return fmt.Errorf("bucket name %q must be 3 to 63 characters long", b)
	}
	for k := 0; k < len(b); k++ {
		c := b[k]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && c != '-' && c != '.' {
			return fmt.Errorf("bucket name %q may only hold lower-case letters, digits, '-' and '.'", b)
		}
		if (k == 0 || k == len(b)-1) && !alnum {
			return fmt.Errorf("bucket name %q must start and end with a letter or digit", b)
		}
	}
	return nil
}
