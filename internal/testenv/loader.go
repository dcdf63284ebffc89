package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/modelfs/modelfs/internal/safetensors"
)

// loaderEnv makes a test binary a loader process (see Loader). A process
// must never page-fault on a FUSE mount it serves itself, and several
// loaders may run at once: loads run apart from the test.
const loaderEnv = "MODELFS_TEST_LOAD"

// Loader is a command that runs this test binary as a loader process:
// it loads files through mmap, verifying every byte, and prints the tensor
// bytes it copied. The binary's TestMain must call ServeLoader first.
func Loader(files ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), loaderEnv+"="+strings.Join(files, "\n"))
	return cmd
}

// ServeLoader does a loader process's work and exits when this process was
// started by Loader; otherwise it returns at once.
func ServeLoader() {
	files := os.Getenv(loaderEnv)
	if files == "" {
		return
	}
	var total int64
	for _, f := range strings.Split(files, "\n") {
		r, err := safetensors.Load(f, true)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		total += r.Bytes
	}
	fmt.Println(total)
	os.Exit(0)
}
