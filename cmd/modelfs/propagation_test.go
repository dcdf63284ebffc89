package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelfs/modelfs/fs"
	"github.com/modelfs/modelfs/internal/testenv"
)

// TestMountPropagation runs the Kubernetes layout of deploy/ in real mount
// namespaces, all of them throwaway children of a private one, so that the
// test's own namespace never gets a mount:
//
//   - "node": a private namespace in which host (a temp dir, like the node's
//     /var/lib/modelfs) is bound on itself and made shared;
//   - the daemon: a new namespace copied from the node's with propagation
//     unchanged, so its copy of host is a peer (a Bidirectional hostPath);
//     it mounts on host/models;
//   - "app": a namespace copied from the node's in which host is a slave (a
//     HostToContainer hostPath), created before the daemon starts.
//
// The app must see the daemon's mount and read the model byte for byte; a
// mount made in the app must not reach the node or the daemon; after the
// daemon is killed and another started, the running app must read the new
// mount (the stale one detached everywhere), while a bind of the mount point
// itself, which is what a hostPath of the mount point would be, stays dead;
// and SIGTERM must take the mount away from the node and the app.
func TestMountPropagation(t *testing.T) {
	for _, tool := range []string{"unshare", "nsenter", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	self := os.Getpid()
	host := t.TempDir()
	models := filepath.Join(host, "models")
	probe := filepath.Join(host, "from-app")
	rootBound := t.TempDir()
	for _, d := range []string{models, probe} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Runs after every namespace is gone (cleanups run last-in first-out).
	t.Cleanup(func() {
		for _, dir := range []string{host, rootBound} {
			if ms := mountsUnder(t, self, dir); len(ms) > 0 {
				t.Errorf("the test's namespace has mounts under %s: %v", dir, ms)
			}
		}
	})

	node := holdNamespace(t, "node", "unshare", "-m", "--propagation", "private", "--",
		"sh", "-c", `set -e; mount --bind "$0" "$0"; mount --make-shared "$0"; echo ready; exec sleep infinity`, host)
	nodeGroup := onlyMount(t, node.pid, host).tag("shared")
	if nodeGroup == "" {
		t.Fatalf("the node's %s is not shared:\n%s", host, mountinfoLines(t, node.pid, host))
	}
	app := holdNamespace(t, "app", "nsenter", "-t", strconv.Itoa(node.pid), "-m", "--",
		"unshare", "-m", "--propagation", "slave", "--", "sh", "-c", `echo ready; exec sleep infinity`)
	if got := onlyMount(t, app.pid, host).tag("master"); got != nodeGroup {
		t.Fatalf("the app's %s is not a slave of the node's (master %q, want %q):\n%s",
			host, got, nodeGroup, mountinfoLines(t, app.pid, host))
	}

	// The daemon runs in a new namespace made from the node's.
	wrapper := filepath.Join(t.TempDir(), "modelfs-in-namespace")
	script := fmt.Sprintf("#!/bin/sh\nexec nsenter -t %d -m -- unshare -m --propagation unchanged -- %s \"$@\"\n", node.pid, bin)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MODELFS_BIN", wrapper)
	args := []string{"--endpoint", srv.Endpoint, "--status-addr", "127.0.0.1:0", "--allow-other",
		"s3://" + bucket + "/model", models}
	startDaemon := func() (*testenv.Daemon, string) {
		t.Helper()
		d, err := testenv.StartDaemon(srv.Env(), 30*time.Second, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Kill)
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", d.Pid())); ns == nsOf(t, node.pid) || ns == nsOf(t, self) {
			t.Fatalf("the daemon runs in the node's or the test's mount namespace (%s)", ns)
		}
		m := onlyMount(t, d.Pid(), models)
		if m.fstype != "fuse.modelfs" || m.tag("shared") == "" {
			t.Fatalf("the daemon's mount is not a shared modelfs mount:\n%s", mountinfoLines(t, d.Pid(), models))
		}
		return d, m.tag("shared")
	}

	daemon, group := startDaemon()
	t.Run("bidirectional", func(t *testing.T) {
		if m := onlyMount(t, node.pid, models); m.fstype != "fuse.modelfs" || m.tag("shared") != group {
			t.Errorf("the node's mount is not a peer of the daemon's (group %s):\n%s", group, mountinfoLines(t, node.pid, models))
		}
	})
	t.Run("host to container", func(t *testing.T) {
		if m := onlyMount(t, app.pid, models); m.fstype != "fuse.modelfs" || m.tag("master") != group {
			t.Errorf("the app's mount is not a slave of the daemon's (group %s):\n%s", group, mountinfoLines(t, app.pid, models))
		}
		appReadsModel(t, app.pid, models)
	})
	t.Run("not back from the app", func(t *testing.T) {
		if _, err := inNamespace(app.pid, "mount", "-t", "tmpfs", "modelfs-app-probe", probe); err != nil {
			t.Fatal(err)
		}
		if len(mountsAt(t, app.pid, probe)) != 1 {
			t.Fatalf("the app's own mount is not there:\n%s", mountinfoLines(t, app.pid, probe))
		}
		for _, ns := range []struct {
			name string
			pid  int
		}{{"node", node.pid}, {"daemon", daemon.Pid()}, {"test", self}} {
			if ms := mountsAt(t, ns.pid, probe); len(ms) != 0 {
				t.Errorf("a mount made in the app shows in the %s's namespace: %v", ns.name, ms)
			}
		}
	})
	// What a hostPath of the mount point itself would hold: a bind of this
	// very mount, which no later mount replaces.
	if _, err := inNamespace(app.pid, "mount", "--bind", models, rootBound); err != nil {
		t.Fatal(err)
	}
	appReadsModel(t, app.pid, rootBound)

	daemon.Kill()
	if _, err := inNamespace(app.pid, "cat", filepath.Join(models, "config.json")); err == nil ||
		!strings.Contains(err.Error(), "not connected") {
		t.Fatalf("read in the app after SIGKILL: %v, want ENOTCONN", err)
	}
	daemon, group = startDaemon()
	t.Run("restart reaches running apps", func(t *testing.T) {
		appReadsModel(t, app.pid, models)
		for _, ns := range []struct {
			name, tag string
			pid       int
		}{{"node", "shared", node.pid}, {"app", "master", app.pid}, {"daemon", "shared", daemon.Pid()}} {
			ms := mountsAt(t, ns.pid, models)
			if len(ms) != 1 || ms[0].tag(ns.tag) != group {
				t.Errorf("%s: want one mount on %s, %s:%s (the dead one detached, not covered):\n%s",
					ns.name, models, ns.tag, group, mountinfoLines(t, ns.pid, models))
			}
		}
		if _, err := inNamespace(app.pid, "cat", filepath.Join(rootBound, "config.json")); err == nil ||
			!strings.Contains(err.Error(), "not connected") {
			t.Errorf("a bind of the old mount point reads %v after the restart; want ENOTCONN "+
				"(deploy/ shares the parent directory because of this)", err)
		}
	})

	if err := daemon.Stop(5 * time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, daemon.Log())
	}
	for _, ns := range []struct {
		name string
		pid  int
	}{{"node", node.pid}, {"app", app.pid}} {
		if ms := mountsAt(t, ns.pid, models); len(ms) != 0 {
			t.Errorf("the %s still has %d mounts on %s after the daemon stopped:\n%s", ns.name, len(ms), models,
				mountinfoLines(t, ns.pid, models))
		}
	}
}

// appReadsModel reads every seeded file under dir from a process in pid's
// mount namespace, never from the test process.
func appReadsModel(t *testing.T, pid int, dir string) {
	t.Helper()
	for name, want := range seeded {
		got, err := inNamespace(pid, "cat", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, []byte(want)) {
			t.Fatalf("%s: the app read %d bytes that differ from the %d stored", name, len(got), len(want))
		}
	}
}

// inNamespace runs argv in pid's mount namespace and returns its stdout; an
// error carries its stderr.
func inNamespace(pid int, argv ...string) ([]byte, error) {
	cmd := exec.Command("nsenter", append([]string{"-t", strconv.Itoa(pid), "-m", "--"}, argv...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// namespaceHolder is a process that keeps a mount namespace alive.
type namespaceHolder struct{ pid int }

// holdNamespace starts argv, which must enter or create a mount namespace,
// print "ready" once set up there, and then sleep; it is killed when the
// test ends, and its namespace goes with it.
func holdNamespace(t *testing.T, name string, argv ...string) namespaceHolder {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
	}()
	select {
	case l := <-line:
		if l != "ready" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%s namespace: %q: %s", name, l, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s namespace not ready: %s", name, stderr.String())
	}
	h := namespaceHolder{pid: cmd.Process.Pid}
	if nsOf(t, h.pid) == nsOf(t, os.Getpid()) {
		t.Fatalf("%s namespace is the test's own", name)
	}
	return h
}

func nsOf(t *testing.T, pid int) string {
	t.Helper()
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// mountEntry is a line of /proc/PID/mountinfo.
type mountEntry struct {
	mountpoint, fstype, source string
	optional                   []string // shared:N, master:N, propagate_from:N, unbindable
	line                       string
}

// tag is N of the optional field kind:N ("shared", "master"), or "".
func (m mountEntry) tag(kind string) string {
	for _, f := range m.optional {
		if v, ok := strings.CutPrefix(f, kind+":"); ok {
			return v
		}
	}
	return ""
}

func (m mountEntry) String() string { return m.line }

// mounts reads pid's mount table.
func mounts(t *testing.T, pid int) []mountEntry {
	t.Helper()
	ms, err := fs.Mounts(pid)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]mountEntry, len(ms))
	for i, m := range ms {
		out[i] = mountEntry{mountpoint: m.Mountpoint, fstype: m.FSType, source: m.Source, optional: m.Optional, line: m.Line}
	}
	return out
}

// mountsAt is pid's mounts on dir, bottom first.
func mountsAt(t *testing.T, pid int, dir string) []mountEntry {
	t.Helper()
	var out []mountEntry
	for _, m := range mounts(t, pid) {
		if m.mountpoint == dir {
			out = append(out, m)
		}
	}
	return out
}

// mountsUnder is pid's mounts on dir or below it.
func mountsUnder(t *testing.T, pid int, dir string) []mountEntry {
	t.Helper()
	var out []mountEntry
	for _, m := range mounts(t, pid) {
		if m.mountpoint == dir || strings.HasPrefix(m.mountpoint, dir+"/") {
			out = append(out, m)
		}
	}
	return out
}

// onlyMount is the single mount on dir in pid's namespace.
func onlyMount(t *testing.T, pid int, dir string) mountEntry {
	t.Helper()
	ms := mountsAt(t, pid, dir)
	if len(ms) != 1 {
		t.Fatalf("%d mounts on %s in process %d's namespace, want 1:\n%s", len(ms), dir, pid, mountinfoLines(t, pid, dir))
	}
	return ms[0]
}

// mountinfoLines shows pid's mounts on or under dir, for messages.
func mountinfoLines(t *testing.T, pid int, dir string) string {
	t.Helper()
	var b strings.Builder
	for _, m := range mountsUnder(t, pid, dir) {
		b.WriteString("  " + m.line + "\n")
	}
	if b.Len() == 0 {
		return "  (none)\n"
	}
	return b.String()
}
