package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelfs/modelfs/internal/faultproxy"
	"github.com/modelfs/modelfs/internal/safetensors"
	"github.com/modelfs/modelfs/internal/testenv"
)

var soakFor = flag.Duration("soak", 20*time.Second,
	"how long TestSoak keeps loaders running through faults (e.g. -soak=5m)")

// Soak shape: loaders, how long a fault stays on, and the quiet time
// between faults.
const (
	soakLoaders = 8
	soakOn      = 3 * time.Second
	// soakOff outlasts the longest failed attempt (a stall or drip is
	// aborted 3.5 s after it starts, so at most 0.5 s into the quiet time)
	// plus the longest backoff (2 s): a read struck in one fault period
	// retries in the quiet time after it and is never struck again.
	soakOff       = 4 * time.Second
	soakAttempts  = 10
	soakLoadLimit = 90 * time.Second
	soakBudget    = 16 << 20 // --max-io-queue 16 × --io-chunksize 1MiB
)

// soakFaults are recoverable under the soak's policy (10 attempts, 2 MiB
// GETs): within one fault period a read is struck at most 4 times (Reset
// and Truncate cut a GET after 512 KiB, so a 2 MiB GET makes progress on
// each try and is cut at most 3 times; the others are limited per period),
// and soakOff makes sure no read is struck in two periods.
var soakFaults = []faultproxy.Fault{
	{Kind: faultproxy.Reset, After: 512 << 10, Every: 2},
	{Kind: faultproxy.Truncate, After: 512 << 10, Every: 2},
	{Kind: faultproxy.SlowDown, Limit: 4},
	{Kind: faultproxy.Stall, After: 256 << 10, Every: 5, Limit: 2},
	{Kind: faultproxy.Drip, Rate: 64 << 10, Every: 5, Limit: 2},
	{Kind: faultproxy.Delay, Delay: 2 * time.Second, Every: 3, Limit: 4},
}

// TestSoak: eight verifying loaders load four shards over and over through
// one daemon, each run on an evicted page cache, while a fault of a random
// kind switches on and off. Every fault is recoverable, so every load must
// succeed with every byte right, none may hang, and the daemon must stay
// within its memory budget.
func TestSoak(t *testing.T) {
	m := seedModel(t, "faults-soak", safetensors.Spec{Bytes: 64 << 20, Shards: 4, Seed: 1000, Mixed: true})
	fm := mountFaulty(t, m, nil, "--max-attempts", fmt.Sprint(soakAttempts))
	files := fm.shardPaths()
	seed := uint64(time.Now().UnixNano())
	t.Logf("soak: %v, %d loaders over %d shards (%d tensor bytes), fault seed %d", *soakFor, soakLoaders, len(files), m.bytes, seed)

	stop := make(chan struct{})
	toggled := make(chan []string, 1)
	go func() { toggled <- toggleFaults(fm.proxy, rand.New(rand.NewPCG(seed, 0)), stop) }()

	type outcome struct {
		loads int
		bytes int64
		worst time.Duration
		fail  string
	}
	results := make([]outcome, soakLoaders)
	deadline := time.Now().Add(*soakFor)
	var wg sync.WaitGroup
	for w := range soakLoaders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[w]
			for i := 0; time.Now().Before(deadline); i++ {
				order := append(append([]string(nil), files[(w+i)%len(files):]...), files[:(w+i)%len(files)]...)
				if err := testenv.Evict(order...); err != nil {
					r.fail = err.Error()
					return
				}
				res := load(soakLoadLimit, order...)
				r.worst = max(r.worst, res.took)
				switch {
				case res.hung:
					r.fail = fmt.Sprintf("load %d hung for %v (faults fired: %s); its threads:\n%s", i, soakLoadLimit, fired(fm.proxy), res.kernel)
					return
				case res.err != nil:
					r.fail = fmt.Sprintf("load %d failed after %v (faults fired: %s): %v\n%s", i, res.took, fired(fm.proxy), res.err, res.stderr)
					return
				case res.bytes != m.bytes:
					r.fail = fmt.Sprintf("load %d verified %d bytes, want %d", i, res.bytes, m.bytes)
					return
				}
				r.loads++
				r.bytes += res.bytes
			}
		}()
	}
	wg.Wait()
	close(stop)
	periods := <-toggled

	ps, err := testenv.Proc(fm.d.Pid())
	if err != nil {
		t.Fatal(err)
	}
	var loads int
	var bytes int64
	var worst time.Duration
	var failed []string
	for w, r := range results {
		loads += r.loads
		bytes += r.bytes
		worst = max(worst, r.worst)
		if r.fail != "" {
			failed = append(failed, fmt.Sprintf("loader %d: %s", w, r.fail))
		}
	}
	t.Logf("soak: fault periods: %s", strings.Join(periods, ", "))
	t.Logf("soak: %d loads, %d bytes verified, slowest load %.2fs; faults fired: %s; daemon peak RSS %d MiB",
		loads, bytes, worst.Seconds(), fired(fm.proxy), ps.PeakRSS>>20)
	if len(failed) > 0 {
		for _, f := range failed {
			t.Error(f)
		}
		fm.hung(t, fmt.Sprintf("%d of %d loaders failed under recoverable faults", len(failed), soakLoaders))
	}
	if loads < soakLoaders {
		t.Errorf("only %d loads completed in %v", loads, *soakFor)
	}
	if fm.proxy.TotalFired() == 0 {
		t.Error("no fault fired during the soak")
	}
	if limit := int64(soakBudget + 256<<20); ps.PeakRSS > limit {
		t.Errorf("daemon peak RSS %d MiB exceeds the cache budget + 256 MiB (%d MiB)", ps.PeakRSS>>20, limit>>20)
	}
	tot := fm.stop(t)
	if n, ok := tot["failures"]; ok && n != 0 {
		t.Errorf("the daemon gave up on %d reads under recoverable faults", n)
	}
	t.Logf("soak: daemon totals %v", tot)
}

// toggleFaults arms a fault for soakOn, then nothing for soakOff, over and
// over until stop, going through the kinds in random order. It returns
// what it armed, for the log.
func toggleFaults(p *faultproxy.Proxy, rng *rand.Rand, stop <-chan struct{}) []string {
	var periods []string
	var order []int
	for {
		if len(order) == 0 {
			order = rng.Perm(len(soakFaults))
		}
		f := soakFaults[order[0]]
		order = order[1:]
		before := p.Fired(f.Kind)
		p.Set(f)
		quit := sleepOrStop(soakOn, stop)
		p.Off()
		periods = append(periods, fmt.Sprintf("%s×%d", f.Kind, p.Fired(f.Kind)-before))
		if quit || sleepOrStop(soakOff, stop) {
			return periods
		}
	}
}

// sleepOrStop waits d; it reports whether stop closed first.
func sleepOrStop(d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false
	case <-stop:
		return true
	}
}

// fired lists how often each kind of fault struck.
func fired(p *faultproxy.Proxy) string {
	var parts []string
	for _, k := range faultproxy.Kinds {
		if n := p.Fired(k); n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
