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
	// Daemon figures, where a daemon served the workload.
	PeakRSS   int64   `json:"peak_rss_bytes,omitempty"`
	CPUPerGiB float64 `json:"daemon_cpu_s_per_gib,omitempty"`
	// ServerCPUPerGiB is the object server's CPU time per GiB delivered.
	ServerCPUPerGiB float64 `json:"server_cpu_s_per_gib,omitempty"`
	Fetched         int64   `json:"bytes_fetched,omitempty"`
	FetchedRate     float64 `json:"fetched_per_model_byte,omitempty"`
	Note            string  `json:"note,omitempty"`
	// Daemon is the daemon\'s own account of the workload.
	Daemon map[string]any `json:"daemon,omitempty"`
}

type report struct {
	Machine    string  `json:"machine"`
	Date       string  `json:"date"`
	ModelBytes int64   `json:"model_bytes"`
	Shards     int     `json:"shards"`
	Budget     int64   `json:"cache_budget_bytes"`
	Ceiling    float64 `json:"ceiling_mib_per_s"`
	Rows       []row   `json:"rows"`
}

func run(args []string) error {
	fl := flag.NewFlagSet("run", flag.ContinueOnError)
	sizeMiB := fl.Int64("size-mib", 4096, "model size in MiB")
	shards := fl.Int("shards", 2, "safetensors shards")
	budgetMiB := fl.Int64("budget-mib", 512, "modelfs cache budget in MiB")
	mixed := fl.Bool("mixed", false, "mixed-dtype shards (F8 weights with F32 scales)")
	out := fl.String("json", "bench-results.json", "write the results here")
	extra := fl.String("flags", "", "extra modelfs mount flags, space separated")
	keep := fl.String("keep", "", "keep the server's files in this directory and reuse a model seeded there")
	fl.BoolVar(&verbose, "v", false, "print the daemon's counters after each workload")
	only := fl.String("only", "", "comma-separated workloads to run (ceiling,cat,load,warm,local,two); default all")
	if err := fl.Parse(args); err != nil {
		return err
	}
	want := func(w string) bool { return *only == "" || strings.Contains(","+*only+",", ","+w+",") }
	w, err := newWorld(fmt.Sprintf("bench-%dm-%ds-mixed-%v", *sizeMiB, *shards, *mixed), *keep,
		safetensors.Spec{Bytes: *sizeMiB << 20, Shards: *shards, Seed: 1, Mixed: *mixed})
	if err != nil {
		return err
	}
	defer w.close()
	rep := &report{Machine: machine(), Date: time.Now().UTC().Format(time.RFC3339), Shards: *shards, Budget: *budgetMiB << 20}
	var modelBytes int64
	for _, s := range w.shards {
		st, err := os.Stat(filepath.Join(w.srv.Root, w.bucket, w.prefix, s))
		if err != nil {
			return err
		}
		modelBytes += st.Size()
	}
	rep.ModelBytes = modelBytes
	mountFlags := []string{"--max-io-queue", fmt.Sprint(*budgetMiB / 8), "--io-chunksize", "8MiB"}
	if *extra != "" {
		mountFlags = append(mountFlags, strings.Fields(*extra)...)
	}
	// The server's files stay in the page cache for the whole run, so every
	// row measures the path to the server, not the server's disk. A fresh
	// mount starts with an empty page cache of its own.
	if _, err := runLoader(false, prefixAll(filepath.Join(w.srv.Root, w.bucket, w.prefix), w.shardPaths(""))); err != nil {
		return err
	}
	add := func(r row) {
		if r.Seconds > 0 {
			r.MiBps = float64(r.Bytes) / (1 << 20) / r.Seconds
		}
		if rep.Ceiling > 0 {
			r.Ratio = r.MiBps / rep.Ceiling
		}
		if r.Fetched > 0 {
			r.FetchedRate = float64(r.Fetched) / float64(modelBytes)
		}
		rep.Rows = append(rep.Rows, r)
		fmt.Printf("  %-10s %-28s %8.0f MiB/s  %.2f× ceiling\n", r.System, r.Workload, r.MiBps, r.Ratio)
	}

	if want("ceiling") {
		best := row{System: "direct", Workload: "parallel ranged GET"}
		part := int64(64 << 20)
		if v := os.Getenv("BENCH_CEILING_PART"); v != "" {
			fmt.Sscan(v, &part)
		}
		for _, conc := range []int{4, 8, 16} {
			srv0, _ := testenv.Proc(w.srv.Pid())
			secs, err := w.directGET(conc, part)
			if err != nil {
				return err
			}
			srv1, _ := testenv.Proc(w.srv.Pid())
			fmt.Printf("  direct GET, %2d × 64 MiB: %.0f MiB/s, server %.2f CPU s/GiB\n", conc,
				float64(modelBytes)/(1<<20)/secs, (srv1.CPU-srv0.CPU)/(float64(modelBytes)/(1<<30)))
			if best.Seconds == 0 || secs < best.Seconds {
				best.Seconds, best.Bytes, best.Note = secs, modelBytes, fmt.Sprintf("best of 4, 8, 16 × 64 MiB; %d in flight", conc)
			}
		}
		rep.Ceiling = float64(best.Bytes) / (1 << 20) / best.Seconds
		add(best)
	}
	files := w.shardPaths("")
	if want("cat") {
		r, err := w.phase("cold cat", mountFlags, modelBytes, func(mnt string) (int64, error) {
			cmd := exec.Command("cat", prefixAll(mnt, files)...)
			cmd.Stdout = nil // /dev/null
			return modelBytes, cmd.Run()
		})
		if err != nil {
			return err
		}
		add(r)
	}
	if want("load") || want("warm") {
		var warm row
		r, err := w.phase("cold mmap load", mountFlags, modelBytes, func(mnt string) (int64, error) {
			res, err := runLoader(false, prefixAll(mnt, files))
			if err != nil || !want("warm") {
				return res.Bytes, err
			}
			again, err := runLoader(false, prefixAll(mnt, files))
			warm = row{System: "modelfs", Workload: "warm reload (same mount)", Bytes: again.Bytes, Seconds: again.Seconds}
			return res.Bytes, err
		})
		if err != nil {
			return err
		}
		add(r)
		if warm.Bytes > 0 {
			add(warm)
		}
	}
	if want("local") {
		local := prefixAll(filepath.Join(w.srv.Root, w.bucket, w.prefix), files)
		if _, err := runLoader(false, local); err != nil { // fill the page cache
			return err
		}
		res, err := runLoader(false, local)
		if err != nil {
			return err
		}
		add(row{System: "local", Workload: "page-cached copy", Bytes: res.Bytes, Seconds: res.Seconds})
	}
	if want("two") {
		r, err := w.phase("two concurrent loaders", mountFlags, modelBytes, func(mnt string) (int64, error) {
			var g errgroup.Group
			var mu sync.Mutex
			var total int64
			for i := 0; i < 2; i++ {
				g.Go(func() error {
					res, err := runLoader(false, prefixAll(mnt, files))
					mu.Lock()
					total += res.Bytes
					mu.Unlock()
					return err
				})
			}
			return total, g.Wait()
		})
		if err != nil {
			return err
		}
		add(r)
	}
	printTable(rep)
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(*out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("results written to %s\n", *out)
	return nil
}

// phase mounts afresh, runs work against the mount, and measures it with
// the daemon's peak RSS, CPU time and the bytes the server sent.
func (w *world) phase(name string, flags []string, modelBytes int64, work func(mnt string) (int64, error)) (row, error) {
	d, err := w.mount(flags...)
	if err != nil {
		return row{}, err
	}
	sent0, _ := testenv.WrittenBytes(w.srv.Pid())
	srv0, _ := testenv.Proc(w.srv.Pid())
	start := time.Now()
	n, err := work(d.Mountpoint)
	secs := time.Since(start).Seconds()
	if err != nil {
		return row{}, fmt.Errorf("%s: %w\nmodelfs log:\n%s", name, err, d.Log())
	}
	sent1, _ := testenv.WrittenBytes(w.srv.Pid())
	srv1, _ := testenv.Proc(w.srv.Pid())
	ps, _ := testenv.Proc(d.Pid())
	gib := float64(n) / (1 << 30)
	r := row{System: "modelfs", Workload: name, Bytes: n, Seconds: secs, PeakRSS: ps.PeakRSS,
		CPUPerGiB: ps.CPU / gib, ServerCPUPerGiB: (srv1.CPU - srv0.CPU) / gib, Fetched: sent1 - sent0}
	if err := d.Stop(10 * time.Second); err != nil {
		return r, err
	}
	r.Daemon = totals(d.Log())
	if verbose {
		fmt.Printf("    %s: %v\n", name, r.Daemon)
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

// directGET reads every shard with parallel ranged GETs of part bytes,
// conc at a time, straight from the server, and returns the seconds.
func (w *world) directGET(conc int, part int64) (float64, error) {
	ctx := context.Background()
	st, err := backend.NewS3(ctx, w.bucket, backend.Config{Endpoint: w.srv.Endpoint,
		AccessKey: testenv.AccessKey, SecretKey: testenv.SecretKey, MaxConns: conc})
	if err != nil {
		return 0, err
	}
	r := backend.NewReader(st, backend.DefaultPolicy)
	type job struct {
		obj backend.Object
		off int64
	}
	var jobs []job
	for _, s := range w.shards {
		obj, err := st.Stat(ctx, w.prefix+s)
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

func prefixAll(dir string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = filepath.Join(dir, filepath.Base(n))
	}
	return out
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
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return fmt.Sprintf("%s: %d CPUs (%s), Linux %s", host, runtime.NumCPU(), cpu, strings.TrimSpace(string(kernel)))
}

func printTable(rep *report) {
	fmt.Printf("\nmodel %s in %d shards, cache budget %s, ceiling %.0f MiB/s\n",
		mib(rep.ModelBytes), rep.Shards, mib(rep.Budget), rep.Ceiling)
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "system\tworkload\tMiB/s\t× ceiling\tpeak RSS MiB\tCPU s/GiB\tserver CPU s/GiB\tfetched/model\t")
	for _, r := range rep.Rows {
		rss, cpu, scpu, fetched := "-", "-", "-", "-"
		if r.PeakRSS > 0 {
			rss = fmt.Sprintf("%.0f", float64(r.PeakRSS)/(1<<20))
			cpu = fmt.Sprintf("%.2f", r.CPUPerGiB)
			scpu = fmt.Sprintf("%.2f", r.ServerCPUPerGiB)
		}
		if r.FetchedRate > 0 {
			fetched = fmt.Sprintf("%.3f", r.FetchedRate)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2f\t%s\t%s\t%s\t%s\t\n", r.System, r.Workload, r.MiBps, r.Ratio, rss, cpu, scpu, fetched)
	}
	tw.Flush()
}
