package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/cache"
	"github.com/modelfs/modelfs/fs"
	"github.com/modelfs/modelfs/node"
	"github.com/modelfs/modelfs/prefetch"
)

// Defaults a node can live with: a 1 GiB cache in 8 MiB chunks.
const (
	defaultMaxIOQueue  = 128
	defaultIOChunkSize = "8MiB"
	// loopbackGbps is the bandwidth assumed for a store on this machine.
	loopbackGbps = 100
)

func mountCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.IntFlag{Name: "max-io-queue", Value: defaultMaxIOQueue,
			EnvVars: []string{"MODELFS_MAX_IO_QUEUE", "DOWNLOADER_S3_MAX_IO_QUEUE"},
			Usage:   "cache capacity in chunks: the cache holds MAX_IO_QUEUE × IO_CHUNKSIZE bytes"},
		&cli.StringFlag{Name: "io-chunksize", Value: defaultIOChunkSize,
			EnvVars: []string{"MODELFS_IO_CHUNKSIZE", "DOWNLOADER_S3_IO_CHUNKSIZE"},
			Usage:   "cache chunk size: bytes, or with K, M, G (powers of 1024); a multiple of 4 KiB"},
		&cli.StringFlag{Name: "allow-suffix", EnvVars: []string{"MODELFS_ALLOW_SUFFIX", "DOWNLOADER_ALLOW_FILE_SUFFIX"},
			Usage: "show only files with these comma-separated suffixes, e.g. json,safetensors"},
		&cli.BoolFlag{Name: "allow-other", EnvVars: []string{"MODELFS_ALLOW_OTHER"},
			Usage: "let other users (and pods, through mount propagation) read the mount"},
		&cli.IntFlag{Name: "read-ahead-kb", Value: fs.DefaultOptions.ReadAheadKB, EnvVars: []string{"MODELFS_READ_AHEAD_KB"},
			Usage: "kernel readahead of the mount in KiB (0 keeps the kernel's 128)"},
		&cli.IntFlag{Name: "max-background", Value: fs.DefaultOptions.MaxBackground,
			Usage: "asynchronous FUSE requests the kernel keeps in flight"},
		&cli.StringFlag{Name: "prefetch", Value: "safetensors", EnvVars: []string{"MODELFS_PREFETCH"},
			Usage: "pull files in the background on mount: safetensors (the shards, in loader order), all, or none"},
		&cli.Float64Flag{Name: "network-gbps", EnvVars: []string{"MODELFS_NETWORK_GBPS"},
			Usage: "node bandwidth that picks the GET profile (default: detected; 50 or more is a fast node)"},
		&cli.IntFlag{Name: "concurrency", EnvVars: []string{"MODELFS_CONCURRENCY"},
			Usage: "parallel GETs (default: from the network profile)"},
		&cli.StringFlag{Name: "part-size", EnvVars: []string{"MODELFS_PART_SIZE"},
			Usage: "size of readahead and prefetch GETs (default: from the network profile)"},
		&cli.DurationFlag{Name: "metadata-ttl", Value: 5 * time.Minute, EnvVars: []string{"MODELFS_METADATA_TTL"},
			Usage: "re-list the prefix this often: new, replaced and deleted objects show to new opens (0: never)"},
		&cli.StringFlag{Name: "status-addr", Value: "127.0.0.1:9090", EnvVars: []string{"MODELFS_STATUS_ADDR"},
			Usage: "serve /healthz, /readyz, /metrics and the model API here (empty: off)"},
		&cli.BoolFlag{Name: "debug-fuse", Usage: "log every FUSE request"},
		&cli.StringFlag{Name: "cpu-profile", Hidden: true, Usage: "write a Go CPU profile of the whole run to this file"},
	}
	return &cli.Command{
		Name:      "mount",
		Usage:     "mount URI read-only on MOUNTPOINT and serve it until SIGINT or SIGTERM",
		ArgsUsage: "[URI] MOUNTPOINT",
		Description: `URI is s3://BUCKET[/PREFIX] or tos://BUCKET[/PREFIX]. The prefix is listed
and shown as a directory tree; file contents are fetched with ranged GETs
through a RAM cache of MAX_IO_QUEUE × IO_CHUNKSIZE bytes. Without a URI the
mount starts empty and models are attached under MOUNTPOINT/<name> through the
status server's API (modelfs models add). The command stays in the
foreground, logs one line when the mount is ready, and unmounts on SIGINT or
SIGTERM.

Credentials come from the SDK's standard chain: for s3://, the AWS
environment variables, shared config and profiles, web identity or
instance metadata.`,
		Flags:  concat(storeFlags, flags, policyFlags, logFlags),
		Action: runMount,
	}
}

// mountConfig is the validated flag set.
type mountConfig struct {
	loc        *backend.Location // nil: models come only through the API
	mountpoint string
	chunk      int64
	budget     int64
	fsOpts     fs.Options
	fetch      prefetch.Config
	mode       prefetch.Mode
	policy     backend.Policy
	gbps       float64
	filter     fs.Filter
}

func parseMountFlags(c *cli.Context) (*mountConfig, error) {
	var mc *mountConfig
	var err error
	switch c.NArg() {
	case 1:
		if strings.Contains(c.Args().Get(0), "://") {
			return nil, usageErr("mount needs a MOUNTPOINT after %s; see modelfs mount --help", c.Args().Get(0))
		}
		if c.String("status-addr") == "" {
			return nil, usageErr("mount without a URI serves only models attached through the API: it needs --status-addr")
		}
		mc = &mountConfig{mountpoint: c.Args().Get(0)}
	case 2:
		loc, err := backend.ParseURI(c.Args().Get(0))
		if err != nil {
			return nil, usageErr("%v", err)
		}
		mc = &mountConfig{loc: &loc, mountpoint: c.Args().Get(1)}
	default:
		return nil, usageErr("mount needs [URI] MOUNTPOINT, got %d argument(s); see modelfs mount --help", c.NArg())
	}
	mc.chunk, err = parseSize(c.String("io-chunksize"))
	if err != nil {
		return nil, usageErr("--io-chunksize: %v", err)
	}
	if mc.chunk < 64<<10 || mc.chunk > 256<<20 || mc.chunk%cache.PageSize != 0 {
		return nil, usageErr("--io-chunksize %s: want a multiple of 4 KiB from 64 KiB to 256 MiB", c.String("io-chunksize"))
	}
	q := c.Int("max-io-queue")
	if q < 8 || q > 1<<16 {
		return nil, usageErr("--max-io-queue %d: want 8 to 65536 chunks", q)
	}
	mc.budget = int64(q) * mc.chunk
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		if ram := int64(si.Totalram) * int64(si.Unit); mc.budget > ram {
			return nil, usageErr("--max-io-queue %d × --io-chunksize %s = %s of cache: more than this machine's %s of memory",
				q, c.String("io-chunksize"), human(mc.budget), human(ram))
		}
	}
	mc.fsOpts = fs.DefaultOptions
	mc.fsOpts.FsName = "modelfs"
	if mc.loc != nil {
		mc.fsOpts.FsName = mc.loc.String()
	}
	mc.fsOpts.AllowOther = c.Bool("allow-other")
	mc.fsOpts.Debug = c.Bool("debug-fuse")
	mc.fsOpts.MetadataTTL = c.Duration("metadata-ttl")
	if mc.fsOpts.MetadataTTL != 0 && mc.fsOpts.MetadataTTL < time.Second {
		return nil, usageErr("--metadata-ttl %v: want 0 (never) or at least 1s", mc.fsOpts.MetadataTTL)
	}
	mc.fsOpts.ReadAheadKB = c.Int("read-ahead-kb")
	if mc.fsOpts.ReadAheadKB < 0 || mc.fsOpts.ReadAheadKB > 1<<20 {
		return nil, usageErr("--read-ahead-kb %d: want 0 to 1048576", mc.fsOpts.ReadAheadKB)
	}
	mc.fsOpts.MaxBackground = c.Int("max-background")
	if mc.fsOpts.MaxBackground < 1 || mc.fsOpts.MaxBackground > 65535 {
		return nil, usageErr("--max-background %d: want 1 to 65535", mc.fsOpts.MaxBackground)
	}
	if mc.policy, err = parsePolicy(c); err != nil {
		return nil, err
	}
	if mc.mode, err = prefetch.ParseMode(c.String("prefetch")); err != nil {
		return nil, usageErr("--prefetch: %v", err)
	}
	mc.gbps = c.Float64("network-gbps")
	if mc.gbps < 0 || mc.gbps > 10000 {
		return nil, usageErr("--network-gbps %g: want 0 to 10000", mc.gbps)
	}
	if mc.gbps == 0 {
		scheme := "s3"
		if mc.loc != nil {
			scheme = mc.loc.Scheme
		}
		if backend.Loopback(backend.Endpoint(scheme, storeConfig(c, 0))) {
			mc.gbps = loopbackGbps
		} else {
			mc.gbps, _ = prefetch.DetectGbps()
		}
	}
	if c.IsSet("concurrency") {
		mc.fetch.Concurrency = c.Int("concurrency")
		if mc.fetch.Concurrency < 1 || mc.fetch.Concurrency > 1024 {
			return nil, usageErr("--concurrency %d: want 1 to 1024", mc.fetch.Concurrency)
		}
	}
	if c.IsSet("part-size") {
		mc.fetch.PartSize, err = parseSize(c.String("part-size"))
		if err != nil {
			return nil, usageErr("--part-size: %v", err)
		}
		if mc.fetch.PartSize < mc.chunk || mc.fetch.PartSize > 1<<30 {
			return nil, usageErr("--part-size %s: want from the chunk size (%d) to 1 GiB", c.String("part-size"), mc.chunk)
		}
	}
	if s := c.String("allow-suffix"); s != "" {
		mc.filter = fs.SuffixFilter(strings.Split(s, ","))
	}
	return mc, nil
}

func runMount(c *cli.Context) error {
	if err := setupLogging(c, os.Stderr); err != nil {
		return err
	}
	mc, err := parseMountFlags(c)
	if err != nil {
		return err
	}
	if err := fs.CheckMountpoint(mc.mountpoint); err != nil {
		return usageErr("%v", err)
	}
	// The chunk buffers live outside the Go heap; hold the rest (HTTP and
	// FUSE buffers, listings) to the documented overhead rather than let
	// the collector double it.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(256 << 20)
	}
	if p := c.String("cpu-profile"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The default status address may be taken by another mount on the
	// node: a mount of a URI goes on without a status server then, but one
	// without a URI is served only through it.
	statusOptional := !c.IsSet("status-addr") && mc.loc != nil
	n, err := node.Start(ctx, node.Config{
		Mountpoint:     mc.mountpoint,
		Root:           mc.loc,
		Store:          storeConfig(c, 0),
		Policy:         mc.policy,
		Cache:          cache.Config{Budget: mc.budget, ChunkSize: mc.chunk},
		Fetch:          mc.fetch,
		Gbps:           mc.gbps,
		Prefetch:       mc.mode,
		Filter:         mc.filter,
		FS:             mc.fsOpts,
		StatusAddr:     c.String("status-addr"),
		StatusOptional: statusOptional,
	})
	if err != nil {
		return err
	}
	fc := n.FetchConfig()
	uri := "(none: attach models through the API)"
	if mc.loc != nil {
		uri = mc.loc.String()
	}
	slog.Info("mounted", "uri", uri, "mountpoint", mc.mountpoint, "cache_bytes", mc.budget, "chunk_bytes", mc.chunk,
		"network_gbps", mc.gbps, "max_concurrency", fc.Concurrency, "adaptive", fc.Adaptive,
		"part_bytes", fc.PartSize, "prefetch", mc.mode.String(), "status", n.StatusURL)
	if n.Wait(ctx) {
		slog.Info("unmounted from outside", "mountpoint", mc.mountpoint)
	} else {
		slog.Info("unmounting", "mountpoint", mc.mountpoint)
	}
	err = n.Stop()
	slog.Info("totals", n.Totals()...)
	if err != nil {
		return err
	}
	slog.Info("stopped")
	return nil
}
