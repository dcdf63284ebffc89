package fs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MountInfo is one line of /proc/PID/mountinfo.
type MountInfo struct {
	Mountpoint, FSType, Source string
	Options                    string   // per-mount options: ro,nosuid,...
	Optional                   []string // shared:N, master:N, propagate_from:N, unbindable
	Line                       string
}

// Mounts reads the mount table of process pid (0: this one), in the
// kernel's order: a mount comes after the mounts it covers.
func Mounts(pid int) ([]MountInfo, error) {
	path := "/proc/self/mountinfo"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/mountinfo", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []MountInfo
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		f := strings.Fields(line)
		sep := -1
		for i := 6; i < len(f); i++ {
			if f[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || len(f) < sep+3 {
			return nil, fmt.Errorf("%s: malformed line %q", path, line)
		}
		out = append(out, MountInfo{Mountpoint: unescapeMountinfo(f[4]), Options: f[5], Optional: f[6:sep],
			FSType: f[sep+1], Source: unescapeMountinfo(f[sep+2]), Line: line})
	}
	return out, nil
}

// MountsOn is what this process sees mounted on dir, bottom first. Like
// mount(2), it follows symbolic links in dir: mountinfo names the target.
func MountsOn(dir string) []MountInfo {
	abs, err := filepath.EvalSymlinks(dir)
	if err == nil {
		abs, err = filepath.Abs(abs)
	} else {
		abs, err = filepath.Abs(dir)
	}
	if err != nil {
		return nil
	}
	ms, err := Mounts(0)
	if err != nil {
		return nil
	}
	var out []MountInfo
	for _, m := range ms {
		if m.Mountpoint == abs {
			out = append(out, m)
		}
	}
	return out
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
