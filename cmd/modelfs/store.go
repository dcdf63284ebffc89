package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/node"
)

// storeFlags select and reach the object store.
var storeFlags = []cli.Flag{
	&cli.StringFlag{Name: "endpoint", Usage: "object store URL (default: AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL for s3://, " +
		"TOS_ENDPOINT for tos://, else the store's public endpoint; for tos:// a bare HOST means https, and a local server needs an IP address)"},
	&cli.StringFlag{Name: "region", Usage: "region (default: AWS_REGION or the shared config for s3://; required for tos://, default TOS_REGION)"},
	&cli.BoolFlag{Name: "force-path-style", Usage: "address buckets as ENDPOINT/BUCKET (s3:// only; automatic for IP and localhost endpoints)"},
}

// policyFlags bound every GET.
var policyFlags = []cli.Flag{
	&cli.DurationFlag{Name: "request-timeout", Value: backend.DefaultPolicy.FirstByteTimeout, EnvVars: []string{"MODELFS_REQUEST_TIMEOUT"},
		Usage: "abort and retry a GET that has not delivered its first byte in this time"},
	&cli.StringFlag{Name: "low-speed-limit", Value: "1MiB", EnvVars: []string{"MODELFS_LOW_SPEED_LIMIT"},
		Usage: "abort and retry a GET moving fewer bytes per second than this over " + backend.DefaultPolicy.LowSpeedWindow.String() + " (0: off)"},
	&cli.IntFlag{Name: "max-attempts", Value: backend.DefaultPolicy.Attempts, EnvVars: []string{"MODELFS_MAX_ATTEMPTS"},
		Usage: "tries of one read before it fails with EIO"},
}

func parsePolicy(c *cli.Context) (backend.Policy, error) {
	p := backend.DefaultPolicy
	p.FirstByteTimeout = c.Duration("request-timeout")
	if p.FirstByteTimeout < 100*time.Millisecond || p.FirstByteTimeout > 10*time.Minute {
		return p, usageErr("--request-timeout %v: want 100ms to 10m", p.FirstByteTimeout)
	}
	limit, err := parseSize(c.String("low-speed-limit"))
	if err != nil {
		return p, usageErr("--low-speed-limit: %v", err)
	}
	p.LowSpeedLimit = limit
	p.Attempts = c.Int("max-attempts")
	if p.Attempts < 1 || p.Attempts > 100 {
		return p, usageErr("--max-attempts %d: want 1 to 100", p.Attempts)
	}
	return p, nil
}

// openStore connects to the store loc names. Credentials come from each
// SDK's standard chain (for tos://: TOS_ACCESS_KEY, TOS_SECRET_KEY,
// TOS_SECURITY_TOKEN), never from flags.
func openStore(ctx context.Context, c *cli.Context, loc backend.Location, conns int) (backend.Store, error) {
	return backend.Open(ctx, loc, storeConfig(c, conns))
}

func storeConfig(c *cli.Context, conns int) backend.Config {
	return backend.Config{
		Endpoint:       c.String("endpoint"),
		Region:         c.String("region"),
		ForcePathStyle: c.Bool("force-path-style"),
		MaxConns:       conns,
	}
}

// explain turns a store error into a message that names the cause.
func explain(err error, loc backend.Location, store backend.Store) error {
	return node.Explain(err, loc, store)
}

// parseSize reads a byte size: a plain number of bytes or a number with
// K, M, G or T (powers of 1024; "KiB", "KB" and "k" mean the same).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9') {
		i++
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a number of bytes, optionally with K, M, G or T", s)
	}
	shift := 0
	switch strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(strings.TrimSpace(t[i:]), "B"), "i")) {
	case "":
	case "K":
		shift = 10
	case "M":
		shift = 20
	case "G":
		shift = 30
	case "T":
		shift = 40
	default:
		return 0, fmt.Errorf("size %q: unknown unit %q (want K, M, G or T)", s, t[i:])
	}
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n << shift, nil
}
