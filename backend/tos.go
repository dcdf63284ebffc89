package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"

	"github.com/volcengine/ve-tos-golang-sdk/v2/tos"
)

// TOS error codes (X-Tos-Ec) the SDK itself relies on: a HEAD has no body,
// so the EC header is the only thing that tells a missing bucket from a
// missing key.
const (
	tosECNoSuchBucket = "0006-00000001"
	tosECNoSuchKey    = "0017-00000003"
)

type tosStore struct {
	client   *tos.ClientV2
	bucket   string
	endpoint string
}

// NewTOS returns a Store for a Volcengine TOS bucket through the native TOS
// SDK. The endpoint comes from cfg, else TOS_ENDPOINT, else the public
// endpoint of the region; the region from cfg, else TOS_REGION (required);
// credentials from cfg, else TOS_ACCESS_KEY, TOS_SECRET_KEY and
// TOS_SECURITY_TOKEN.
func NewTOS(ctx context.Context, bucket string, cfg Config) (Store, error) {
	region := firstNonEmpty(cfg.Region, strings.TrimSpace(os.Getenv("TOS_REGION")))
	if region == "" {
		return nil, errors.New("TOS needs a region: set --region or TOS_REGION")
	}
	endpoint, err := tosEndpoint(Endpoint("tos", cfg), region)
	if err != nil {
		return nil, err
	}
	ak, sk, token := cfg.AccessKey, cfg.SecretKey, cfg.SessionToken
	if ak == "" {
		ak = strings.TrimSpace(os.Getenv("TOS_ACCESS_KEY"))
		sk = strings.TrimSpace(os.Getenv("TOS_SECRET_KEY"))
		token = strings.TrimSpace(os.Getenv("TOS_SECURITY_TOKEN"))
	}
	if ak == "" || sk == "" {
		return nil, errors.New("TOS needs credentials: set TOS_ACCESS_KEY and TOS_SECRET_KEY " +
			"(and TOS_SECURITY_TOKEN for temporary credentials)")
	}
	// Static credentials: the SDK's environment provider would start a
	// refresh goroutine for values that never change during a mount.
	creds := tos.NewStaticCredentials(ak, sk)
	if token != "" {
		creds.WithSecurityToken(token)
	}
	maxConns := cfg.MaxConns
	if maxConns <= 0 {
		maxConns = 64
	}
	client, err := tos.NewClientV2(endpoint,
		tos.WithRegion(region),
		tos.WithCredentials(creds),
		// WithMaxConnections caps connections per host as well as sizing
		// the idle pool: cfg.MaxConns is at least the parallel GETs.
		tos.WithMaxConnections(maxConns),
		// Reader owns retries, stall detection and backoff of GETs for every
		// store alike; the SDK's own retries would hide stalls behind
		// sleeps. Listing pages and HEADs retry through retryMeta.
		tos.WithMaxRetryCount(0),
		// Without this the SDK sends (and signs) a Content-Type guessed from
		// the key's extension on every GET and HEAD.
		tos.WithAutoRecognizeContentType(false),
		tos.WithUserAgentSuffix("modelfs"),
	)
	if err != nil {
		return nil, fmt.Errorf("tos client for %s: %w", endpoint, err)
	}
	return &tosStore{client: client, bucket: bucket, endpoint: endpoint}, nil
}

// tosEndpoint normalises a TOS endpoint to scheme://host[:port]. TOS users
// often write a bare host (the SDK then speaks https); "" means the public
// endpoint of region.
func tosEndpoint(raw, region string) (string, error) {
	if raw == "" {
		host, ok := tos.SupportedRegion()[region]
		if !ok {
			return "", fmt.Errorf("no public TOS endpoint is known for region %q: set --endpoint or TOS_ENDPOINT", region)
		}
		return "https://" + host, nil
	}
	u, err := parseEndpoint("TOS", raw)
	if err != nil {
		return "", err
	}
	host := strings.ToLower(u.Hostname())
	if strings.HasPrefix(host, "tos-s3-") {
		return "", fmt.Errorf("TOS endpoint %s is TOS's S3-compatible endpoint, which the TOS API refuses: "+
			"use tos-REGION.volces.com, or an s3:// URI with this endpoint", u)
	}
	if net.ParseIP(host) == nil && hostNeedsPathStyle(host) {
		// The SDK addresses buckets as BUCKET.HOST for every host name and
		// has no path-style switch: BUCKET.localhost does not resolve.
		return "", fmt.Errorf("TOS endpoint %s: TOS addresses buckets by virtual host for host names; "+
			"use an IP address such as 127.0.0.1 for a local server", u)
	}
	return u.String(), nil
}

func (s *tosStore) String() string { return "tos://" + s.bucket + " at " + s.endpoint }

func (s *tosStore) Close() error {
	s.client.Close()
	return nil
}

func (s *tosStore) List(ctx context.Context, prefix string, fn func(Object) error) error {
	token := ""
	for {
		var out *tos.ListObjectsType2Output
		err := retryMeta(ctx, func() (err error) {
			out, err = s.client.ListObjectsType2(ctx, &tos.ListObjectsType2Input{
				Bucket:            s.bucket,
				Prefix:            prefix,
				ContinuationToken: token,
				MaxKeys:           tos.DefaultListMaxKeys,
				ListOnlyOnce:      true, // one page per call: we page ourselves
			})
			if err != nil {
				return s.mapErr(err, "list", prefix)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, o := range out.Contents {
			if err := fn(Object{Key: o.Key, Size: o.Size, ETag: o.ETag, ModTime: o.LastModified}); err != nil {
				return err
			}
		}
		if !out.IsTruncated {
			return nil
		}
		if out.NextContinuationToken == "" || out.NextContinuationToken == token {
			return fmt.Errorf("tos list tos://%s/%s: truncated listing without a new continuation token", s.bucket, prefix)
		}
		token = out.NextContinuationToken
	}
}

func (s *tosStore) Stat(ctx context.Context, key string) (Object, error) {
	var out *tos.HeadObjectV2Output
	err := retryMeta(ctx, func() (err error) {
		out, err = s.client.HeadObjectV2(ctx, &tos.HeadObjectV2Input{Bucket: s.bucket, Key: key})
		if err != nil {
			return s.mapErr(err, "stat", key)
		}
		return nil
	})
	if err != nil {
		return Object{}, err
	}
	return Object{Key: key, Size: out.ContentLength, ETag: out.ETag, ModTime: out.LastModified}, nil
}

func (s *tosStore) Open(ctx context.Context, key, etag string, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n <= 0 {
		return nil, fmt.Errorf("tos get tos://%s/%s: invalid range of %d bytes at %d", s.bucket, key, n, off)
	}
	// The Range string rather than RangeStart/RangeEnd: the SDK reads
	// start = end = 0 as "no range", which would fetch the whole object
	// for the first byte.
	out, err := s.client.GetObjectV2(ctx, &tos.GetObjectV2Input{
		Bucket:  s.bucket,
		Key:     key,
		Range:   httpRange(off, n),
		IfMatch: etag,
	})
	if err != nil {
		return nil, s.mapErr(err, "get", key)
	}
	// The SDK already refuses anything but 206 for a ranged GET; check the
	// range itself too, so a server that sent other bytes is never trusted.
	if out.StatusCode != http.StatusPartialContent {
		out.Content.Close()
		return nil, fmt.Errorf("tos get tos://%s/%s: status %d for a ranged GET, want 206", s.bucket, key, out.StatusCode)
	}
	if err := checkContentRange(out.ContentRange, off); err != nil {
		out.Content.Close()
		return nil, fmt.Errorf("tos get tos://%s/%s: %w", s.bucket, key, err)
	}
	return out.Content, nil
}

// mapErr attaches the sentinel kind matching a TOS error. The SDK's message
// leaves out the status and the code: they go in front.
func (s *tosStore) mapErr(err error, op, key string) error {
	var se *tos.TosServerError
	if !errors.As(err, &se) {
		var ce *tos.TosClientError
		if errors.As(err, &ce) && ce.Cause != nil {
			err = &causeError{err: err, cause: ce.Cause}
		}
		return fmt.Errorf("tos %s tos://%s/%s: %w", op, s.bucket, key, err)
	}
	status, code := se.StatusCode, se.Code
	ec := firstNonEmpty(se.EC, se.RequestInfo.EcCode)
	detail := fmt.Sprintf("HTTP %d", status)
	if code != "" {
		detail += " " + code
	}
	wrapped := fmt.Errorf("tos %s tos://%s/%s: %s: %w", op, s.bucket, key, detail, err)
	switch {
	case code == "NoSuchBucket" || ec == tosECNoSuchBucket:
		return WithKind(ErrNoBucket, wrapped)
	case code == "NoSuchKey" || code == "NotFound" || ec == tosECNoSuchKey || status == http.StatusNotFound:
		// A HEAD 404 has no body and so no code.
		return WithKind(ErrNotExist, wrapped)
	case code == "PreconditionFailed" || status == http.StatusPreconditionFailed:
		return WithKind(ErrPrecondition, wrapped)
	case code == "AccessDenied" || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
		code == "InvalidToken" || code == "ExpiredToken" || code == "AuthFailed" || code == "ForbiddenAccess" ||
		code == "RequestTimeTooSkewed" || status == http.StatusForbidden || status == http.StatusUnauthorized:
		return WithKind(ErrAccess, wrapped)
	}
	return wrapped
}

// causeError keeps the SDK's message and exposes the cause of a client-side
// error (a net.Error, a context error), which TosClientError does not
// unwrap: callers tell "cannot reach the store" and cancellation apart with
// errors.As and errors.Is.
type causeError struct{ err, cause error }

func (e *causeError) Error() string   { return e.err.Error() }
func (e *causeError) Unwrap() []error { return []error{e.err, e.cause} }

// retryMeta runs a listing page or HEAD up to three times while it fails
// with a transient error, as the S3 SDK does for those calls: one 503 must
// not fail a mount or a health check. It waits as Reader does between
// attempts, with the default policy; GETs retry in Reader.
func retryMeta(ctx context.Context, call func() error) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 && DefaultPolicy.backoff(ctx, attempt) != nil {
			return err
		}
		if err = call(); err == nil || Permanent(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}
