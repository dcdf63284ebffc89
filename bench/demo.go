package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/modelfs/modelfs/internal/safetensors"
)

// demo seeds a local S3 server with a generated model, mounts it, lists
// it, loads every tensor through mmap from a separate process verifying
// every byte, prints the throughput and tears everything down.
func demo(args []string) error {
	fl := flag.NewFlagSet("demo", flag.ContinueOnError)
	size := fl.Int64("size-mib", 1024, "model size in MiB")
	shards := fl.Int("shards", 2, "safetensors shards")
	if err := fl.Parse(args); err != nil {
		return err
	}
	w, err := newWorld("")
	if err != nil {
		return err
	}
	defer w.close()
	m, err := w.model("demo-model", safetensors.Spec{Bytes: *size << 20, Shards: *shards, Seed: uint64(time.Now().UnixNano())})
	if err != nil {
		return err
	}
	d, err := w.mount(m.s3)
	if err != nil {
		return err
	}
	mnt := d.Mountpoint
	fmt.Printf("mounted %s on %s\n\n$ ls -l %s\n", m.s3.uri, mnt, mnt)
	ls := exec.Command("ls", "-l", mnt)
	ls.Stdout, ls.Stderr = os.Stdout, os.Stderr
	if err := ls.Run(); err != nil {
		return fmt.Errorf("ls: %w", err)
	}
	fmt.Printf("\nloading every tensor through mmap from a separate process, checking every byte...\n")
	res, err := runLoader(true, m.shardPaths(mnt))
	if err != nil {
		return fmt.Errorf("%w\nmodelfs log:\n%s", err, d.Log())
	}
	fmt.Printf("cold load: %d tensors, %s in %.2f s = %.0f MiB/s, every byte verified\n",
		res.Tensors, mib(res.Bytes), res.Seconds, float64(res.Bytes)/(1<<20)/res.Seconds)
	warm, err := runLoader(true, m.shardPaths(mnt))
	if err != nil {
		return err
	}
	fmt.Printf("warm load: %.2f s = %.0f MiB/s (page cache)\n", warm.Seconds, float64(warm.Bytes)/(1<<20)/warm.Seconds)
	if err := d.Stop(10 * time.Second); err != nil {
		return fmt.Errorf("stopping modelfs: %w\nmodelfs log:\n%s", err, d.Log())
	}
	if mounted(mnt) {
		return fmt.Errorf("%s is still mounted after modelfs exited", mnt)
	}
	fmt.Println("unmounted; stopping the server")
	return nil
}
