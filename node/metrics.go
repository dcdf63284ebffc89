package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// registry builds the /metrics registry: the node's counters read at
// scrape time, the GET latency histogram, and Go and process metrics.
func (n *Node) registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		n.latency, (*collector)(n))
	return reg
}

// collector exposes the node's atomic counters without copying them into
// Prometheus types on every event.
type collector Node

type metric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(n *Node) float64
}

func counter(name, help string, v func(n *Node) int64) metric {
	return metric{prometheus.NewDesc(name, help, nil, nil), prometheus.CounterValue, func(n *Node) float64 { return float64(v(n)) }}
}

func gauge(name, help string, v func(n *Node) int64) metric {
	return metric{prometheus.NewDesc(name, help, nil, nil), prometheus.GaugeValue, func(n *Node) float64 { return float64(v(n)) }}
}

var metrics = []metric{
	counter("modelfs_bytes_fetched_total", "Body bytes received from object stores.", func(n *Node) int64 { return n.stats.BytesFetched.Load() }),
	counter("modelfs_bytes_served_total", "Bytes delivered to readers through the mount.", func(n *Node) int64 { return n.fetcher.Stats.BytesServed.Load() }),
	counter("modelfs_get_requests_total", "Ranged GET attempts.", func(n *Node) int64 { return n.stats.Requests.Load() }),
	counter("modelfs_get_retries_total", "GET attempts after a failed one.", func(n *Node) int64 { return n.stats.Retries.Load() }),
	counter("modelfs_get_stalls_total", "GETs aborted for no bytes within the request timeout.", func(n *Node) int64 { return n.stats.Stalls.Load() }),
	counter("modelfs_get_slow_aborts_total", "GETs aborted below the low-speed limit.", func(n *Node) int64 { return n.stats.SlowAborts.Load() }),
	counter("modelfs_get_truncations_total", "GET bodies that ended early.", func(n *Node) int64 { return n.stats.Truncations.Load() }),
	counter("modelfs_get_precondition_failures_total", "GETs refused because the object changed (ETag).", func(n *Node) int64 { return n.stats.Preconditions.Load() }),
	counter("modelfs_get_failures_total", "Reads that failed after all attempts.", func(n *Node) int64 { return n.stats.Failures.Load() }),
	gauge("modelfs_gets_in_flight", "GET attempts running now.", func(n *Node) int64 { return n.stats.InFlight.Load() }),
	gauge("modelfs_get_concurrency", "The GET concurrency limit in effect.", func(n *Node) int64 { return n.fetcher.Stats.Concurrency.Load() }),
	counter("modelfs_cache_hits_total", "Chunk lookups answered by the cache.", func(n *Node) int64 { return n.cache.Stats.Hits.Load() }),
	counter("modelfs_cache_misses_total", "Chunk lookups that had to fetch.", func(n *Node) int64 { return n.cache.Stats.Misses.Load() }),
	counter("modelfs_cache_evictions_total", "Chunks the ristretto cache evicted.", func(n *Node) int64 { return n.cache.Stats.Evicted.Load() }),
	counter("modelfs_cache_rejections_total", "Served chunks ristretto's admission policy turned away.", func(n *Node) int64 { return n.cache.Stats.Rejected.Load() }),
	counter("modelfs_cache_drops_total", "Served chunks ristretto dropped on a full set buffer.", func(n *Node) int64 { return n.cache.Stats.Dropped.Load() }),
	counter("modelfs_cache_reclaims_total", "Unread chunks moved out of the window for a more urgent fetch.", func(n *Node) int64 { return n.cache.Stats.Reclaimed.Load() }),
	counter("modelfs_cache_window_waits_total", "Fetches that waited for window room.", func(n *Node) int64 { return n.cache.Stats.Waits.Load() }),
	gauge("modelfs_cache_window_bytes", "Bytes of chunks being fetched or fetched ahead and unread.", func(n *Node) int64 { return n.cache.WindowBytes() }),
	gauge("modelfs_cache_allocated_bytes", "Bytes of chunk buffers, in use or free.", func(n *Node) int64 { return n.cache.Allocated() }),
	gauge("modelfs_cache_budget_bytes", "The cache budget: MAX_IO_QUEUE × IO_CHUNKSIZE.", func(n *Node) int64 { return n.cache.Budget() }),
	counter("modelfs_fuse_reads_total", "Read requests answered with data.", func(n *Node) int64 { return n.mount.Stats().Reads.Load() }),
	counter("modelfs_fuse_lookups_total", "Lookups that reached the daemon.", func(n *Node) int64 { return n.mount.Stats().Lookups.Load() }),
	counter("modelfs_fuse_negative_lookups_total", "Lookups of names that do not exist.", func(n *Node) int64 { return n.mount.Stats().NegativeLookups.Load() }),
}

var (
	fetches    = prometheus.NewDesc("modelfs_fetches_total", "GETs started, by why: a reader's miss (demand), stream readahead, the eager pull (prefetch), or a reader asking again for bytes the kernel dropped (reread).", []string{"class"}, nil)
	modelDone  = prometheus.NewDesc("modelfs_model_prefetch_bytes_done", "Bytes of a model's pull fetched or already read.", []string{"model"}, nil)
	modelTotal = prometheus.NewDesc("modelfs_model_prefetch_bytes_total", "Bytes a model's pull covers.", []string{"model"}, nil)
	modelState = prometheus.NewDesc("modelfs_model_status", "1 for the model's current status.", []string{"model", "status"}, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range metrics {
		ch <- m.desc
	}
	ch <- fetches
	ch <- modelDone
	ch <- modelTotal
	ch <- modelState
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	n := (*Node)(c)
	for _, m := range metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(n))
	}
	f := &n.fetcher.Stats
	for class, v := range map[string]int64{"demand": f.DemandFetches.Load(), "readahead": f.ReadaheadFetches.Load(), "prefetch": f.EagerFetches.Load(), "reread": f.Rereads.Load()} {
		ch <- prometheus.MustNewConstMetric(fetches, prometheus.CounterValue, float64(v), class)
	}
	for _, st := range n.Models() {
		ch <- prometheus.MustNewConstMetric(modelDone, prometheus.GaugeValue, float64(st.BytesDone), st.Name)
		ch <- prometheus.MustNewConstMetric(modelTotal, prometheus.GaugeValue, float64(st.BytesTotal), st.Name)
		ch <- prometheus.MustNewConstMetric(modelState, prometheus.GaugeValue, 1, st.Name, st.Status)
	}
}
