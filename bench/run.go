package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/internal/safetensors"
	"github.com/modelfs/modelfs/internal/testenv"
)

var verbose bool

// row is one measured workload.
type row struct {
	System   string  `json:"system"`
	Workload string  `json:"workload"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	MiBps    float64 `json:"mib_per_s"`
	Ratio    float64 `json:"ratio_to_ceiling"`
	// Daemon figures, where a daemon (modelfs or a peer) served the workload.
	PeakRSS   int64   `json:"peak_rss_bytes,omitempty"`
	CPUPerGiB float64 `json:"daemon_cpu_s_per_gib,omitempty"`
	// ServerCPUPerGiB is the object server's CPU time per GiB delivered.
	ServerCPUPerGiB float64 `json:"server_cpu_s_per_gib,omitempty"`
	// Fetched is what the object server sent from before the mount until
	// the workload ended (its write-type system calls: the same count for
	// every system).
	Fetched     int64   `json:"bytes_fetched,omitempty"`
	FetchedRate float64 `json:"fetched_per_model_byte,omitempty"`
	Note        string  `json:"note,omitempty"`
	// Daemon is the modelfs daemon's own account of the workload.
	Daemon map[string]any `json:"daemon,omitempty"`
	// after is what the server sent after the work marked the end of its
	// measured part.
	after int64
	// RatioToLocal compares a warm reload with the local page-cached copy
	// loaded in turns with it.
	RatioToLocal float64 `json:"ratio_to_local,omitempty"`
	// RatioToPaged compares it with a local copy held in 4 KiB pages, as
	// the mount's page cache is on this kernel; LargeFolios is the share
	// of the mount's, the local copy's and that copy's page cache in large
	// folios.
	RatioToPaged float64 `json:"ratio_to_local_4k_pages,omitempty"`
	LargeFolios  string  `json:"large_folios,omitempty"`
	// BudgetBytes is modelfs's cache budget in this row.
	BudgetBytes int64 `json:"cache_budget_bytes,omitempty"`
	// Sweep rows: which sweep, the point on it, and the model, loaders
	// and ceiling the point ran with.
	Sweep        string  `json:"sweep,omitempty"`
	Point        string  `json:"point,omitempty"`
	ModelBytes   int64   `json:"model_bytes,omitempty"`
	Shards       int     `json:"shards,omitempty"`
	Loaders      int     `json:"loaders,omitempty"`
	CeilingMiBps float64 `json:"ceiling_mib_per_s,omitempty"`
}

// rate is the row's MiB/s.
func (r row) rate() float64 { return float64(r.Bytes) / (1 << 20) / r.Seconds }

type report struct {
	Machine    string  `json:"machine"`
	Date       string  `json:"date"`
	ModelBytes int64   `json:"model_bytes"`
	Shards     int     `json:"shards"`
	Budget     int64   `json:"cache_budget_bytes"`
	Ceiling    float64 `json:"ceiling_mib_per_s"`
	TOSCeiling float64 `json:"tos_ceiling_mib_per_s,omitempty"`
	Rows       []row   `json:"rows"`
	// Repeat is the runs of each modelfs and direct workload (the fastest
	// counts); PeerRepeat the runs of each peer workload.
	Repeat     int `json:"repeat"`
	PeerRepeat int `json:"peer_repeat"`
	// Systems are the file systems measured: versions and flags.
	Systems []*system `json:"systems"`
	// Headline is each system's cold and warm load as ratios.
	Headline []headline `json:"headline,omitempty"`
	Sweeps   []string   `json:"sweeps,omitempty"`
	Skipped  []string   `json:"skipped,omitempty"`
	Charts   []string   `json:"charts,omitempty"`
}

// headline is one system's result in ratios: cold loads to the ceiling,
// the warm reload to the local page-cached copy.
type headline struct {
	System      string  `json:"system"`
	ColdLoad    float64 `json:"cold_mmap_load_x_ceiling"`
	ColdCat     float64 `json:"cold_cat_x_ceiling"`
	WarmVsLocal float64 `json:"warm_reload_x_local"`
	WarmVsPaged float64 `json:"warm_reload_x_local_4k_pages,omitempty"`
}

// bench is one run's state.
type bench struct {
	w          *world
	rep        *report
	main       *model
	repeat     int
	peerRepeat int
	systems    []*system // modelfs first, then the peers installed
	budget     int64     // modelfs cache budget
	extra      []string  // extra modelfs flags
	ceilConc   int       // the concurrency that gave the ceiling
	want       func(string) bool
	paged      *[]string // the main model's copy in 4 KiB pages, once written
}

func run(args []string) error {
	fl := flag.NewFlagSet("run", flag.ContinueOnError)
	sizeMiB := fl.Int64("size-mib", 4096, "model size in MiB")
	shards := fl.Int("shards", 2, "safetensors shards")
	budgetMiB := fl.Int64("budget-mib", 512, "modelfs cache budget in MiB")
	mixed := fl.Bool("mixed", false, "mixed-dtype shards (F8 weights with F32 scales)")
	out := fl.String("json", "bench/results/latest.json", "write the results here, and the charts beside it (.svg)")
	extra := fl.String("flags", "", "extra modelfs mount flags, space separated")
	keep := fl.String("keep", "", "keep the server's files in this directory and reuse models seeded there")
	fl.BoolVar(&verbose, "v", false, "print the daemon's counters after each workload")
	repeat := fl.Int("repeat", 3, "runs of each modelfs and direct workload; the fastest counts")
	peerRepeat := fl.Int("peer-repeat", 2, "runs of each peer workload; the fastest counts")
	only := fl.String("only", "", "comma-separated workloads to run (ceiling,cat,load,warm,two,tos); default all")
	systems := fl.String("systems", "modelfs,rclone,s3fs", "systems to mount (peers run only when installed)")
	rcloneFlags := fl.String("rclone-flags", "", "rclone mount flags replacing the tuned ones, space separated")
	s3fsOpts := fl.String("s3fs-opts", "", "s3fs -o options replacing the tuned ones, space separated")
	sweeps := fl.String("sweeps", "", "sweeps to run after the workloads: size,shards,budget,loaders or all")
	sizes := fl.String("sweep-sizes", "1024,4096,16384", "model sizes of the size sweep, MiB")
	if err := fl.Parse(args); err != nil {
		return err
	}
	sweepList, err := parseSweeps(*sweeps)
	if err != nil {
		return err
	}
	sizeList, err := parseSizes(*sizes)
	if err != nil {
		return err
	}
	inList := func(list, w string) bool { return strings.Contains(","+list+",", ","+w+",") }
	b := &bench{repeat: *repeat, peerRepeat: *peerRepeat, budget: *budgetMiB << 20, extra: strings.Fields(*extra),
		ceilConc: 16, want: func(w string) bool { return *only == "" || inList(*only, w) }}
	b.rep = &report{Machine: machine(), Date: time.Now().UTC().Format(time.RFC3339), Shards: *shards,
		Budget: b.budget, Repeat: *repeat, PeerRepeat: *peerRepeat, Sweeps: sweepList}
	if inList(*systems, "modelfs") {
		b.systems = append(b.systems, b.modelfs(b.budget))
	}
	found, notes := peers(*rcloneFlags, *s3fsOpts)
	for _, p := range found {
		if inList(*systems, p.Name) {
			b.systems = append(b.systems, p)
		}
	}
	b.rep.Skipped = notes
	for _, n := range notes {
		fmt.Println("note:", n)
	}
	b.rep.Systems = b.systems

	if b.w, err = newWorld(*keep); err != nil {
		return err
	}
	defer b.w.close()
	spec := safetensors.Spec{Bytes: *sizeMiB << 20, Shards: *shards, Seed: 1, Mixed: *mixed}
	if b.main, err = b.w.model(modelName(spec), spec); err != nil {
		return err
	}
	b.rep.ModelBytes = b.main.bytes
	if err := b.main.warmServer(); err != nil {
		return err
	}
	if err := b.workloads(); err != nil {
		return err
	}
	for _, s := range sweepList {
		if err := b.sweep(s, sizeList); err != nil {
			return fmt.Errorf("sweep %s: %w", s, err)
		}
	}
	b.rep.Headline = headlines(b.rep)
	printTable(b.rep, false)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	base := strings.TrimSuffix(*out, ".json")
	if err := writeCharts(b.rep, base); err != nil {
		return err
	}
	js, _ := json.MarshalIndent(b.rep, "", "  ")
	if err := os.WriteFile(*out, append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("results written to %s (charts: %s)\n", *out, strings.Join(b.rep.Charts, ", "))
	return nil
}

// modelfs is the modelfs system with a cache budget.
func (b *bench) modelfs(budget int64) *system {
	// The status server listens on a free port: other modelfs processes on
	// the machine may hold the default one.
	flags := []string{"--max-io-queue", fmt.Sprint(max(budget>>23, 1)), "--io-chunksize", "8MiB", "--status-addr", "127.0.0.1:0"}
	return modelfsSystem(append(flags, b.extra...))
}

// add completes r's rates against ceiling and modelBytes and records it.
func (b *bench) add(r row, ceiling float64, modelBytes int64) {
	if r.Seconds > 0 {
		r.MiBps = r.rate()
	}
	if ceiling > 0 {
		r.Ratio = r.MiBps / ceiling
	}
	if r.Fetched > 0 {
		r.FetchedRate = float64(r.Fetched) / float64(modelBytes)
	}
	if r.System == "modelfs" && r.BudgetBytes > 0 && r.PeakRSS > r.BudgetBytes+256<<20 {
		r.Note = strings.TrimPrefix(r.Note+"; peak RSS over budget + 256 MiB", "; ")
	}
	b.rep.Rows = append(b.rep.Rows, r)
	point := ""
	if r.Point != "" {
		point = "[" + r.Sweep + " " + r.Point + "] "
	}
	fmt.Printf("  %-10s %s%-28s %8.0f MiB/s  %.2f× ceiling\n", r.System, point, r.Workload, r.MiBps, r.Ratio)
}

// best runs once n times and keeps the fastest run (the one the shared
// machine disturbed least) with the worst memory and traffic seen in any
// run.
func best(n int, name string, once func() (row, error)) (row, error) {
	var b row
	for i := 0; i < n; i++ {
		r, err := once()
		if err != nil {
			return r, fmt.Errorf("%s: %w", name, err)
		}
		r.Note = fmt.Sprintf("best of %d", n)
		rss, fetched := max(r.PeakRSS, b.PeakRSS), max(r.Fetched, b.Fetched)
		if b.Seconds == 0 || r.Seconds < b.Seconds {
			b = r
		}
		b.PeakRSS, b.Fetched = rss, fetched
	}
	return b, nil
}

func (b *bench) runs(s *system) int {
	if s.peer {
		return b.peerRepeat
	}
	return b.repeat
}

// workloads measures the main model: the ceiling, then each workload on
// every system in turn.
func (b *bench) workloads() error {
	m := b.main
	if b.want("ceiling") {
		top, conc, err := b.ceiling(m, m.s3, "direct", []int{4, 8, 16}, nil)
		if err != nil {
			return err
		}
		b.rep.Ceiling, b.ceilConc = top, conc
	}
	if b.want("cat") {
		for _, s := range b.systems {
			r, err := best(b.runs(s), s.Name+" cold cat", func() (row, error) {
				return b.w.phase(s, m.s3, "cold cat", catFiles(m))
			})
			if err != nil {
				return err
			}
			b.add(b.tag(r, s), b.rep.Ceiling, m.bytes)
		}
	}
	if b.want("load") {
		var locals []row // the fastest of each local copy, over all systems' turns
		for _, s := range b.systems {
			cold, warm, locs, err := b.load(s, m, b.want("warm"))
			if err != nil {
				return err
			}
			b.add(b.tag(cold, s), b.rep.Ceiling, m.bytes)
			if warm.Seconds == 0 {
				continue
			}
			b.add(warm, 0, m.bytes)
			for i, l := range locs {
				if i == len(locals) {
					locals = append(locals, l)
				} else if l.Seconds < locals[i].Seconds {
					locals[i] = l
				}
			}
		}
		for _, l := range locals {
			b.add(l, 0, m.bytes)
		}
	}
	if b.want("two") {
		for _, s := range b.systems {
			r, err := best(b.runs(s), s.Name+" two concurrent loaders", func() (row, error) {
				return b.w.phase(s, m.s3, "two concurrent loaders", loaders(2, m))
			})
			if err != nil {
				return err
			}
			b.add(b.tag(r, s), b.rep.Ceiling, m.bytes)
		}
	}
	if b.want("tos") && len(b.systems) > 0 && b.systems[0].Name == "modelfs" {
		t, stop, err := b.w.tosTarget(m)
		if err != nil {
			return err
		}
		defer stop()
		if b.rep.TOSCeiling, _, err = b.ceiling(m, t, "direct TOS", []int{4, 8, 16}, nil); err != nil {
			return err
		}
		s := b.systems[0]
		r, err := best(b.repeat, "cold mmap load (TOS)", func() (row, error) {
			r, err := b.w.phase(s, t, "cold mmap load (TOS)", loaders(1, m))
			r.ServerCPUPerGiB = 0 // the server runs in this process: not separable
			return r, err
		})
		if err != nil {
			return err
		}
		r.System = "modelfs TOS"
		b.add(b.tag(r, s), b.rep.TOSCeiling, m.bytes)
	}
	return nil
}

// tag sets the row's budget where the system is modelfs.
func (b *bench) tag(r row, s *system) row {
	if s.Name == "modelfs" && r.BudgetBytes == 0 {
		r.BudgetBytes = b.budget
	}
	return r
}

// load measures a cold mmap load on a fresh mount and, on the same mount,
// warm reloads taking turns with loads of the local page-cached copy and
// of a second local copy held in 4 KiB pages, so that all see the same
// machine. The warm row carries the share of each one's page cache in
// large folios.
func (b *bench) load(s *system, m *model, warm bool) (cold, warmR row, locals []row, err error) {
	var warmFetched float64 // the worst run's
	var warmBytes int64
	var paged []string
	if warm {
		if paged, err = b.pagedCopy(m); err != nil {
			return cold, warmR, nil, err
		}
	}
	var local, local4K row
	var shares []string // large-folio shares of the mount and the local copies
	cold, err = best(b.runs(s), s.Name+" cold mmap load", func() (row, error) {
		r, err := b.w.phase(s, m.s3, "cold mmap load", func(mnt string, mark func()) (int64, float64, error) {
			res, err := runLoader(false, m.shardPaths(mnt))
			if err != nil {
				return 0, 0, err
			}
			mark() // the cold row's traffic and CPU end here
			warmBytes = 0
			fastest := func(r *row, l loadResult, system, workload string) {
				if r.Seconds == 0 || l.Seconds < r.Seconds {
					*r = row{System: system, Workload: workload, Bytes: l.Bytes, Seconds: l.Seconds}
				}
			}
			for i := 0; i < 2 && warm; i++ {
				wr, err := runLoader(false, m.shardPaths(mnt))
				if err != nil {
					return 0, 0, err
				}
				warmBytes += wr.Bytes
				fastest(&warmR, wr, s.Name, "warm reload (same mount)")
				lr, err := runLoader(false, m.shardPaths(m.local))
				if err != nil {
					return 0, 0, err
				}
				fastest(&local, lr, "local", "page-cached copy")
				if len(paged) > 0 {
					pr, err := runLoader(false, paged)
					if err != nil {
						return 0, 0, err
					}
					fastest(&local4K, pr, "local", "page-cached copy, 4 KiB pages")
				}
			}
			censused := []struct {
				name  string
				files []string
			}{{"mount", m.shardPaths(mnt)}, {"local", m.shardPaths(m.local)}, {"4 KiB copy", paged}}
			shares = nil // the last run's census
			for _, c := range censused {
				if len(c.files) == 0 || !warm {
					continue
				}
				if share, err := largeFolioShare(c.files); err == nil {
					shares = append(shares, fmt.Sprintf("%s %.0f%%", c.name, 100*share))
				}
			}
			return res.Bytes, res.Seconds, nil
		})
		if warmBytes > 0 {
			// What the warm reloads fetched again, per byte they read.
			warmFetched = max(warmFetched, float64(r.after)/float64(warmBytes))
		}
		return r, err
	})
	if warmR.Seconds > 0 && warmFetched > 0 {
		warmR.FetchedRate = warmFetched
		warmR.Fetched = int64(warmFetched * float64(m.bytes))
	}
	// The warm reload is compared with the loads of each local copy taken
	// in turns with it: the same machine, the same number of tries.
	if warmR.Seconds > 0 && local.Seconds > 0 {
		warmR.RatioToLocal = local.Seconds / warmR.Seconds
		warmR.Note = fmt.Sprintf("%.2f× the local copy (%.0f MiB/s in its turns)", warmR.RatioToLocal, local.rate())
		locals = append(locals, local)
		if local4K.Seconds > 0 {
			warmR.RatioToPaged = local4K.Seconds / warmR.Seconds
			warmR.Note += fmt.Sprintf(", %.2f× the copy in 4 KiB pages (%.0f)", warmR.RatioToPaged, local4K.rate())
			locals = append(locals, local4K)
		}
		if len(shares) > 0 {
			warmR.LargeFolios = strings.Join(shares, ", ")
			warmR.Note += "; in large folios: " + warmR.LargeFolios
		}
	}
	return cold, warmR, locals, err
}

// pagedCopy is the run's copy of m in 4 KiB pages, written on first use
// and removed when the run ends.
func (b *bench) pagedCopy(m *model) ([]string, error) {
	if b.paged == nil {
		dir := filepath.Join(b.w.dir, "paged-"+strings.TrimSuffix(m.prefix, "/"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		b.w.defer_(func() { os.RemoveAll(dir) })
		paths, err := m.pagedCopy(dir)
		if err != nil {
			return nil, err
		}
		b.paged = &paths
	}
	return *b.paged, nil
}

// ceiling reads every shard of m with parallel ranged GETs of 64 MiB, at
// each concurrency, and returns the best MiB/s and its concurrency. Rows
// are added with their ratio to that best, tagged with tag.
func (b *bench) ceiling(m *model, t *target, system string, concs []int, tag func(*row)) (float64, int, error) {
	var rows []row
	var top float64
	conc := concs[0]
	for _, c := range concs {
		r, err := best(b.repeat, fmt.Sprintf("%s %d", system, c), func() (row, error) {
			srv0, _ := testenv.Proc(t.pid)
			secs, err := directGET(m, t, c, 64<<20)
			srv1, _ := testenv.Proc(t.pid)
			return row{System: system, Workload: fmt.Sprintf("ranged GET, %d × 64 MiB", c), Bytes: m.bytes,
				Seconds: secs, ServerCPUPerGiB: (srv1.CPU - srv0.CPU) / (float64(m.bytes) / (1 << 30))}, err
		})
		if err != nil {
			return 0, 0, err
		}
		r.MiBps = r.rate()
		if r.MiBps > top {
			top, conc = r.MiBps, c
		}
		rows = append(rows, r)
	}
	// The ceiling is the best of the sweep; its rows stay in the report.
	for _, r := range rows {
		if tag != nil {
			tag(&r)
		}
		b.add(r, top, m.bytes)
	}
	return top, conc, nil
}

// work does a workload on a mount and returns the bytes it moved in the
// seconds it timed. A work that goes on after its measured part calls mark
// where that part ends: the row's traffic and CPU time are counted up to
// there, and what follows is reported apart (row.after).
type work func(mnt string, mark func()) (bytes int64, secs float64, err error)

// catFiles cats m's shards to /dev/null.
func catFiles(m *model) work {
	return func(mnt string, _ func()) (int64, float64, error) {
		start := time.Now()
		err := exec.Command("cat", m.shardPaths(mnt)...).Run() // stdout is /dev/null
		return m.bytes, time.Since(start).Seconds(), err
	}
}

// loaders runs n loader processes over m's shards at once and times them
// together.
func loaders(n int, m *model) work {
	return func(mnt string, _ func()) (int64, float64, error) {
		start := time.Now()
		var g errgroup.Group
		var mu sync.Mutex
		var total int64
		for i := 0; i < n; i++ {
			g.Go(func() error {
				res, err := runLoader(false, m.shardPaths(mnt))
				mu.Lock()
				total += res.Bytes
				mu.Unlock()
				return err
			})
		}
		err := g.Wait()
		return total, time.Since(start).Seconds(), err
	}
}

// phase mounts t afresh with s, runs work against the mount, and measures
// it with the daemon's peak RSS and CPU time and the bytes the server sent
// from before the mount until the work ended (or marked its end).
func (w *world) phase(s *system, t *target, name string, do work) (row, error) {
	// Write back what earlier phases left dirty (peers stage on disk), so
	// that no phase pays for another's writeback.
	unix.Sync()
	sent0, _ := testenv.WrittenBytes(t.pid)
	srv0, _ := testenv.Proc(t.pid)
	mnt, err := os.MkdirTemp(w.dir, "mnt-")
	if err != nil {
		return row{}, err
	}
	defer os.Remove(mnt)
	p, err := s.mount(w, t, mnt)
	if err != nil {
		return row{}, fmt.Errorf("%s: mount: %w", s.Name, err)
	}
	var marked bool
	var sent1 int64
	var srv1, ps testenv.ProcStats
	mark := func() {
		marked = true
		sent1, _ = testenv.WrittenBytes(t.pid)
		srv1, _ = testenv.Proc(t.pid)
		ps, _ = testenv.Proc(p.pid)
	}
	n, secs, err := do(mnt, mark)
	if err != nil {
		p.stop()
		return row{}, fmt.Errorf("%s %s: %w\n%s log:\n%s", s.Name, name, err, s.Name, p.log())
	}
	var r row
	if marked {
		sent2, _ := testenv.WrittenBytes(t.pid)
		end, _ := testenv.Proc(p.pid)
		r.after = sent2 - sent1
		ps.PeakRSS = end.PeakRSS
	} else {
		mark()
	}
	gib := float64(n) / (1 << 30)
	r.System, r.Workload, r.Bytes, r.Seconds, r.PeakRSS = s.Name, name, n, secs, ps.PeakRSS
	r.CPUPerGiB, r.ServerCPUPerGiB, r.Fetched = ps.CPU/gib, (srv1.CPU-srv0.CPU)/gib, sent1-sent0
	if err := p.stop(); err != nil {
		return r, err
	}
	if s.Name == "modelfs" {
		r.Daemon = totals(p.log())
		if verbose {
			fmt.Printf("    %s: %v\n", name, r.Daemon)
		}
	}
	return r, nil
}

// totals picks the daemon's closing "totals" log record.
func totals(log string) map[string]any {
	for _, line := range strings.Split(log, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "totals" {
			for _, k := range []string{"time", "level", "msg"} {
				delete(rec, k)
			}
			return rec
		}
	}
	return nil
}

// directGET reads every shard of m with parallel ranged GETs of part
// bytes, conc at a time, straight from the server, and returns the seconds.
func directGET(m *model, t *target, conc int, part int64) (float64, error) {
	ctx := context.Background()
	st, err := t.open(conc)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	r := backend.NewReader(st, backend.DefaultPolicy)
	type job struct {
		obj backend.Object
		off int64
	}
	var jobs []job
	for _, s := range m.shards {
		obj, err := st.Stat(ctx, m.prefix+s)
		if err != nil {
			return 0, err
		}
		for off := int64(0); off < obj.Size; off += part {
			jobs = append(jobs, job{obj, off})
		}
	}
	bufs := make(chan []byte, conc)
	for i := 0; i < conc; i++ {
		bufs <- make([]byte, part)
	}
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(conc)
	for _, j := range jobs {
		g.Go(func() error {
			b := <-bufs
			defer func() { bufs <- b }()
			n := min(part, j.obj.Size-j.off)
			return r.ReadAt(ctx, j.obj, b[:n], j.off)
		})
	}
	err = g.Wait()
	return time.Since(start).Seconds(), err
}

func machine() string {
	host, _ := os.Hostname()
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	var si unix.Sysinfo_t
	mem := ""
	if unix.Sysinfo(&si) == nil {
		mem = fmt.Sprintf(", %.0f GiB RAM", float64(si.Totalram)*float64(si.Unit)/(1<<30))
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%s: %d CPUs (%s)%s, Linux %s", host, runtime.NumCPU(), cpu, mem, strings.TrimSpace(string(kernel)))
}

// headlines sums the main rows up per mounted system.
func headlines(rep *report) []headline {
	var hs []headline
	for _, s := range rep.Systems {
		h := headline{System: s.Name}
		found := false
		for _, r := range rep.Rows {
			if r.System != s.Name || r.Sweep != "" {
				continue
			}
			switch r.Workload {
			case "cold mmap load":
				h.ColdLoad, found = r.Ratio, true
			case "cold cat":
				h.ColdCat, found = r.Ratio, true
			case "warm reload (same mount)":
				h.WarmVsLocal, h.WarmVsPaged, found = r.RatioToLocal, r.RatioToPaged, true
			}
		}
		if found {
			hs = append(hs, h)
		}
	}
	return hs
}

// printTable prints the report as text tables, or as Markdown with md.
func printTable(rep *report, md bool) {
	fmt.Printf("\n%s\nmodel %s in %d shards, modelfs cache budget %s, ceiling %.0f MiB/s\n",
		rep.Machine, mib(rep.ModelBytes), rep.Shards, mib(rep.Budget), rep.Ceiling)
	for _, s := range rep.Systems {
		fmt.Printf("  %-8s %s: %s\n", s.Name, s.Version, strings.Join(s.Flags, " "))
	}
	for _, n := range rep.Skipped {
		fmt.Println("  note:", n)
	}
	var main []row
	groups := map[string][]row{}
	for _, r := range rep.Rows {
		if r.Sweep == "" {
			main = append(main, r)
		} else {
			groups[r.Sweep] = append(groups[r.Sweep], r)
		}
	}
	fmt.Println()
	table(main, false, md)
	for _, s := range rep.Sweeps {
		if len(groups[s]) > 0 {
			fmt.Printf("\nsweep: %s\n\n", sweepTitles[s])
			table(groups[s], true, md)
		}
	}
	if len(rep.Headline) > 0 {
		fmt.Println("\nheadline (cold: × ceiling; warm: × local page-cached copy)")
		for _, h := range rep.Headline {
			fmt.Printf("  %-8s cold mmap load %.2f×  cold cat %.2f×  warm reload %.2f× (%.2f× the copy in 4 KiB pages)\n",
				h.System, h.ColdLoad, h.ColdCat, h.WarmVsLocal, h.WarmVsPaged)
		}
	}
}

func table(rows []row, points, md bool) {
	head := []string{"system", "workload", "MiB/s", "× ceiling", "peak RSS MiB", "CPU s/GiB", "server CPU s/GiB", "fetched/model", "note"}
	if points {
		head = append([]string{"point"}, head...)
	}
	cells := [][]string{head}
	for _, r := range rows {
		rss, cpu, scpu, fetched, ratio := "-", "-", "-", "-", "-"
		if r.PeakRSS > 0 {
			rss = fmt.Sprintf("%.0f", float64(r.PeakRSS)/(1<<20))
			cpu = fmt.Sprintf("%.2f", r.CPUPerGiB)
		}
		if r.ServerCPUPerGiB > 0 {
			scpu = fmt.Sprintf("%.2f", r.ServerCPUPerGiB)
		}
		if r.FetchedRate > 0 || r.RatioToLocal > 0 {
			fetched = fmt.Sprintf("%.3f", r.FetchedRate)
		}
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		line := []string{r.System, r.Workload, fmt.Sprintf("%.0f", r.MiBps), ratio, rss, cpu, scpu, fetched, r.Note}
		if points {
			line = append([]string{r.Point}, line...)
		}
		cells = append(cells, line)
	}
	if md {
		for i, line := range cells {
			fmt.Printf("| %s |\n", strings.Join(line, " | "))
			if i == 0 {
				fmt.Println(strings.Repeat("|---", len(line)) + "|")
			}
		}
		return
	}
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	for _, line := range cells {
		// The note, last, is left-aligned after the table.
		fmt.Fprintf(tw, "%s\t  %s\n", strings.Join(line[:len(line)-1], "\t"), line[len(line)-1])
	}
	tw.Flush()
}

// showTable prints a results file's tables: bench table [-md] [-svg]
// [FILE]; with -svg it writes the file's charts again.
func showTable(args []string) error {
	fl := flag.NewFlagSet("table", flag.ContinueOnError)
	md := fl.Bool("md", false, "Markdown tables")
	svg := fl.Bool("svg", false, "write the charts beside FILE again")
	if err := fl.Parse(args); err != nil {
		return err
	}
	path := "bench/results/latest.json"
	if fl.NArg() > 0 {
		path = fl.Arg(0)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	printTable(&rep, *md)
	if *svg {
		if err := writeCharts(&rep, strings.TrimSuffix(path, ".json")); err != nil {
			return err
		}
		fmt.Printf("charts written: %s\n", strings.Join(rep.Charts, ", "))
	}
	return nil
}
