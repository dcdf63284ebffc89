package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readReport loads a committed results file: the schema the README and
// the charts are drawn from must still parse.
func readReport(t *testing.T, path string) *report {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(rep.Rows) == 0 || rep.Ceiling <= 0 {
		t.Fatalf("%s: %d rows, ceiling %v", path, len(rep.Rows), rep.Ceiling)
	}
	return &rep
}

// wellFormed fails unless svg is well-formed XML with an <svg> root.
func wellFormed(t *testing.T, name, svg string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", name, err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root element %q, want svg", name, root)
	}
}

func TestHeadlinesAreRatiosOfTheRows(t *testing.T) {
	rep := readReport(t, "results/latest.json")
	hs := headlines(rep)
	if len(hs) == 0 {
		t.Fatal("no headline")
	}
	for _, h := range hs {
		for _, r := range rep.Rows {
			if r.System != h.System || r.Sweep != "" || r.Workload != "cold mmap load" {
				continue
			}
			if want := r.MiBps / rep.Ceiling; math.Abs(h.ColdLoad-want) > 1e-9 {
				t.Errorf("%s cold load ratio %v, want %v (%.0f / %.0f MiB/s)", h.System, h.ColdLoad, want, r.MiBps, rep.Ceiling)
			}
		}
	}
}

func TestChartsDrawEverySystem(t *testing.T) {
	for _, src := range []string{"results/latest.json", "results/full.json"} {
		rep := readReport(t, src)
		base := filepath.Join(t.TempDir(), "r")
		if err := writeCharts(rep, base); err != nil {
			t.Fatal(err)
		}
		if len(rep.Charts) == 0 {
			t.Fatalf("%s: no chart written", src)
		}
		for _, c := range rep.Charts {
			b, err := os.ReadFile(c)
			if err != nil {
				t.Fatal(err)
			}
			wellFormed(t, c, string(b))
			for _, s := range rep.Systems {
				if !strings.Contains(string(b), ">"+s.Name+"<") {
					t.Errorf("%s (from %s) has no bar labelled %s", c, src, s.Name)
				}
			}
		}
	}
}

func TestSweepFlags(t *testing.T) {
	all, err := parseSweeps("all")
	if err != nil || len(all) != 4 {
		t.Fatalf("all: %v, %v", all, err)
	}
	if _, err := parseSweeps("size,depth"); err == nil || !strings.Contains(err.Error(), `"depth"`) {
		t.Fatalf("unknown sweep: %v", err)
	}
	sizes, err := parseSizes("1024, 4096")
	if err != nil || len(sizes) != 2 || sizes[1] != 4096 {
		t.Fatalf("sizes: %v, %v", sizes, err)
	}
	if _, err := parseSizes("4G"); err == nil {
		t.Fatal("4G accepted as a size in MiB")
	}
}

// The like-for-like baseline: a copy written in 4 KiB writes holds the
// same bytes as its source, and its page cache holds no large folios, as
// the census sees it.
func TestPagedCopyHoldsSinglePages(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	data := make([]byte, 8<<20+123) // not a multiple of the page size
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "dst")
	if err := copyInPages(dst, src); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(data) {
		t.Fatal("the copy differs from its source")
	}
	if f, err := os.Open("/proc/kpageflags"); err != nil || os.Geteuid() != 0 {
		t.Skipf("no page census here (needs root and /proc/kpageflags): %v", err)
	} else {
		f.Close()
	}
	share, err := largeFolioShare([]string{dst})
	if err != nil {
		t.Fatal(err)
	}
	if share != 0 {
		t.Errorf("%.0f%% of the 4 KiB-written copy is in large folios, want none", 100*share)
	}
}
