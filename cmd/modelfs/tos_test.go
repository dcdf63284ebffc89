package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelfs/modelfs/internal/safetensors"
	"github.com/modelfs/modelfs/internal/testenv"
)

// TestMountTOS mounts tos:// from the TOS protocol server: a generated
// model loads byte for byte through mmap in another process, and a wrong
// secret key fails the mount with a clear error and nothing mounted.
func TestMountTOS(t *testing.T) {
	tos, err := testenv.StartTOS()
	if err != nil {
		t.Fatal(err)
	}
	defer tos.Stop()
	ctx := context.Background()
	const tosBucket = "tos-cli-test"
	if err := tos.CreateBucket(ctx, tosBucket); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	shards, err := safetensors.Generate(src, safetensors.Spec{Bytes: 24 << 20, Shards: 2, Seed: 41, Mixed: true})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	var tensorBytes int64
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := tos.Put(ctx, tosBucket, "model/"+e.Name(), data); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range shards {
		r, err := safetensors.Load(s, true)
		if err != nil {
			t.Fatal(err)
		}
		tensorBytes += r.Bytes
	}
	env := func(secret string) []string {
		return append(os.Environ(), "TOS_ACCESS_KEY="+testenv.AccessKey, "TOS_SECRET_KEY="+secret,
			"TOS_REGION="+tos.Region, "TOS_ENDPOINT="+tos.Endpoint)
	}
	uri := "tos://" + tosBucket + "/model"

	t.Run("serves the model byte for byte", func(t *testing.T) {
		mnt := t.TempDir()
		d, err := testenv.StartDaemon(env(testenv.SecretKey), 30*time.Second, uri, mnt)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Stop(10 * time.Second)
		var files []string
		for _, s := range shards {
			files = append(files, filepath.Join(mnt, filepath.Base(s)))
		}
		ld := testenv.Loader(files...)
		var out, errb bytes.Buffer
		ld.Stdout, ld.Stderr = &out, &errb
		if err := ld.Run(); err != nil {
			t.Fatalf("loader: %v\n%s\ndaemon log:\n%s", err, errb.String(), d.Log())
		}
		if got, _ := strconv.ParseInt(strings.TrimSpace(out.String()), 10, 64); got != tensorBytes {
			t.Fatalf("loader verified %d tensor bytes, the model has %d", got, tensorBytes)
		}
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".safetensors") {
				continue
			}
			want, _ := os.ReadFile(filepath.Join(src, e.Name()))
			got, err := os.ReadFile(filepath.Join(mnt, e.Name()))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s through the mount: %d bytes, %v; want the %d bytes put", e.Name(), len(got), err, len(want))
			}
		}
	})

	t.Run("wrong secret key fails the mount", func(t *testing.T) {
		mnt := t.TempDir()
		cmd := exec.Command(bin, "mount", uri, mnt)
		cmd.Env = env("not-the-secret-key")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("mount with a wrong key still running after 30 s; stderr:\n%s", stderr.String())
		}
		if err == nil {
			t.Fatalf("mount with a wrong key exited 0; stderr:\n%s", stderr.String())
		}
		t.Logf("mount with a wrong key: %v: %s", err, strings.TrimSpace(stderr.String()))
		if !strings.Contains(stderr.String(), "refused the credentials") {
			t.Errorf("stderr does not name the cause:\n%s", stderr.String())
		}
		if strings.Contains(stderr.String(), "not-the-secret-key") || strings.Contains(stderr.String(), testenv.SecretKey) {
			t.Errorf("stderr shows a secret key:\n%s", stderr.String())
		}
		if isMounted(mnt) {
			t.Errorf("%s is mounted after the failed mount", mnt)
		}
	})
}
