package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelfs/modelfs/internal/testenv"
)

// The model TestMain seeds, as the mount must show it.
var seeded = map[string]string{
	"config.json":         `{"a": 1}`,
	"weights.safetensors": strings.Repeat("w", 3<<20+5),
	"sub/tokenizer.json":  `{}`,
}

// TestKillAndRestartOverStaleMount: a daemon killed with SIGKILL leaves a
// dead mount behind ("transport endpoint is not connected"); a new daemon on
// the same mount point detaches it, mounts, serves every byte, and leaves
// exactly one mount there, its own. This is a DaemonSet container restarted
// after an OOM kill.
func TestKillAndRestartOverStaleMount(t *testing.T) {
	mnt := t.TempDir()
	// Registered after TempDir, so it runs before TempDir's removal: nothing
	// stays mounted whatever fails.
	t.Cleanup(func() { detachAll(t, mnt) })
	args := []string{"--endpoint", srv.Endpoint, "--status-addr", "127.0.0.1:0", "s3://" + bucket + "/model", mnt}

	first, err := testenv.StartDaemon(srv.Env(), 30*time.Second, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.Kill)
	checkModel(t, mnt)
	// Whatever stats the mount point (kubelet, the runtime, a shell) leaves
	// its attributes in the kernel's cache, where they outlive the daemon.
	if _, err := os.Stat(mnt); err != nil {
		t.Fatal(err)
	}

	first.Kill()
	if got := modelfsMounts(t, mnt); got != 1 {
		t.Fatalf("after SIGKILL: %d modelfs mounts on %s, want the dead one", got, mnt)
	}
	if _, err := os.ReadFile(filepath.Join(mnt, "config.json")); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("read through the dead mount: %v, want ENOTCONN", err)
	}
	if _, err := os.ReadDir(mnt); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("list the dead mount: %v, want ENOTCONN", err)
	}

	second, err := testenv.StartDaemon(srv.Env(), 30*time.Second, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Kill)
	checkModel(t, mnt)
	if got := modelfsMounts(t, mnt); got != 1 {
		t.Errorf("after the restart: %d modelfs mounts on %s, want 1 (the dead one must be detached, not covered):\n%s",
			got, mnt, mountinfoLines(t, os.Getpid(), mnt))
	}
	// A daemon started while another serves the mount point refuses, and
	// the running one goes on serving.
	code, _, stderr := run(t, nil, append([]string{"mount"}, args...)...)
	if code == 0 || !strings.Contains(stderr, "already served by a running modelfs") {
		t.Errorf("a second daemon on a live mount: exit %d, stderr %q", code, stderr)
	}
	// So does one given a symbolic link to it.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(mnt, link); err != nil {
		t.Fatal(err)
	}
	viaLink := append(append([]string{"mount"}, args[:len(args)-1]...), link)
	code, _, stderr = run(t, nil, viaLink...)
	if code == 0 || !strings.Contains(stderr, "already served by a running modelfs") {
		t.Errorf("a second daemon through a symlink to a live mount: exit %d, stderr %q", code, stderr)
	}
	if got := modelfsMounts(t, mnt); got != 1 {
		t.Errorf("after the refused mounts: %d modelfs mounts on %s, want 1", got, mnt)
	}
	checkModel(t, mnt)

	if err := second.Stop(5 * time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, second.Log())
	}
	if got := len(mountsAt(t, os.Getpid(), mnt)); got != 0 {
		t.Errorf("%d mounts left on %s after SIGTERM:\n%s", got, mnt, mountinfoLines(t, os.Getpid(), mnt))
	}
}

// checkModel reads every seeded file through the mount at dir and compares
// it byte for byte.
func checkModel(t *testing.T, dir string) {
	t.Helper()
	for name, want := range seeded {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("read %s through the mount: %v", name, err)
		}
		if !bytes.Equal(got, []byte(want)) {
			t.Fatalf("%s: read %d bytes that differ from the %d stored", name, len(got), len(want))
		}
	}
}

// modelfsMounts counts the modelfs mounts on dir in this process's mount
// namespace; it fails the test on a mount of another kind there.
func modelfsMounts(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	for _, m := range mountsAt(t, os.Getpid(), dir) {
		if m.fstype != "fuse.modelfs" {
			t.Errorf("a %s mount on %s", m.fstype, dir)
			continue
		}
		n++
	}
	return n
}

// detachAll lazily unmounts everything stacked on dir in this process's
// namespace.
func detachAll(t *testing.T, dir string) {
	for i := 0; i < 10 && isMounted(dir); i++ {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("detach %s: %v", dir, err)
			return
		}
	}
}
