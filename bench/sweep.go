package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/modelfs/modelfs/internal/safetensors"
)

// The sweeps show how cost grows with the work. Each is a group of rows,
// one per point and system.
var (
	sweepOrder  = []string{"size", "shards", "budget", "loaders"}
	sweepTitles = map[string]string{
		"size":    "model size (cold mmap load)",
		"shards":  "shard count, same total size (cold mmap load)",
		"budget":  "modelfs cache budget, × the model (cold mmap load)",
		"loaders": "concurrent loaders on one fresh mount",
	}
)

func parseSweeps(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if s == "all" {
		return sweepOrder, nil
	}
	var out []string
	for _, name := range strings.Split(s, ",") {
		if _, ok := sweepTitles[name]; !ok {
			return nil, fmt.Errorf("unknown sweep %q: want %s or all", name, strings.Join(sweepOrder, ","))
		}
		out = append(out, name)
	}
	return out, nil
}

func parseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad sweep size %q (MiB)", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// errSkip is a model this machine cannot hold: the sweep point is skipped.
var errSkip = errors.New("skipped")

func (b *bench) sweep(name string, sizes []int64) error {
	m := b.main
	switch name {
	case "size":
		for _, n := range sizes {
			// Shards stay at most 4 GiB, as published models' do (~5 GB).
			spec := m.spec
			spec.Bytes = n << 20
			spec.Shards = max(spec.Shards, int((spec.Bytes+4<<30-1)/(4<<30)))
			point := mib(spec.Bytes)
			if spec.Shards != m.spec.Shards {
				point += fmt.Sprintf(" (%d shards)", spec.Shards)
			}
			if err := b.sweepModel(name, point, spec); err != nil {
				return err
			}
		}
	case "shards":
		for _, n := range []int{1, 16} {
			spec := m.spec
			spec.Shards = n
			if err := b.sweepModel(name, fmt.Sprintf("%d × %s", n, mib(spec.Bytes/int64(n))), spec); err != nil {
				return err
			}
		}
	case "budget":
		b.sweepDirect(name, "ceiling", m, b.rep.Ceiling)
		for _, f := range []struct {
			x     float64
			label string
		}{{0.25, "¼×"}, {1, "1×"}, {4, "4×"}} {
			budget := (int64(f.x*float64(m.bytes)) + 8<<20 - 1) &^ (8<<20 - 1) // whole 8 MiB chunks
			s := b.modelfs(budget)
			r, err := best(b.repeat, "modelfs budget "+f.label, func() (row, error) {
				return b.w.phase(s, m.s3, "cold mmap load", loaders(1, m))
			})
			if err != nil {
				return err
			}
			r.BudgetBytes = budget
			b.add(b.point(r, name, f.label+" ("+mib(budget)+")", m, 1, b.rep.Ceiling), b.rep.Ceiling, m.bytes)
		}
	case "loaders":
		for _, n := range []int{1, 2, 4} {
			point := fmt.Sprintf("%d loader", n)
			if n > 1 {
				point += "s"
			}
			workload := "cold mmap load"
			if n > 1 {
				workload = fmt.Sprintf("%d loaders at once", n)
			}
			b.sweepDirect(name, point, m, b.rep.Ceiling)
			for _, s := range b.systems {
				r, err := best(b.runs(s), fmt.Sprintf("%s %d loaders", s.Name, n), func() (row, error) {
					return b.w.phase(s, m.s3, workload, loaders(n, m))
				})
				if err != nil {
					return err
				}
				b.add(b.point(b.tag(r, s), name, point, m, n, b.rep.Ceiling), b.rep.Ceiling, m.bytes)
			}
		}
	}
	return nil
}

// point tags a sweep row with its point.
func (b *bench) point(r row, sweep, point string, m *model, loaders int, ceiling float64) row {
	r.Sweep, r.Point, r.ModelBytes, r.Shards, r.Loaders, r.CeilingMiBps = sweep, point, m.bytes, len(m.shards), loaders, ceiling
	return r
}

// sweepDirect repeats the main model's ceiling row in a sweep group, so
// that each group reads on its own.
func (b *bench) sweepDirect(sweep, point string, m *model, ceiling float64) {
	for _, r := range b.rep.Rows {
		if r.System == "direct" && r.Sweep == "" && r.Workload == fmt.Sprintf("ranged GET, %d × 64 MiB", b.ceilConc) {
			b.add(b.point(r, sweep, point, m, 1, ceiling), ceiling, m.bytes)
			return
		}
	}
}

// sweepModel measures a cold mmap load of a model of spec on every system,
// against that model's own ceiling (the main model's ceiling concurrency).
// A model the machine cannot hold is skipped with a note.
func (b *bench) sweepModel(sweep, point string, spec safetensors.Spec) error {
	m, ceiling := b.main, b.rep.Ceiling
	if spec == b.main.spec {
		b.sweepDirect(sweep, point, m, ceiling)
	} else {
		var err error
		if m, err = b.w.model(modelName(spec), spec); errors.Is(err, errSkip) {
			b.skip(fmt.Sprintf("sweep %s %s: %v", sweep, point, err))
			return nil
		} else if err != nil {
			return err
		}
		if err := m.warmServer(); err != nil {
			return err
		}
		if b.want("ceiling") {
			if ceiling, _, err = b.ceiling(m, m.s3, "direct", []int{b.ceilConc}, func(r *row) {
				*r = b.point(*r, sweep, point, m, 1, 0)
			}); err != nil {
				return err
			}
		}
	}
	for _, s := range b.systems {
		// Peers stage what they read on local disk (s3fs in temporary
		// files, rclone in its cache directory beside the mount).
		if s.stages && min(freeBytes(os.TempDir()), freeBytes(b.w.dir)) < m.bytes+1<<30 {
			b.skip(fmt.Sprintf("sweep %s %s: %s skipped: no room on disk for its %s copy", sweep, point, s.Name, mib(m.bytes)))
			continue
		}
		r, err := best(b.runs(s), fmt.Sprintf("%s %s", s.Name, point), func() (row, error) {
			return b.w.phase(s, m.s3, "cold mmap load", loaders(1, m))
		})
		if err != nil {
			return err
		}
		b.add(b.point(b.tag(r, s), sweep, point, m, 1, ceiling), ceiling, m.bytes)
	}
	return nil
}

func (b *bench) skip(note string) {
	fmt.Println("note:", note)
	b.rep.Skipped = append(b.rep.Skipped, note)
}
