package fs

import (
	"os"
	"testing"
)

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/mnt/plain`:         "/mnt/plain",
		`/mnt/a\040b`:        "/mnt/a b",
		`/mnt/tab\011x\134y`: "/mnt/tab\tx\\y",
		`/mnt/short\04`:      `/mnt/short\04`,
		`/mnt/not\9octal`:    `/mnt/not\9octal`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

// This process's own table has its root mount, as the kernel writes it.
func TestMountsOfThisProcess(t *testing.T) {
	ms, err := Mounts(0)
	if err != nil {
		t.Fatal(err)
	}
	root := false
	for _, m := range ms {
		if m.FSType == "" || m.Line == "" {
			t.Fatalf("entry %+v lacks its type or line", m)
		}
		root = root || m.Mountpoint == "/"
	}
	if !root {
		t.Errorf("no mount on / among %d", len(ms))
	}
	if self, err := Mounts(os.Getpid()); err != nil || len(self) != len(ms) {
		t.Errorf("Mounts(own pid): %d entries, %v; Mounts(0): %d", len(self), err, len(ms))
	}
}
