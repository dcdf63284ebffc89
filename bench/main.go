// Command bench is modelfs's demo and benchmark harness. It starts
// versitygw on loopback, seeds it with a generated safetensors model,
// mounts it with the modelfs binary and loads it from a separate process,
// the way vLLM's loader reads weights.
//
//	bench demo [flags]   the newcomer's tour (make demo)
//	bench run [flags]    the benchmark (make bench): ceiling, cold and warm loads, memory, bytes fetched, against peers
//	bench load [flags] FILE...   the loader process: mmap every file and copy out every tensor
//	bench table [-md] [-svg] [FILE]   print a results file's tables (default bench/results/latest.json), -svg: redraw its charts
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: bench demo|run|load|table [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "demo":
		err = demo(os.Args[2:])
	case "run":
		err = run(os.Args[2:])
	case "load":
		err = load(os.Args[2:])
	case "table":
		err = showTable(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want demo, run, load or table", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
