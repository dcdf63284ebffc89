package backend

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// Config holds what every store needs to connect. Empty fields fall back to
// each store's environment variables and defaults.
type Config struct {
	Endpoint string // URL; "" means the store's environment variable or public default
	Region   string
	// ForcePathStyle selects /bucket/key addressing (S3 only; chosen
	// automatically for IP and localhost endpoints).
	ForcePathStyle bool
	// Static credentials; when AccessKey is empty the store's standard
	// credential chain is used.
	AccessKey, SecretKey, SessionToken string
	// MaxConns sizes the connection pool: at least the number of parallel GETs.
	MaxConns int
}

// Open connects to the store the location names.
func Open(ctx context.Context, loc Location, cfg Config) (Store, error) {
	switch loc.Scheme {
	case "s3":
		return NewS3(ctx, loc.Bucket, cfg)
	case "tos":
		return NewTOS(ctx, loc.Bucket, cfg)
	}
	return nil, fmt.Errorf("unsupported scheme %q", loc.Scheme)
}

type s3Store struct {
	client   *s3.Client
	bucket   string
	endpoint string
}

// NewS3 returns a Store for bucket through aws-sdk-go-v2. The endpoint comes
// from cfg, else AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL, else AWS's
// default; the region from cfg, else AWS_REGION / AWS_DEFAULT_REGION / the
// shared config, else us-east-1.
func NewS3(ctx context.Context, bucket string, cfg Config) (Store, error) {
	endpoint := Endpoint("s3", cfg)
	pathStyle := cfg.ForcePathStyle
	if endpoint != "" {
		u, err := parseEndpoint("S3", endpoint)
		if err != nil {
			return nil, err
		}
		endpoint = u.String()
		pathStyle = pathStyle || hostNeedsPathStyle(u.Hostname())
	}
	hc := newHTTPClient(cfg.MaxConns)
	var opts []func(*config.LoadOptions) error
	if bundle := os.Getenv("AWS_CA_BUNDLE"); bundle != "" && strings.HasPrefix(endpoint, "http://") && !usableBundle(bundle) {
		// AWS_CA_BUNDLE only matters for TLS, yet the SDK refuses to start
		// when it cannot load it. For a plain-HTTP endpoint hand it a
		// placeholder root, which LoadOptions let win. The SDK adds the
		// bundle to the pool already set, so seeding that pool with the
		// system's roots keeps the TLS the SDK still speaks (STS, SSO) working.
		pem, err := throwawayRootPEM()
		if err != nil {
			return nil, err
		}
		if pool, err := x509.SystemCertPool(); err == nil {
			hc = hc.WithTransportOptions(func(t *http.Transport) { t.TLSClientConfig = &tls.Config{RootCAs: pool} })
		}
		opts = append(opts, config.WithCustomCABundle(bytes.NewReader(pem)))
	}
	opts = append(opts, config.WithHTTPClient(hc))
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	if cfg.AccessKey != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken)))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		if bundle := os.Getenv("AWS_CA_BUNDLE"); bundle != "" {
			return nil, fmt.Errorf("load AWS configuration (AWS_CA_BUNDLE=%s): %w", bundle, err)
		}
		return nil, fmt.Errorf("load AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
		o.UsePathStyle = pathStyle
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	shown := endpoint
	if shown == "" {
		shown = "aws:" + awsCfg.Region
	}
	return &s3Store{client: client, bucket: bucket, endpoint: shown}, nil
}

// Endpoint is the endpoint URL a store of scheme uses with cfg: the
// configured one, else the scheme's environment variables; "" means the
// store's public default.
func Endpoint(scheme string, cfg Config) string {
	switch scheme {
	case "s3":
		return firstNonEmpty(cfg.Endpoint, os.Getenv("AWS_ENDPOINT_URL_S3"), os.Getenv("AWS_ENDPOINT_URL"))
	case "tos":
		return firstNonEmpty(cfg.Endpoint, os.Getenv("TOS_ENDPOINT"))
	}
	return cfg.Endpoint
}

// parseEndpoint checks an endpoint URL of the kind ("S3", "TOS") and
// returns it as scheme://host[:port]. Errors never repeat the text: an
// endpoint may carry credentials (user info, a signed query), and errors
// reach logs and the status API. A bare HOST[:PORT] means https.
func parseEndpoint(kind, raw string) (*url.URL, error) {
	s := raw
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, fmt.Errorf("invalid %s endpoint: not a URL; want [http(s)://]HOST[:PORT]", kind)
	case u.User != nil:
		return nil, fmt.Errorf("invalid %s endpoint: it must not contain user information; pass credentials through the environment", kind)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fmt.Errorf("invalid %s endpoint: it must not have a query or a fragment; want [http(s)://]HOST[:PORT]", kind)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("invalid %s endpoint: scheme %q; want http or https", kind, u.Scheme)
	case u.Host == "":
		return nil, fmt.Errorf("invalid %s endpoint: no host; want [http(s)://]HOST[:PORT]", kind)
	case u.Path != "" && u.Path != "/":
		return nil, fmt.Errorf("invalid %s endpoint %s: it must not have a path; want [http(s)://]HOST[:PORT]", kind, u.Scheme+"://"+u.Host)
	}
	return &url.URL{Scheme: u.Scheme, Host: u.Host}, nil
}

// Loopback reports whether endpoint names this machine: then the "network"
// is memory, as fast as the fastest NIC.
func Loopback(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return false
	}
	h := strings.ToLower(u.Hostname())
	if ip := net.ParseIP(h); ip != nil {
		return ip.IsLoopback()
	}
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}

// hostNeedsPathStyle: virtual-host addressing needs DNS for bucket.host,
// which IP literals and localhost never have.
func hostNeedsPathStyle(host string) bool {
	host = strings.ToLower(host)
	return net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost")
}

// newHTTPClient builds a transport sized for many parallel ranged GETs to
// one host: the default keeps only 2 idle connections per host, so parallel
// readers would reconnect on every request.
func newHTTPClient(maxConns int) *awshttp.BuildableClient {
	if maxConns <= 0 {
		maxConns = 64
	}
	return awshttp.NewBuildableClient().
		WithDialerOptions(func(d *net.Dialer) {
			d.Timeout = 10 * time.Second
			d.KeepAlive = 30 * time.Second
		}).
		WithTransportOptions(func(t *http.Transport) {
			t.MaxIdleConns = 2 * maxConns
			t.MaxIdleConnsPerHost = maxConns
			t.IdleConnTimeout = 90 * time.Second
			t.ReadBufferSize = 256 << 10
			t.ExpectContinueTimeout = 0
		})
}

func (s *s3Store) String() string { return "s3://" + s.bucket + " at " + s.endpoint }

func (s *s3Store) Close() error { return nil }

func (s *s3Store) List(ctx context.Context, prefix string, fn func(Object) error) error {
	in := &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), Prefix: aws.String(prefix)}
	seen := map[string]bool{}
	for {
		page, err := s.client.ListObjectsV2(ctx, in)
		if err != nil {
			return s.mapErr(err, "list", prefix)
		}
		for _, o := range page.Contents {
			obj := Object{Key: aws.ToString(o.Key), Size: aws.ToInt64(o.Size), ETag: aws.ToString(o.ETag)}
			if o.LastModified != nil {
				obj.ModTime = *o.LastModified
			}
			if err := fn(obj); err != nil {
				return err
			}
		}
		if !aws.ToBool(page.IsTruncated) {
			return nil
		}
		// A server that pages without a new token would end the listing
		// early or loop on one page: either way, the tree would be wrong.
		next := aws.ToString(page.NextContinuationToken)
		if next == "" || seen[next] {
			return fmt.Errorf("s3 list s3://%s/%s: truncated listing without a new continuation token", s.bucket, prefix)
		}
		seen[next] = true
		in.ContinuationToken = aws.String(next)
	}
}

func (s *s3Store) Stat(ctx context.Context, key string) (Object, error) {
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		return Object{}, s.mapErr(err, "stat", key)
	}
	obj := Object{Key: key, Size: aws.ToInt64(out.ContentLength), ETag: aws.ToString(out.ETag)}
	if out.LastModified != nil {
		obj.ModTime = *out.LastModified
	}
	return obj, nil
}

func (s *s3Store) Open(ctx context.Context, key, etag string, off, n int64) (io.ReadCloser, error) {
	in := &s3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(key),
		Range:  aws.String(httpRange(off, n)),
	}
	if etag != "" {
		in.IfMatch = aws.String(etag)
	}
	// Reader owns retries for every store alike.
	out, err := s.client.GetObject(ctx, in, func(o *s3.Options) { o.RetryMaxAttempts = 1 })
	if err != nil {
		return nil, s.mapErr(err, "get", key)
	}
	if err := checkContentRange(aws.ToString(out.ContentRange), off); err != nil {
		out.Body.Close()
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return out.Body, nil
}

// httpRange is the Range header for n bytes from off.
func httpRange(off, n int64) string {
	return "bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(off+n-1, 10)
}

// checkContentRange makes sure the server answered the range we asked for:
// a server that ignored Range and sent the object from byte 0 must not be
// taken for data at off.
func checkContentRange(cr string, off int64) error {
	if cr == "" {
		if off == 0 {
			return nil
		}
		return fmt.Errorf("server ignored the Range header (no Content-Range)")
	}
	rest, ok := strings.CutPrefix(cr, "bytes ")
	dash := strings.IndexByte(rest, '-')
	if !ok || dash < 0 {
		return fmt.Errorf("malformed Content-Range %q", cr)
	}
	start, err := strconv.ParseInt(rest[:dash], 10, 64)
	if err != nil || start != off {
		return fmt.Errorf("Content-Range %q does not start at %d", cr, off)
	}
	return nil
}

// mapErr attaches the sentinel kind matching an S3 error.
func (s *s3Store) mapErr(err error, op, key string) error {
	wrapped := fmt.Errorf("s3 %s s3://%s/%s: %w", op, s.bucket, key, err)
	var nsk *types.NoSuchKey
	var nf *types.NotFound
	var nsb *types.NoSuchBucket
	switch {
	case errors.As(err, &nsb):
		return WithKind(ErrNoBucket, wrapped)
	case errors.As(err, &nsk), errors.As(err, &nf):
		return WithKind(ErrNotExist, wrapped)
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchBucket":
			return WithKind(ErrNoBucket, wrapped)
		case "NoSuchKey", "NotFound":
			return WithKind(ErrNotExist, wrapped)
		case "PreconditionFailed":
			return WithKind(ErrPrecondition, wrapped)
		case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
			"XAdminUserNotFound": // versitygw's answer to an unknown access key
			return WithKind(ErrAccess, wrapped)
		}
	}
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		switch re.HTTPStatusCode() {
		case http.StatusNotFound:
			return WithKind(ErrNotExist, wrapped)
		case http.StatusPreconditionFailed:
			return WithKind(ErrPrecondition, wrapped)
		case http.StatusForbidden, http.StatusUnauthorized:
			return WithKind(ErrAccess, wrapped)
		}
	}
	return wrapped
}

// usableBundle reports whether the CA bundle at path holds a certificate
// the SDK can load.
func usableBundle(path string) bool {
	b, err := os.ReadFile(path)
	return err == nil && x509.NewCertPool().AppendCertsFromPEM(b)
}

// throwawayRootPEM makes a self-signed certificate that trusts nothing real:
// it only satisfies the SDK's CA-bundle loader when no TLS will be spoken.
func throwawayRootPEM() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "modelfs placeholder (plain-HTTP endpoint)"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IsCA:         true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}
