package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/modelfs/modelfs/internal/testenv"
)

// system is a file system the bench mounts a model with: modelfs, or a
// peer a user would pick instead (rclone mount, s3fs).
type system struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Binary  string `json:"binary"`
	// Flags are the options the bench mounts it with, as passed, with the
	// endpoint and the credentials file shown as placeholders.
	Flags []string `json:"flags"`
	Note  string   `json:"note,omitempty"`
	peer  bool
	// stages: the system keeps a copy of what it reads on local disk.
	stages bool
	// mount mounts t on the empty directory mnt and returns once a file
	// can be opened.
	mount func(w *world, t *target, mnt string) (*mountProc, error)
}

// mountProc is a mounted file system's serving process.
type mountProc struct {
	pid  int
	stop func() error // unmount, wait for the process to exit
	log  func() string
}

// modelfsSystem mounts with bin/modelfs and flags.
func modelfsSystem(flags []string) *system {
	bin, _ := testenv.ModelfsPath()
	version := "?"
	if out, err := exec.Command(bin, "version").Output(); err == nil {
		version = strings.TrimSpace(string(out))
	}
	return &system{Name: "modelfs", Version: version, Binary: bin, Flags: flags,
		mount: func(w *world, t *target, mnt string) (*mountProc, error) {
			args := append(append([]string{"--endpoint", t.endpoint}, t.flags...), flags...)
			d, err := testenv.StartDaemon(t.env, time.Minute, append(args, t.uri, mnt)...)
			if err != nil {
				return nil, err
			}
			w.defer_(func() { stopDaemon(d, mnt) })
			return &mountProc{pid: d.Pid(), log: d.Log, stop: func() error { return d.Stop(10 * time.Second) }}, nil
		}}
}

func stopDaemon(d *testenv.Daemon, mnt string) {
	if d.Stop(10*time.Second) != nil {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	}
}

// rcloneFlags is rclone mount tuned for loading large files, as its VFS
// documentation advises: a read-only mount, `--no-modtime` ("S3 ...
// benefit hugely": no HEAD per file), long attribute and directory caches,
// large chunks and a large read-ahead buffer. `--vfs-cache-mode full` is
// the mode the documentation gives for applications that do not read
// strictly in sequence, which an mmap loader does not: the kernel's fault
// read-around and async FUSE reads arrive out of order and, without the
// cache, every out-of-order read restarts the chunked reader (measured:
// `--vfs-cache-mode off --vfs-read-chunk-streams 16` with 4M or 64M chunks
// loaded at 60–100 MiB/s fetching 8–17× the model; full mode at 180–320
// MiB/s fetching 1×; chunk streams did not help in full mode). The bench
// gives every mount an empty `--cache-dir` and deletes it afterwards.
// `--s3-chunk-size` only sizes uploads and is left out.
var rcloneFlags = []string{"--read-only", "--vfs-cache-mode", "full", "--vfs-read-chunk-size", "64M",
	"--buffer-size", "64M", "--vfs-read-ahead", "512M", "--no-modtime", "--no-checksum",
	"--attr-timeout", "1h", "--dir-cache-time", "1h"}

// s3fsOptions is s3fs tuned for large reads as its manual advises: a miss
// loads multipart_size × parallel_count bytes with parallel_count ranged
// GETs, so both are raised (measured: 8 × 32 MB and 16 × 64 MB alike,
// 300–500 MiB/s, 5 × 10 MB, the default, lower); the stat cache is kept
// for the whole run and missing names are cached (enable_noobj_cache, "for
// performance"). Of the FUSE options it passes through, kernel_cache keeps
// the page cache across opens and max_background=64 lets as many reads be
// in flight as modelfs does.
var s3fsOptions = []string{"ro", "use_path_request_style", "parallel_count=16", "multipart_size=64",
	"max_background=64", "kernel_cache", "enable_noobj_cache", "stat_cache_expire=3600", "max_stat_cache_size=100000"}

// peers finds the peers installed on this machine, with extra (space
// separated) replacing a peer's tuned flags where given. It returns notes
// for the ones missing.
func peers(rcloneExtra, s3fsExtra string) (found []*system, notes []string) {
	if bin, err := findTool("RCLONE", "rclone"); err != nil {
		notes = append(notes, "rclone not installed (make bench-peers): skipped")
	} else {
		version := firstLine(bin, "version")
		flags := rcloneFlags
		if rcloneExtra != "" {
			flags = strings.Fields(rcloneExtra)
		}
		found = append(found, &system{Name: "rclone", Version: version, Binary: bin, peer: true,
			Flags: append([]string{"mount", "REMOTE:BUCKET/PREFIX", "MOUNTPOINT", "--cache-dir", "EMPTY_DIR"}, flags...),
			Note: "remote from RCLONE_CONFIG_BENCHS3_* (type s3, provider Other, path style); AWS_CA_BUNDLE unset; " +
				"the full VFS cache keeps a copy of what was read on local disk",
			stages: true,
			mount: func(w *world, t *target, mnt string) (*mountProc, error) {
				env := append(withoutVar(os.Environ(), "AWS_CA_BUNDLE"),
					"RCLONE_CONFIG_BENCHS3_TYPE=s3", "RCLONE_CONFIG_BENCHS3_PROVIDER=Other",
					"RCLONE_CONFIG_BENCHS3_ENV_AUTH=false",
					"RCLONE_CONFIG_BENCHS3_ACCESS_KEY_ID="+testenv.AccessKey,
					"RCLONE_CONFIG_BENCHS3_SECRET_ACCESS_KEY="+testenv.SecretKey,
					"RCLONE_CONFIG_BENCHS3_ENDPOINT="+t.endpoint,
					"RCLONE_CONFIG_BENCHS3_REGION="+testenv.Region,
					"RCLONE_CONFIG_BENCHS3_FORCE_PATH_STYLE=true")
				remote := "benchs3:" + strings.TrimPrefix(t.uri, "s3://")
				cache := mnt + ".rclone-cache"
				w.defer_(func() { os.RemoveAll(cache) })
				p, err := startPeer(w, bin, append([]string{"mount", remote, mnt, "--cache-dir", cache}, flags...), env, mnt)
				if err == nil {
					stop := p.stop
					p.stop = func() error {
						err := stop()
						os.RemoveAll(cache)
						return err
					}
				}
				return p, err
			}})
	}
	if bin, err := findTool("S3FS", "s3fs"); err != nil {
		notes = append(notes, "s3fs not installed (make bench-peers): skipped")
	} else {
		version := firstLine(bin, "--version")
		if m := regexp.MustCompile(`V[0-9.]+`).FindString(version); m != "" {
			version = "s3fs " + m
		}
		opts := s3fsOptions
		if s3fsExtra != "" {
			opts = strings.Fields(s3fsExtra)
		}
		found = append(found, &system{Name: "s3fs", Version: version, Binary: bin, peer: true, stages: true,
			Note:  "s3fs stages what it reads in unlinked temporary files (page cache and disk, not RSS)",
			Flags: []string{"BUCKET:/PREFIX", "MOUNTPOINT", "-f", "-o", strings.Join(append([]string{"url=ENDPOINT", "passwd_file=FILE"}, opts...), ",")},
			mount: func(w *world, t *target, mnt string) (*mountProc, error) {
				pw := filepath.Join(w.dir, "s3fs.passwd")
				if err := os.WriteFile(pw, []byte(testenv.AccessKey+":"+testenv.SecretKey+"\n"), 0o600); err != nil {
					return nil, err
				}
				bucket, prefix, _ := strings.Cut(strings.TrimPrefix(t.uri, "s3://"), "/")
				o := strings.Join(append([]string{"url=" + t.endpoint, "passwd_file=" + pw}, opts...), ",")
				return startPeer(w, bin, []string{bucket + ":/" + prefix, mnt, "-f", "-o", o}, os.Environ(), mnt)
			}})
	}
	return found, notes
}

// startPeer runs a peer's mount command in the foreground and returns once
// mnt is mounted and answers.
func startPeer(w *world, bin string, args, env []string, mnt string) (*mountProc, error) {
	logPath := mnt + ".log"
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	readLog := func() string {
		b, _ := os.ReadFile(logPath)
		return string(b)
	}
	stop := func() error {
		cmd.Process.Signal(syscall.SIGTERM)
		var err error
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
			err = fmt.Errorf("%s did not exit within 10 s of SIGTERM", filepath.Base(bin))
		}
		if mounted(mnt) {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
		return err
	}
	w.defer_(func() {
		stop()
		os.Remove(logPath)
	})
	if err := waitMounted(mnt, cmd.Process.Pid, time.Minute); err != nil {
		stop()
		return nil, fmt.Errorf("%s: %w\n%s", filepath.Base(bin), err, readLog())
	}
	// The first access waits for the file system's INIT; a listing is
	// what any loader does first.
	if _, err := os.ReadDir(mnt); err != nil {
		stop()
		return nil, fmt.Errorf("%s: listing the mount: %w\n%s", filepath.Base(bin), err, readLog())
	}
	return &mountProc{pid: cmd.Process.Pid, stop: stop, log: readLog}, nil
}

// waitMounted waits until dir shows in the mount table, or process pid
// exits, or timeout passes. It sleeps in poll(2) on both: the mount table
// signals a change with POLLPRI, the process's pidfd its exit with POLLIN.
func waitMounted(dir string, pid int, timeout time.Duration) error {
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer mi.Close()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pidfd)
	deadline := time.Now().Add(timeout)
	for !mounted(dir) { // the table is read after mi was opened: no change is missed
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%s not mounted after %v", dir, timeout)
		}
		fds := []unix.PollFd{{Fd: int32(mi.Fd()), Events: unix.POLLPRI}, {Fd: int32(pidfd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(left/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return err
		}
		if fds[1].Revents&unix.POLLIN != 0 {
			return errors.New("exited before mounting")
		}
	}
	return nil
}

// findTool finds a peer's binary: $ENV, then the repository's .tools/bin
// (where `make bench-peers` installs a current rclone), then PATH.
func findTool(env, name string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	if dir, err := os.Getwd(); err == nil {
		for ; dir != "/" && dir != "."; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, ".tools", "bin", name)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	return exec.LookPath(name)
}

func firstLine(bin string, args ...string) string {
	out, _ := exec.Command(bin, args...).Output()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if line == "" {
		return "?"
	}
	return line
}

func withoutVar(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}
