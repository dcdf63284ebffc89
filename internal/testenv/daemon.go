package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Daemon is a running `modelfs mount` process.
type Daemon struct {
	Mountpoint string
	cmd        *exec.Cmd
	exited     chan struct{}
	exitErr    error

	mu  sync.Mutex
	log bytes.Buffer
}

// ModelfsPath finds the modelfs binary: $MODELFS_BIN, else bin/modelfs in
// the repository (where `make build` puts it).
func ModelfsPath() (string, error) {
	if p := os.Getenv("MODELFS_BIN"); p != "" {
		return p, nil
	}
	if dir, err := os.Getwd(); err == nil {
		for ; dir != "/" && dir != "."; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, "bin", "modelfs")
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				if _, err := os.Stat(p); err != nil {
					return "", fmt.Errorf("%s not built: run `make build` (or set MODELFS_BIN)", p)
				}
				return p, nil
			}
		}
	}
	return "", errors.New("modelfs binary not found: run `make build` (or set MODELFS_BIN)")
}

// Env is the environment a modelfs process needs to reach s: the test
// credentials, as the SDK's standard chain reads them.
func (s *S3Server) Env() []string {
	return append(os.Environ(), "AWS_ACCESS_KEY_ID="+AccessKey, "AWS_SECRET_ACCESS_KEY="+SecretKey,
		"AWS_REGION="+Region, "AWS_EC2_METADATA_DISABLED=true")
}

// StartDaemon runs `modelfs mount --endpoint s.Endpoint args... uri mnt`
// with env and waits for its "mounted" log line. It fails with the
// daemon's log if the process exits first or timeout passes.
func StartDaemon(env []string, timeout time.Duration, args ...string) (*Daemon, error) {
	bin, err := ModelfsPath()
	if err != nil {
		return nil, err
	}
	if len(args) < 2 {
		return nil, errors.New("StartDaemon: want at least URI and MOUNTPOINT")
	}
	full := append([]string{"mount", "--log-format", "json"}, args...)
	d := &Daemon{Mountpoint: args[len(args)-1], exited: make(chan struct{})}
	d.cmd = exec.Command(bin, full...)
	d.cmd.Env = env
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	d.cmd.Stdout = io.Discard
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.log.WriteString(line + "\n")
			d.mu.Unlock()
			var rec struct{ Msg string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "mounted" {
				once.Do(func() { close(ready) })
			}
		}
		d.exitErr = d.cmd.Wait()
		close(d.exited)
	}()
	select {
	case <-ready:
		return d, nil
	case <-d.exited:
		return nil, fmt.Errorf("modelfs mount exited before mounting (%v):\n%s", d.exitErr, d.Log())
	case <-time.After(timeout):
		d.Kill()
		return nil, fmt.Errorf("modelfs mount not ready after %v:\n%s", timeout, d.Log())
	}
}

// Log is what the daemon has logged so far.
func (d *Daemon) Log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

// Pid is the daemon's process id.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Stop sends SIGTERM and waits up to timeout for the process to exit,
// returning its exit error (nil for status 0).
func (d *Daemon) Stop(timeout time.Duration) error {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return d.exitErr
	case <-time.After(timeout):
		d.Kill()
		return fmt.Errorf("modelfs did not exit within %v of SIGTERM:\n%s", timeout, d.Log())
	}
}

// Kill ends the daemon with SIGKILL, leaving its mount behind.
func (d *Daemon) Kill() {
	d.cmd.Process.Kill()
	<-d.exited
}

// Exited is closed when the process has exited.
func (d *Daemon) Exited() <-chan struct{} { return d.exited }

// ProcStats are resource figures of a live process from /proc.
type ProcStats struct {
	PeakRSS int64   // bytes (VmHWM)
	CPU     float64 // user + system seconds
}

// Proc reads pid's peak RSS and CPU time.
func Proc(pid int) (ProcStats, error) {
	var ps ProcStats
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ps, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			ps.PeakRSS = kb << 10
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ps, err
	}
	// Fields after the command name, which may hold spaces: utime and
	// stime are the 14th and 15th fields of the whole line.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) > 12 {
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		ps.CPU = (ut + st) / 100 // USER_HZ is 100 on Linux
	}
	return ps, nil
}

// WrittenBytes is the bytes pid has written through write-type system
// calls (including sockets and sendfile): for an object server, about
// the bytes it has sent.
func WrittenBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "wchar:"); ok {
			return strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
		}
	}
	return 0, errors.New("no wchar in /proc/PID/io")
}

// Evict drops the files' cached pages that no process maps, writing dirty
// ones back first; FUSE honours FADV_DONTNEED like any file system.
func Evict(files ...string) error {
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("evict %s: %w", p, err)
		}
		err = f.Sync()
		if errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EROFS) {
			err = nil // a read-only file system has nothing to write back
		}
		if err == nil {
			err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("evict %s: %w", p, err)
		}
	}
	return nil
}
