package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelfs/modelfs/internal/faultproxy"
	"github.com/modelfs/modelfs/internal/safetensors"
	"github.com/modelfs/modelfs/internal/testenv"
)

// Fault tests: a modelfs daemon reads a generated model from versitygw
// through a faultproxy, which breaks object GETs on command, and verifying
// loader processes check that every byte that reaches them is right, that
// recoverable faults cost time and never bytes, and that nothing hangs.

// Bounds generous enough for a loaded 2-core machine: a fault-free load of
// these models takes well under a second.
const (
	loadLimit  = 60 * time.Second // one loader run, faults or not
	stopLimit  = 15 * time.Second // SIGTERM to exit
	mountLimit = 30 * time.Second
)

// model is a generated model seeded in a bucket of its own under "model/".
type model struct {
	bucket string
	dir    string   // the local copy
	shards []string // shard file names
	bytes  int64    // tensor bytes of all shards
}

func seedModel(t *testing.T, bucket string, spec safetensors.Spec) *model {
	t.Helper()
	m := &model{bucket: bucket, dir: t.TempDir()}
	paths, err := safetensors.Generate(m.dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		r, err := safetensors.Load(p, false)
		if err != nil {
			t.Fatal(err)
		}
		m.bytes += r.Bytes
		m.shards = append(m.shards, filepath.Base(p))
	}
	ctx := context.Background()
	if err := srv.CreateBucket(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	if err := srv.PutDir(ctx, bucket, "model/", m.dir); err != nil {
		t.Fatal(err)
	}
	return m
}

// faultMount is a daemon mounting a model through a fault proxy.
type faultMount struct {
	m     *model
	proxy *faultproxy.Proxy
	d     *testenv.Daemon
	dir   string
}

// faultFlags make faults cheap to detect and the cache small enough that
// every load goes to the store: a 500 ms first-byte timeout, the 1 MiB/s
// low-speed limit, a 16 MiB cache of 1 MiB chunks (a 12 MiB window) and
// 2 MiB GETs, and no re-listing; the status server on a free port. The
// kernel readahead keeps the proportion the defaults have to their cache
// (16 MiB of a 768 MiB window): 4 MiB, a third of the window, not more than
// all of it.
var faultFlags = []string{"--status-addr", "127.0.0.1:0", "--request-timeout", "500ms", "--low-speed-limit", "1MiB",
	"--max-io-queue", "16", "--io-chunksize", "1MiB", "--part-size", "2MiB", "--read-ahead-kb", "4096",
	"--metadata-ttl", "0"}

// mountFaulty starts a proxy in front of the test server, arms fault (if
// any) before anything is read, and mounts m through the proxy. Cleanup
// stops the daemon, unmounts whatever it left and closes the proxy.
func mountFaulty(t *testing.T, m *model, fault *faultproxy.Fault, args ...string) *faultMount {
	t.Helper()
	p, err := faultproxy.New(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if fault != nil {
		p.Set(*fault)
	}
	mnt := t.TempDir()
	full := append(append(append([]string{"--endpoint", p.URL}, faultFlags...), args...), "s3://"+m.bucket+"/model", mnt)
	d, err := testenv.StartDaemon(srv.Env(), mountLimit, full...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-d.Exited():
		default:
			d.Kill()
		}
		if isMounted(mnt) {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	return &faultMount{m: m, proxy: p, d: d, dir: mnt}
}

// shardPaths are the shards' paths in the mount.
func (fm *faultMount) shardPaths() []string {
	var ps []string
	for _, s := range fm.m.shards {
		ps = append(ps, filepath.Join(fm.dir, s))
	}
	return ps
}

// stop ends the daemon with SIGTERM and returns its "totals" counters.
func (fm *faultMount) stop(t *testing.T) map[string]int64 {
	t.Helper()
	if err := fm.d.Stop(stopLimit); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
	tot, err := totals(fm.d.Log())
	if err != nil {
		t.Fatal(err)
	}
	return tot
}

// hung reports a hang: it dumps the daemon's goroutines (SIGQUIT), keeps the
// whole log in a file that outlives the test, and fails the test.
func (fm *faultMount) hung(t *testing.T, what string) {
	t.Helper()
	metrics := fm.metrics()
	syscall.Kill(fm.d.Pid(), syscall.SIGQUIT)
	select {
	case <-fm.d.Exited():
	case <-time.After(10 * time.Second):
		fm.d.Kill()
	}
	log := fm.d.Log()
	f, err := os.CreateTemp("", "modelfs-hang-*.log")
	if err == nil {
		f.WriteString(log)
		f.Close()
		t.Logf("daemon log with goroutine dump: %s", f.Name())
	}
	t.Fatalf("%s; proxy: %d object GETs, %d faults fired; daemon metrics:\n%s\ndaemon log:\n%s",
		what, fm.proxy.ObjectGets(), fm.proxy.TotalFired(), metrics, tail(log, 8000))
}

// metrics returns the daemon's own modelfs_* metrics from its status
// server, for diagnosing a hang.
func (fm *faultMount) metrics() string {
	var addr string
	for _, line := range strings.Split(fm.d.Log(), "\n") {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "status server listening" {
			addr = rec.Addr
		}
	}
	if addr == "" {
		return "(no status server)"
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(strings.TrimSuffix(addr, "/") + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "modelfs_") && !strings.Contains(line, "_bucket{") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// totals parses the daemon's last "totals" log line into its counters.
func totals(log string) (map[string]int64, error) {
	var found map[string]any
	for _, line := range strings.Split(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "totals" {
			found = rec
		}
	}
	if found == nil {
		return nil, fmt.Errorf("no totals line in the daemon log:\n%s", log)
	}
	out := map[string]int64{}
	for k, v := range found {
		if n, ok := v.(float64); ok {
			out[k] = int64(n)
		}
	}
	return out, nil
}

// loadResult is what one loader process did.
type loadResult struct {
	bytes  int64 // tensor bytes it verified (0 unless it succeeded)
	took   time.Duration
	err    error // its exit status, when not 0
	stderr string
	hung   bool // killed at the limit
	// kernel is, for a hung loader, each thread's state and kernel stack
	// just before it was killed.
	kernel string
}

// load runs a verifying loader process over files and kills it at limit.
func load(limit time.Duration, files ...string) loadResult {
	cmd := testenv.Loader(files...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return loadResult{err: err}
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var res loadResult
	select {
	case res.err = <-exited:
	case <-time.After(limit):
		res.kernel = kernelStacks(cmd.Process.Pid)
		cmd.Process.Kill()
		res.err, res.hung = <-exited, true
	}
	res.took = time.Since(start)
	res.stderr = errb.String()
	if res.err == nil {
		n, err := strconv.ParseInt(strings.TrimSpace(out.String()), 10, 64)
		if err != nil {
			res.err = fmt.Errorf("loader printed %q", out.String())
		}
		res.bytes = n
	}
	return res
}

// kernelStacks describes where pid's threads are: state, wait channel
// and kernel stack.
func kernelStacks(pid int) string {
	var b strings.Builder
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		stat, _ := os.ReadFile(task + "/stat")
		wchan, _ := os.ReadFile(task + "/wchan")
		stack, _ := os.ReadFile(task + "/stack")
		fmt.Fprintf(&b, "thread %s: %s wchan=%s\n%s", filepath.Base(task), strings.TrimSpace(string(stat)), wchan, stack)
	}
	return b.String()
}

// mustLoad loads files and fails the test unless every tensor byte of m
// arrived, verified, within loadLimit.
func (fm *faultMount) mustLoad(t *testing.T, files ...string) loadResult {
	t.Helper()
	res := load(loadLimit, files...)
	switch {
	case res.hung:
		fm.hung(t, fmt.Sprintf("loader still running after %v; its threads:\n%s", loadLimit, res.kernel))
	case res.err != nil:
		t.Fatalf("loader failed after %v: %v\n%s\ndaemon log:\n%s", res.took, res.err, res.stderr, tail(fm.d.Log(), 6000))
	}
	return res
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// evict drops files' pages from the kernel's page cache, so the next load
// reads through the daemon again.
func evict(t testing.TB, files ...string) {
	t.Helper()
	if err := testenv.Evict(files...); err != nil {
		t.Fatal(err)
	}
}

// TestFaultRecovery: for each recoverable fault, a load through the mount
// delivers every byte right, the fault really fired, and the daemon counted
// its retries. Each scenario loads once without faults (the baseline) and
// once with the fault armed, on an evicted page cache.
//
// Every fault is bounded so that no single read can see more failures than
// its attempts (5): a 2 MiB GET cut after 512 KiB makes progress on each
// try, so Reset and Truncate strike at most 3 times per read even when
// they strike every GET; the others are limited in number.
func TestFaultRecovery(t *testing.T) {
	cases := []struct {
		name  string
		mixed bool
		fault faultproxy.Fault
		args  []string
		// daemon counters of which at least one must be above zero (the
		// daemon noticed the fault as what it is), and at least this many
		// retries
		noticed    []string
		minRetries int64
	}{
		// A body stops after 256 KiB and holds the connection: the
		// low-speed watchdog aborts it after its 3 s window (the daemon
		// counts a stall after the first byte as a slow abort; "stalls"
		// counts first-byte timeouts).
		{name: "stall", fault: faultproxy.Fault{Kind: faultproxy.Stall, After: 256 << 10, Every: 3, Limit: 2},
			noticed: []string{"stalls", "slow_aborts"}},
		// Connections reset after 512 KiB, on every GET.
		{name: "reset", mixed: true, fault: faultproxy.Fault{Kind: faultproxy.Reset, After: 512 << 10}},
		// A burst of 9 SlowDowns answers the next 9 GETs; 10 attempts
		// outlast it whichever reads it hits.
		{name: "slowdown", fault: faultproxy.Fault{Kind: faultproxy.SlowDown, Limit: 9},
			args: []string{"--max-attempts", "10"}, minRetries: 9},
		// Bodies end cleanly after 512 KiB, short of their Content-Length,
		// on every GET.
		{name: "truncate", fault: faultproxy.Fault{Kind: faultproxy.Truncate, After: 512 << 10}},
		// Bodies trickle at 64 KiB/s, far below the 1 MiB/s limit.
		{name: "drip", fault: faultproxy.Fault{Kind: faultproxy.Drip, Rate: 64 << 10, Every: 3, Limit: 2},
			noticed: []string{"slow_aborts"}},
		// No byte for 3 s, beyond the 500 ms first-byte timeout.
		{name: "delay", fault: faultproxy.Fault{Kind: faultproxy.Delay, Delay: 3 * time.Second, Every: 2, Limit: 4},
			noticed: []string{"stalls"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := seedModel(t, "faults-"+c.name, safetensors.Spec{Bytes: 48 << 20, Shards: 2, Seed: 500, Mixed: c.mixed})
			fm := mountFaulty(t, m, nil, c.args...)
			files := fm.shardPaths()
			base := fm.mustLoad(t, files...)
			if base.bytes != m.bytes {
				t.Fatalf("fault-free load verified %d bytes, want %d", base.bytes, m.bytes)
			}
			evict(t, files...)
			getsBefore := fm.proxy.ObjectGets()
			fm.proxy.Set(c.fault)
			res := fm.mustLoad(t, files...)
			fm.proxy.Off()
			if res.bytes != m.bytes {
				t.Fatalf("load under faults verified %d bytes, want %d", res.bytes, m.bytes)
			}
			fired := fm.proxy.Fired(c.fault.Kind)
			gets := fm.proxy.ObjectGets() - getsBefore
			if fired == 0 {
				t.Fatalf("the %s fault never fired (%d object GETs): the scenario tested nothing", c.name, gets)
			}
			if c.fault.Limit > 0 && fired > c.fault.Limit {
				t.Errorf("fired %d times, above its limit %d", fired, c.fault.Limit)
			}
			tot := fm.stop(t)
			if tot["retries"] < max(c.minRetries, 1) {
				t.Errorf("daemon retries %d after %d %s faults, want at least %d", tot["retries"], fired, c.name, max(c.minRetries, 1))
			}
			var noticed int64
			for _, k := range c.noticed {
				noticed += tot[k]
			}
			if len(c.noticed) > 0 && noticed == 0 {
				t.Errorf("daemon counted none of %v after %d %s faults: %v", c.noticed, fired, c.name, tot)
			}
			if tot["failures"] != 0 {
				t.Errorf("daemon gave up on %d reads under recoverable faults", tot["failures"])
			}
			t.Logf("%-8s baseline %5.2fs, under faults %5.2fs (recovery cost %+.2fs); %d faults in %d object GETs; %d bytes verified; "+
				"daemon: %d GETs, %d retries, %d stalls, %d slow aborts, %d failures",
				c.name, base.took.Seconds(), res.took.Seconds(), (res.took - base.took).Seconds(), fired, gets, res.bytes,
				tot["gets"], tot["retries"], tot["stalls"], tot["slow_aborts"], tot["failures"])
		})
	}
}

// TestFaultAttemptsExhausted: when every GET of one shard stalls, reads of
// it fail with EIO in bounded time and never hang: an O_DIRECT pread gets
// EIO, an mmap loader dies (SIGBUS) instead of faulting forever. Readers
// of other files are not held up meanwhile, not even while the eager pull
// has most of the cache window waiting on the failing shard: a whole
// unaffected shard loads about as fast as without the failing neighbour.
func TestFaultAttemptsExhausted(t *testing.T) {
	m := seedModel(t, "faults-exhausted", safetensors.Spec{Bytes: 48 << 20, Shards: 2, Seed: 600})
	bad := m.shards[0]
	goodWant, err := safetensors.Load(filepath.Join(m.dir, m.shards[1]), false)
	if err != nil {
		t.Fatal(err)
	}

	// The unaffected shard alone, on a mount of its own, for comparison.
	// Without the eager pull: while it fills the window with the other
	// shard, this reader could be stranded (TestSlowPrefetchDoesNotStrandReaders).
	fm := mountFaulty(t, m, nil, "--prefetch", "none")
	base := fm.mustLoad(t, filepath.Join(fm.dir, m.shards[1]))
	fm.stop(t)

	// Every GET of the bad shard sends headers and then nothing: each
	// attempt ends at the first-byte timeout, and each read gives up after
	// its attempts. Armed before mounting, so that nothing of the shard is
	// ever cached and the eager pull meets the fault first.
	stall := faultproxy.Fault{Kind: faultproxy.Stall, Match: func(key string) bool { return strings.HasSuffix(key, "/"+bad) }}
	fm = mountFaulty(t, m, &stall)
	badPath, goodPath := filepath.Join(fm.dir, bad), filepath.Join(fm.dir, m.shards[1])
	failing := make(chan loadResult, 1)
	go func() { failing <- load(failLimit, badPath) }()
	waitFor(t, 10*time.Second, "the stall to strike", func() bool { return fm.proxy.Fired(faultproxy.Stall) > 0 })

	// The eager pull takes the bad shard first: let it claim most of the
	// cache window for GETs that will all fail, as it would on a node.
	waitFor(t, 20*time.Second, "the eager pull to start GETs of the failing shard", func() bool {
		return fm.metric(`modelfs_fetches_total{class="prefetch"}`) >= 4
	})

	// Another reader meanwhile: a whole good shard, then the config.
	good := load(loadLimit, goodPath)
	switch {
	case good.hung:
		fm.hung(t, "the loader of an unaffected shard hung while another shard was failing; its threads:\n"+good.kernel)
	case good.err != nil:
		t.Fatalf("loader of an unaffected shard failed: %v\n%s", good.err, good.stderr)
	case good.bytes != goodWant.Bytes:
		t.Errorf("unaffected shard: verified %d bytes, want %d", good.bytes, goodWant.Bytes)
	}
	if good.took > base.took+heldUpSlack {
		t.Errorf("readers of other files are held up: the unaffected shard loaded in %.2fs beside the failing one, %.2fs alone",
			good.took.Seconds(), base.took.Seconds())
	}
	cfg, err := os.ReadFile(filepath.Join(fm.dir, "config.json"))
	want, _ := os.ReadFile(filepath.Join(m.dir, "config.json"))
	if err != nil || !bytes.Equal(cfg, want) {
		t.Errorf("config.json while a shard fails: %v", err)
	}

	// A direct read of the bad shard, past anything cached: EIO, in time.
	size := int64(len(mustRead(t, filepath.Join(m.dir, bad))))
	type readRes struct {
		err  error
		took time.Duration
	}
	direct := make(chan readRes, 1)
	go func() {
		start := time.Now()
		f, err := os.OpenFile(badPath, os.O_RDONLY|syscall.O_DIRECT, 0)
		if err == nil {
			_, err = f.ReadAt(make([]byte, 1<<20), size-1<<20)
			f.Close()
		}
		direct <- readRes{err, time.Since(start)}
	}()
	var d readRes
	select {
	case d = <-direct:
	case <-time.After(failLimit):
		fm.hung(t, "an O_DIRECT read of the failing shard hung")
	}
	if !errors.Is(d.err, syscall.EIO) {
		t.Errorf("O_DIRECT read of the failing shard: %v, want EIO", d.err)
	}

	bl := <-failing
	fired := fm.proxy.Fired(faultproxy.Stall)
	t.Logf("exhausted: O_DIRECT read failed (%v) after %.2fs; the mmap loader of the failing shard exited (%v) after %.2fs (hung: %v); "+
		"unaffected shard (%d bytes verified) loaded in %.2fs meanwhile, %.2fs alone; %d stalls injected",
		d.err, d.took.Seconds(), bl.err, bl.took.Seconds(), bl.hung, good.bytes, good.took.Seconds(), base.took.Seconds(), fired)
	switch {
	case bl.hung:
		fm.hung(t, fmt.Sprintf("the mmap loader of the failing shard neither failed nor finished in %v (the daemon answered "+
			"its reads with EIO; see the read failed lines); its threads:\n%s", failLimit, bl.kernel))
	case bl.err == nil:
		t.Errorf("the loader of a shard whose every GET stalls succeeded (%d bytes)", bl.bytes)
	}
	tot := fm.stop(t)
	if tot["stalls"] == 0 {
		t.Errorf("daemon counted no stalls after %d", fired)
	}
	if !strings.Contains(fm.d.Log(), `"errno":"input/output error"`) {
		t.Errorf("the daemon logged no read failing with EIO")
	}
	t.Logf("exhausted: daemon totals %v", tot)
}

const (
	// failLimit bounds how long a read whose every GET stalls may take to
	// fail: one read needs 5 attempts × 500 ms plus backoff, about 3 s.
	failLimit = 30 * time.Second
	// heldUpSlack is how much longer than alone a load may take beside a
	// failing neighbour: well under one attempt cycle of the failing read.
	heldUpSlack = 2 * time.Second
)

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitFor polls cond every 10 ms until it holds, failing the test after
// limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		<-tick.C
	}
}

// TestSlowPrefetchDoesNotStrandReaders: a reader that finds the cache
// window full of prefetched chunks still loading gets room as soon as they
// are ready, since ready unread prefetches may be moved out for it; it
// must not wait for a release that never comes.
func TestSlowPrefetchDoesNotStrandReaders(t *testing.T) {
	m := seedModel(t, "faults-strand", safetensors.Spec{Bytes: 48 << 20, Shards: 2, Seed: 800})
	first, second := m.shards[0], m.shards[1]
	// Every GET of the first shard, which the eager pull takes first,
	// answers after 2 s: slow, but within the request timeout.
	slow := faultproxy.Fault{Kind: faultproxy.Delay, Delay: 2 * time.Second,
		Match: func(key string) bool { return strings.HasSuffix(key, "/"+first) }}
	fm := mountFaulty(t, m, &slow, "--request-timeout", "10s")
	// Once the eager pull waits for window room, the window holds all the
	// prefetches it may: chunks of the first shard, loading for 2 s.
	waitFor(t, 30*time.Second, "the eager pull to fill the cache window", func() bool {
		return fm.metric("modelfs_cache_window_waits_total") >= 1
	})
	res := load(strandLimit, filepath.Join(fm.dir, second))
	switch {
	case res.hung:
		fm.hung(t, fmt.Sprintf("a reader of %s stayed blocked for %v after the window filled with slow prefetches of %s "+
			"(they were ready after 2 s); its threads:\n%s", second, strandLimit, first, res.kernel))
	case res.err != nil:
		t.Fatalf("loader failed after %v: %v\n%s", res.took, res.err, res.stderr)
	}
	want, err := safetensors.Load(filepath.Join(m.dir, second), false)
	if err != nil {
		t.Fatal(err)
	}
	if res.bytes != want.Bytes {
		t.Errorf("verified %d bytes, want %d", res.bytes, want.Bytes)
	}
	fm.stop(t)
	t.Logf("strand: %s loaded in %.2fs beside a window full of 2-second prefetches; %d delays injected",
		second, res.took.Seconds(), fm.proxy.Fired(faultproxy.Delay))
}

// strandLimit bounds a load that waits for slow prefetches: they are
// ready after 2 s.
const strandLimit = 20 * time.Second

// metric reads one of the daemon's gauges or counters from its status
// server; -1 when it cannot.
func (fm *faultMount) metric(name string) float64 {
	for _, line := range strings.Split(fm.metrics(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}

// TestObjectReplacedMidRead: a shard replaced in the store while a file
// handle reads it (and no re-list publishes the change) gives that handle
// its old bytes or ESTALE/EIO, never a byte of the new object.
func TestObjectReplacedMidRead(t *testing.T) {
	m := seedModel(t, "faults-replaced", safetensors.Spec{Bytes: 48 << 20, Shards: 2, Seed: 700})
	// No eager pull: the handle's reads past the first chunks must go to
	// the store, not to chunks pulled before the replacement.
	fm := mountFaulty(t, m, nil, "--prefetch", "none")
	name := m.shards[0]
	oldData, err := os.ReadFile(filepath.Join(m.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	// The replacement: the same layout from another seed.
	newDir := t.TempDir()
	if _, err := safetensors.Generate(newDir, safetensors.Spec{Bytes: 48 << 20, Shards: 2, Seed: 900}); err != nil {
		t.Fatal(err)
	}
	newData, err := os.ReadFile(filepath.Join(newDir, name))
	if err != nil {
		t.Fatal(err)
	}

	f, err := os.OpenFile(filepath.Join(fm.dir, name), os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const step = 1 << 20
	size := int64(len(oldData))
	type counts struct{ old, stale, eio int }
	done := make(chan counts, 1)
	failed := make(chan string, 1)
	go func() {
		var c counts
		buf := make([]byte, step)
		for off := int64(0); off < size; off += step {
			if off == 4*step {
				// Part read: replace the object under the open handle.
				if err := srv.Put(context.Background(), m.bucket, "model/"+name, newData); err != nil {
					failed <- err.Error()
					return
				}
			}
			n, err := f.ReadAt(buf, off)
			if err == io.EOF && n > 0 {
				err = nil // the last, short read
			}
			switch {
			case errors.Is(err, syscall.ESTALE):
				c.stale++
			case errors.Is(err, syscall.EIO):
				c.eio++
			case err != nil:
				failed <- fmt.Sprintf("read at %d: %v, want the old bytes, ESTALE or EIO", off, err)
				return
			case !bytes.Equal(buf[:n], oldData[off:off+int64(n)]):
				what := "bytes of neither version"
				if bytes.Equal(buf[:n], newData[off:min(off+int64(n), int64(len(newData)))]) {
					what = "the NEW object's bytes"
				}
				failed <- fmt.Sprintf("read at %d returned %s", off, what)
				return
			default:
				c.old++
			}
		}
		done <- c
	}()
	var c counts
	select {
	case c = <-done:
	case msg := <-failed:
		t.Fatal(msg)
	case <-time.After(loadLimit):
		fm.hung(t, "reads of a replaced object hung")
	}
	if c.stale+c.eio == 0 {
		t.Errorf("all %d reads after the replacement returned old bytes: none reached the store", c.old-4)
	}
	tot := fm.stop(t)
	t.Logf("replaced: %d reads returned old bytes (4 before the PUT), %d ESTALE, %d EIO, none new; daemon: %d GETs, %d retries",
		c.old, c.stale, c.eio, tot["gets"], tot["retries"])
}
