package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"time"

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
