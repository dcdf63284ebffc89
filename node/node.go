// Package node runs modelfs on one machine: a mount, the models it shows
// (the one named at mount and any attached at run time through the API),
// one chunk cache and fetcher shared by all of them, and the status server
// with health checks, Prometheus metrics and the runtime model API.
//
// Locking: Node.mu guards the model table. A model's status fields are
// guarded by its own mutex; its progress counters are atomic.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/cache"
	"github.com/modelfs/modelfs/fs"
	"github.com/modelfs/modelfs/prefetch"
)

// Config is everything a node needs; cmd/modelfs fills it from flags.
type Config struct {
	Mountpoint string
	// Root is the model the mount shows at its top; nil mounts an empty
	// directory that models are attached to through the API.
	Root *backend.Location
	// Store holds the defaults every model's store starts from: endpoint,
	// region; credentials come from each SDK's chain unless a model brings
	// its own.
	Store    backend.Config
	Policy   backend.Policy
	Cache    cache.Config
	Fetch    prefetch.Config // Concurrency 0: from the network profile, searched at run time
	Gbps     float64         // network bandwidth that picks the profile
	Prefetch prefetch.Mode
	Filter   fs.Filter // for the root model
	FS       fs.Options
	// StatusAddr is where the status server listens; "" disables it. With
	// StatusOptional, an address in use only disables it, with a warning.
	StatusAddr     string
	StatusOptional bool
}

// Node is a running mount with its models and status server.
type Node struct {
	cfg     Config
	cache   *cache.Cache
	stats   *backend.Stats // every reader counts here
	fetcher *prefetch.Fetcher
	mount   *fs.Mount
	latency prometheus.Histogram
	reg     *prometheus.Registry
	status  *http.Server
	// StatusURL is the status server's address (http://host:port), once
	// it listens.
	StatusURL string

	ctx    context.Context // ends when the node stops
	cancel context.CancelFunc

	mu     sync.Mutex
	models map[string]*model
	alive  *probe // the mount check in flight, if any
}

// unknownModelBytes sizes the network profile when the mount starts without
// a model to size it by.
const unknownModelBytes = 64 << 30

// Start lists the root model (if any), mounts, starts warming and starts the
// status server. Errors name their cause; nothing stays mounted after one.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := fs.CheckMountpoint(cfg.Mountpoint); err != nil {
		return nil, err
	}
	var ln net.Listener
	if cfg.StatusAddr != "" {
		var err error
		if ln, err = net.Listen("tcp", cfg.StatusAddr); err != nil {
			if !cfg.StatusOptional {
				return nil, fmt.Errorf("status server: %w", err)
			}
			slog.Warn("no status server: its address is taken", "addr", cfg.StatusAddr, "err", err)
		}
	}
	n := &Node{cfg: cfg, stats: new(backend.Stats), models: map[string]*model{}}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "modelfs_get_duration_seconds", Help: "Duration of successful ranged GETs.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})

	var root *model
	var src *fs.Source
	size := int64(unknownModelBytes)
	if cfg.Root != nil {
		store, s, err := n.open(ctx, *cfg.Root, cfg.Root.Name(), cfg.Store, cfg.Filter)
		if err != nil {
			n.cancel()
			closeListener(ln)
			return nil, err
		}
		src, size = s, s.Tree.Bytes
		root = &model{name: cfg.Root.Name(), uri: cfg.Root.String(), own: true, store: store,
			files: s.Tree.Files, bytes: s.Tree.Bytes, probe: firstKey(s.Tree)}
	}
	profile := prefetch.Profile(cfg.Gbps, size)
	if cfg.Fetch.Concurrency == 0 {
		// The profile bounds the search; an explicit concurrency is used as is.
		cfg.Fetch.Concurrency, cfg.Fetch.Adaptive = profile.Concurrency, true
	}
	if cfg.Fetch.PartSize == 0 {
		cfg.Fetch.PartSize = profile.PartSize
	}
	n.cfg = cfg
	var err error
	if n.cache, err = cache.New(cfg.Cache); err != nil {
		n.abort(root, ln)
		return nil, err
	}
	// Kernel readahead beyond a quarter of the window would let one file's
	// readahead (say, of an object failing its GETs) hold every reader up.
	if kb := int(n.cache.WindowMax() / 4 >> 10); cfg.FS.ReadAheadKB > kb {
		slog.Info("kernel readahead lowered to a quarter of the cache window", "read_ahead_kb", kb)
		cfg.FS.ReadAheadKB = kb
	}
	n.fetcher = prefetch.New(n.cache, n.stats, cfg.Fetch)
	if n.mount, err = fs.MountTree(cfg.Mountpoint, src, n.fetcher, cfg.FS); err != nil {
		n.abort(root, ln)
		return nil, err
	}
	if root != nil {
		n.models[root.name] = root
		n.warm(root, n.mount.Files())
	}
	if ln != nil {
		n.serve(ln)
	}
	return n, nil
}

func closeListener(ln net.Listener) {
	if ln != nil {
		ln.Close()
	}
}

// abort undoes a failed Start.
func (n *Node) abort(root *model, ln net.Listener) {
	closeListener(ln)
	if n.fetcher != nil {
		n.fetcher.Close()
	}
	if n.cache != nil {
		n.cache.Close()
	}
	if root != nil {
		root.store.Close()
	}
	n.cancel()
}

// FetchConfig is the fetch configuration in effect.
func (n *Node) FetchConfig() prefetch.Config { return n.fetcher.Config() }

// Mount is the node's mount.
func (n *Node) Mount() *fs.Mount { return n.mount }

// open connects to a model's store and lists it, into a source for the
// mount.
func (n *Node) open(ctx context.Context, loc backend.Location, name string, sc backend.Config, filter fs.Filter) (backend.Store, *fs.Source, error) {
	// Room for the most GETs any profile runs, plus the demand reserve.
	sc.MaxConns = max(sc.MaxConns, 2*max(n.cfg.Fetch.Concurrency, 64))
	store, err := backend.Open(ctx, loc, sc)
	if err != nil {
		return nil, nil, err
	}
	r := backend.NewReader(store, n.cfg.Policy)
	r.Stats = n.stats
	r.Observe = func(d time.Duration) { n.latency.Observe(d.Seconds()) }
	relist := func(ctx context.Context) (*fs.Tree, error) {
		ctx, cancel := context.WithTimeout(ctx, backend.MetadataTimeout)
		defer cancel()
		return fs.List(ctx, store, loc.Prefix, filter)
	}
	tree, err := relist(ctx)
	if err != nil {
		store.Close()
		return nil, nil, Explain(err, loc, store)
	}
	if tree.Files == 0 && len(tree.Root.Children) == 0 {
		store.Close()
		return nil, nil, fmt.Errorf("no objects under %s (%s): check the bucket and prefix", loc, store)
	}
	for _, s := range tree.Skipped {
		slog.Warn("key not shown", "model", name, "key", s)
	}
	return store, &fs.Source{Tree: tree, Reader: r, Relist: relist}, nil
}

// warm starts pulling m's files in the background.
func (n *Node) warm(m *model, files []*prefetch.File) {
	ctx, cancel := context.WithCancel(n.ctx)
	m.mu.Lock()
	m.cancel = cancel
	m.mu.Unlock()
	n.pull(ctx, m, files)
}

// pull pulls m's files in the background until ctx ends.
func (n *Node) pull(ctx context.Context, m *model, files []*prefetch.File) {
	go func() {
		start := time.Now()
		err := n.fetcher.Warm(ctx, files, n.cfg.Prefetch, &m.progress)
		if err != nil && ctx.Err() == nil {
			slog.Warn("prefetch stopped", "model", m.name, "err", err)
			m.fail(err)
			return
		}
		slog.Debug("prefetch done", "model", m.name, "bytes", m.progress.Total.Load(),
			"seconds", time.Since(start).Seconds())
	}()
}

// Wait blocks until the mount ends from outside (fusermount -u, umount)
// or ctx ends.
func (n *Node) Wait(ctx context.Context) (unmounted bool) {
	ended := make(chan struct{})
	go func() {
		n.mount.Wait(24 * 365 * time.Hour)
		close(ended)
	}()
	select {
	case <-ended:
		return true
	case <-ctx.Done():
		return false
	}
}

// Stop unmounts (lazily when files are open), stops the status server and
// every fetch, and closes the stores. Reads still waiting fail, so open
// files cannot hold the process.
func (n *Node) Stop() error {
	var err error
	if n.status != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n.status.Shutdown(sctx)
		cancel()
	}
	if n.mount != nil {
		err = n.mount.Unmount()
	}
	n.cancel()
	n.fetcher.Close()
	if n.mount != nil && err == nil && !n.mount.Wait(time.Second) {
		slog.Info("files still open; the kernel ends the connection when this process exits")
	}
	n.mu.Lock()
	for _, m := range n.models {
		m.mu.Lock()
		if m.store != nil {
			m.store.Close()
		}
		m.gone = true
		m.mu.Unlock()
	}
	n.mu.Unlock()
	n.cache.Close()
	return err
}

// Totals is what the node did, for the closing log line.
func (n *Node) Totals() []any {
	f, c, r := &n.fetcher.Stats, &n.cache.Stats, n.stats
	return []any{
		"bytes_served", f.BytesServed.Load(),
		"bytes_fetched", r.BytesFetched.Load(),
		"gets", r.Requests.Load(),
		"demand_fetches", f.DemandFetches.Load(),
		"readahead_fetches", f.ReadaheadFetches.Load(),
		"eager_fetches", f.EagerFetches.Load(),
		"promotions", f.Promotions.Load(),
		"rereads", f.Rereads.Load(),
		"cache_hits", c.Hits.Load(),
		"cache_misses", c.Misses.Load(),
		"window_waits", c.Waits.Load(),
		"reclaimed", c.Reclaimed.Load(),
		"rejected", c.Rejected.Load(),
		"dropped", c.Dropped.Load(),
		"retries", r.Retries.Load(),
		"stalls", r.Stalls.Load(),
		"slow_aborts", r.SlowAborts.Load(),
		"truncations", r.Truncations.Load(),
		"preconditions", r.Preconditions.Load(),
		"failures", r.Failures.Load(),
	}
}

// Models lists the models by name.
func (n *Node) Models() []ModelStatus {
	ms := n.modelList()
	out := make([]ModelStatus, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.status(n.cache.WindowMax()))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// modelList is the models now in the table, to visit without holding
// n.mu.
func (n *Node) modelList() []*model {
	n.mu.Lock()
	defer n.mu.Unlock()
	ms := make([]*model, 0, len(n.models))
	for _, m := range n.models {
		ms = append(ms, m)
	}
	return ms
}

// Explain turns a store error into a message that names the cause.
func Explain(err error, loc backend.Location, store backend.Store) error {
	var ne net.Error
	switch {
	case errors.Is(err, backend.ErrNoBucket):
		return fmt.Errorf("bucket %q does not exist (%s): %w", loc.Bucket, store, err)
	case errors.Is(err, backend.ErrAccess):
		return fmt.Errorf("the store refused the credentials or the request for %s (%s): %w", loc, store, err)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne):
		return fmt.Errorf("cannot reach the object store (%s): %w", store, err)
	}
	return fmt.Errorf("%s: %w", loc, err)
}
