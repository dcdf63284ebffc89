package prefetch

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Network profiles, after the published tuning of model streamers:
// standard nodes do best with 8 MiB requests and 32 in flight; on nodes
// with 50 Gbps or more, fewer, larger requests, one per 4 GB of model.
const (
	fastGbps         = 50
	standardPart     = 8 << 20
	standardParallel = 32
	fastPart         = 64 << 20
	fastParallelMin  = 8
	fastParallelMax  = 64
	fastBytesPerGET  = 4e9
)

// Profile picks the GET size and concurrency for a node with gbps of
// network bandwidth (0: unknown, treated as standard) loading a model of
// modelBytes.
func Profile(gbps float64, modelBytes int64) Config {
	if gbps < fastGbps {
		return Config{PartSize: standardPart, Concurrency: standardParallel}
	}
	n := int((modelBytes + fastBytesPerGET - 1) / fastBytesPerGET)
	return Config{PartSize: fastPart, Concurrency: min(max(n, fastParallelMin), fastParallelMax)}
}

// DetectGbps reads the fastest link speed of the node's physical network
// interfaces from sysfs; ok is false when none reports one (virtual NICs
// often do not).
func DetectGbps() (gbps float64, ok bool) {
	ifs, _ := filepath.Glob("/sys/class/net/*")
	for _, dir := range ifs {
		if _, err := os.Stat(filepath.Join(dir, "device")); err != nil {
			continue // loopback, bridges, veths: no device behind them
		}
		b, err := os.ReadFile(filepath.Join(dir, "speed"))
		if err != nil {
			continue
		}
		mbps, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || mbps <= 0 {
			continue
		}
		if g := float64(mbps) / 1000; g > gbps {
			gbps, ok = g, true
		}
	}
	return gbps, ok
}
