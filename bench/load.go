package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"syscall"
	"time"
	"unsafe"

	"github.com/modelfs/modelfs/internal/safetensors"
)

// loadResult is what one loader process reports on stdout.
type loadResult struct {
	Files    int     `json:"files"`
	Tensors  int     `json:"tensors"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	Verified bool    `json:"verified"`
}

// load is the loader process: for each file, in natural order, it maps the
// file, parses the header and copies every tensor out in key order.
func load(args []string) error {
	fl := flag.NewFlagSet("load", flag.ContinueOnError)
	verify := fl.Bool("verify", false, "check every byte against the generator")
	if err := fl.Parse(args); err != nil {
		return err
	}
	files := fl.Args()
	sort.Slice(files, func(i, j int) bool { return safetensors.NaturalLess(files[i], files[j]) })
	var res loadResult
	start := time.Now()
	for _, f := range files {
		r, err := safetensors.Load(f, *verify)
		if err != nil {
			return err
		}
		res.Files++
		res.Tensors += r.Tensors
		res.Bytes += r.Bytes
	}
	res.Seconds = time.Since(start).Seconds()
	res.Verified = *verify
	return json.NewEncoder(os.Stdout).Encode(res)
}

// runLoader runs the loader in a new process over files.
func runLoader(verify bool, files []string) (loadResult, error) {
	self, err := os.Executable()
	if err != nil {
		return loadResult{}, err
	}
	args := []string{"load"}
	if verify {
		args = append(args, "-verify")
	}
	cmd := exec.Command(self, append(args, files...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return loadResult{}, fmt.Errorf("loader: %w", err)
	}
	var res loadResult
	if err := json.Unmarshal(out, &res); err != nil {
		return res, fmt.Errorf("loader output %q: %w", out, err)
	}
	return res, nil
}

// largeFolioShare is the share of the page cache behind files held in
// large folios, sampled one page in every 256 KiB: each sample is touched
// through a mapping, its frame found in /proc/self/pagemap and its flags in
// /proc/kpageflags (both need root for frame numbers). A page of a large
// folio is a compound head or tail. Only an ext4 copy gets them on Linux
// 6.18, whose FUSE page cache holds single 4 KiB pages; a loader faulting a
// file mapped through large folios (2 MiB ones are mapped whole) takes
// fewer faults, which is what a warm reload is compared against.
func largeFolioShare(files []string) (float64, error) {
	const (
		step     = 256 << 10
		pageSize = 4096
		head     = 1 << 15 // KPF_COMPOUND_HEAD
		tail     = 1 << 16 // KPF_COMPOUND_TAIL
	)
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return 0, err
	}
	defer pagemap.Close()
	flags, err := os.Open("/proc/kpageflags")
	if err != nil {
		return 0, err
	}
	defer flags.Close()
	var seen, large int
	var touched byte
	word := make([]byte, 8)
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return 0, err
		}
		st, err := f.Stat()
		if err != nil || st.Size() == 0 {
			f.Close()
			continue
		}
		m, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("mmap %s: %w", p, err)
		}
		base := uintptr(unsafe.Pointer(&m[0]))
		for off := 0; off < len(m); off += step {
			touched ^= m[off] // fault the page in
			if _, err := pagemap.ReadAt(word, int64((base+uintptr(off))/pageSize*8)); err != nil {
				syscall.Munmap(m)
				return 0, fmt.Errorf("pagemap: %w", err)
			}
			e := binary.LittleEndian.Uint64(word)
			pfn := e & (1<<55 - 1)
			if e>>63 == 0 || pfn == 0 {
				continue // not present, or frame numbers hidden
			}
			if _, err := flags.ReadAt(word, int64(pfn*8)); err != nil {
				syscall.Munmap(m)
				return 0, fmt.Errorf("kpageflags: %w", err)
			}
			seen++
			if binary.LittleEndian.Uint64(word)&(head|tail) != 0 {
				large++
			}
		}
		syscall.Munmap(m)
	}
	runtime.KeepAlive(touched) // the reads that fault the pages in are used
	if seen == 0 {
		return 0, errors.New("no page frames visible (not root?)")
	}
	return float64(large) / float64(seen), nil
}
