package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/cache"
	"github.com/modelfs/modelfs/fs"
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
		&cli.BoolFlag{Name: "debug-fuse", Usage: "log every FUSE request"},
		&cli.StringFlag{Name: "cpu-profile", Hidden: true, Usage: "write a Go CPU profile of the whole run to this file"},
	}
	return &cli.Command{
		Name:      "mount",
		Usage:     "mount URI read-only on MOUNTPOINT and serve it until SIGINT or SIGTERM",
		ArgsUsage: "URI MOUNTPOINT",
		Description: `URI is s3://BUCKET[/PREFIX] or tos://BUCKET[/PREFIX]. The prefix is listed once
and shown as a directory tree; file contents are fetched with ranged GETs
through a RAM cache of MAX_IO_QUEUE × IO_CHUNKSIZE bytes. The command stays
in the foreground, logs one line when the mount is ready, and unmounts on
SIGINT or SIGTERM.

Credentials come from the SDK's standard chain: for s3://, the AWS
environment variables, shared config and profiles, web identity or
instance metadata.`,
		Flags:  concat(storeFlags, flags, policyFlags, logFlags),
		Action: runMount,
	}
}

// mountConfig is the validated flag set.
type mountConfig struct {
	loc        backend.Location
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
	if c.NArg() != 2 {
		return nil, usageErr("mount needs URI and MOUNTPOINT, got %d argument(s); see modelfs mount --help", c.NArg())
	}
	loc, err := backend.ParseURI(c.Args().Get(0))
	if err != nil {
		return nil, usageErr("%v", err)
	}
	mc := &mountConfig{loc: loc, mountpoint: c.Args().Get(1)}
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
	mc.fsOpts = fs.DefaultOptions
	mc.fsOpts.FsName = loc.String()
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
		if backend.Loopback(backend.Endpoint(loc.Scheme, storeConfig(c, 0))) {
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
	// The chunk buffers are the heap; keep the garbage collector from
	// letting it grow to twice their size.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(mc.budget + 128<<20)
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
	// Room for the most GETs any profile runs, plus the demand reserve.
	store, err := openStore(ctx, c, mc.loc, 2*max(mc.fetch.Concurrency, 64))
	if err != nil {
		return err
	}
	defer store.Close()
	mc.fsOpts.Relist = func(ctx context.Context) (*fs.Tree, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		return fs.List(ctx, store, mc.loc.Prefix, mc.filter)
	}
	tree, err := mc.fsOpts.Relist(ctx)
	if err != nil {
		return explain(err, mc.loc, store)
	}
	if tree.Files == 0 && len(tree.Root.Children) == 0 {
		return fmt.Errorf("no objects under %s (%s): check the bucket and prefix", mc.loc, store)
	}
	for _, s := range tree.Skipped {
		slog.Warn("key not shown", "key", s)
	}
	profile := prefetch.Profile(mc.gbps, tree.Bytes)
	if mc.fetch.Concurrency == 0 {
		// The profile bounds the search; an explicit --concurrency is used as is.
		mc.fetch.Concurrency = profile.Concurrency
		mc.fetch.Adaptive = true
	}
	if mc.fetch.PartSize == 0 {
		mc.fetch.PartSize = profile.PartSize
	}

	chunks, err := cache.New(cache.Config{Budget: mc.budget, ChunkSize: mc.chunk})
	if err != nil {
		return usageErr("%v", err)
	}
	defer chunks.Close()
	reader := backend.NewReader(store, mc.policy)
	fetcher := prefetch.New(chunks, reader, mc.fetch)
	m, err := fs.MountTree(mc.mountpoint, tree, fetcher, mc.fsOpts)
	if err != nil {
		fetcher.Close()
		return err
	}
	slog.Info("mounted", "uri", mc.loc.String(), "mountpoint", mc.mountpoint, "files", tree.Files,
		"bytes", tree.Bytes, "cache_bytes", mc.budget, "chunk_bytes", mc.chunk,
		"network_gbps", mc.gbps, "max_concurrency", mc.fetch.Concurrency, "adaptive", mc.fetch.Adaptive,
		"part_bytes", fetcher.Config().PartSize, "prefetch", mc.mode.String())
	go func() {
		var p prefetch.Progress
		start := time.Now()
		if err := fetcher.Warm(ctx, m.Files(), mc.mode, &p); err != nil {
			if ctx.Err() == nil {
				slog.Warn("prefetch stopped", "err", err)
			}
			return
		}
		slog.Debug("prefetch claimed every chunk", "bytes", p.Total.Load(), "seconds", time.Since(start).Seconds())
	}()

	ended := make(chan struct{})
	go func() {
		m.Wait(24 * 365 * time.Hour)
		close(ended)
	}()
	select {
	case <-ctx.Done():
		slog.Info("unmounting", "mountpoint", mc.mountpoint)
	case <-ended:
		slog.Info("unmounted from outside", "mountpoint", mc.mountpoint)
		fetcher.Close()
		logStats(fetcher, chunks, reader)
		return nil
	}
	err = m.Unmount()
	fetcher.Close() // fails reads still waiting, so open files cannot hold us
	if err != nil {
		return err
	}
	if !m.Wait(time.Second) {
		slog.Info("files still open; the kernel ends the connection when this process exits")
	}
	logStats(fetcher, chunks, reader)
	slog.Info("stopped")
	return nil
}

// logStats logs what the mount did, for operators and the bench.
func logStats(f *prefetch.Fetcher, c *cache.Cache, r *backend.Reader) {
	slog.Info("totals",
		"bytes_served", f.Stats.BytesServed.Load(),
		"bytes_fetched", r.Stats.BytesFetched.Load(),
		"gets", r.Stats.Requests.Load(),
		"demand_fetches", f.Stats.DemandFetches.Load(),
		"readahead_fetches", f.Stats.ReadaheadFetches.Load(),
		"eager_fetches", f.Stats.EagerFetches.Load(),
		"promotions", f.Stats.Promotions.Load(),
		"cache_hits", c.Stats.Hits.Load(),
		"cache_misses", c.Stats.Misses.Load(),
		"window_waits", c.Stats.Waits.Load(),
		"reclaimed", c.Stats.Reclaimed.Load(),
		"rejected", c.Stats.Rejected.Load(),
		"dropped", c.Stats.Dropped.Load(),
		"retries", r.Stats.Retries.Load(),
		"stalls", r.Stats.Stalls.Load())
}
