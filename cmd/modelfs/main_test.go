package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelfs/modelfs/fs"
	"github.com/modelfs/modelfs/internal/testenv"
)

// These tests run the modelfs binary, built from this package by TestMain,
// against a real versitygw.
var (
	srv *testenv.S3Server
	bin string
)

const bucket = "cli-test"

func TestMain(m *testing.M) {
	testenv.ServeLoader()
	os.Exit(testenv.MainWithS3("cmd", func(s *testenv.S3Server, dir string) error {
		srv = s
		bin = filepath.Join(dir, "modelfs")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			return fmt.Errorf("build modelfs: %v\n%s", err, out)
		}
		os.Setenv("MODELFS_BIN", bin)
		ctx := context.Background()
		if err := srv.CreateBucket(ctx, bucket); err != nil {
			return err
		}
		for key, data := range map[string]string{
			"model/config.json":         `{"a": 1}`,
			"model/weights.safetensors": strings.Repeat("w", 3<<20+5),
			"model/sub/tokenizer.json":  `{}`,
		} {
			if err := srv.Put(ctx, bucket, key, []byte(data)); err != nil {
				return err
			}
		}
		return nil
	}, m.Run))
}

// run runs the binary with the test server's credentials plus extra
// environment and returns its exit code and output. A command still
// running after 90 s (a mount that should have failed) gets SIGTERM, and
// so unmounts.
func run(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	cmd.Env = append(srv.Env(), env...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatal(err)
	}
	return code, o.String(), e.String()
}

func isMounted(dir string) bool { return len(fs.MountsOn(dir)) > 0 }

func TestBadInputFailsBeforeMounting(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	os.WriteFile(file, nil, 0o644)
	uri := "s3://" + bucket + "/model"
	ep := []string{"--endpoint", srv.Endpoint}
	cases := []struct {
		name string
		env  []string
		args []string // before URI MOUNTPOINT; nil URI means use uri
		uri  string
		mnt  string
		want string
	}{
		{name: "scheme", uri: "gs://bucket/m", want: `unsupported URI scheme "gs"`},
		{name: "no scheme", uri: "bucket/m", want: "invalid model URI"},
		{name: "no bucket", uri: "s3://", want: "missing bucket name"},
		{name: "bad bucket", uri: "s3://Bad_Bucket/m", want: "bucket name"},
		{name: "double slash", uri: "s3://bucket/a//b", want: "empty path element"},
		{name: "missing mountpoint", args: ep, mnt: "/nonexistent/mnt", want: "mountpoint /nonexistent/mnt does not exist"},
		{name: "file mountpoint", args: ep, mnt: file, want: "is not a directory"},
		{name: "missing bucket", args: ep, uri: "s3://no-such-bucket/m", want: `bucket "no-such-bucket" does not exist`},
		{name: "empty prefix", args: ep, uri: "s3://" + bucket + "/nothing-here", want: "no objects under s3://" + bucket + "/nothing-here/"},
		{name: "refused credentials", args: ep, env: []string{"AWS_SECRET_ACCESS_KEY=wrong-secret"}, want: "refused the credentials"},
		{name: "unknown access key", args: ep, env: []string{"AWS_ACCESS_KEY_ID=nobody"}, want: "refused the credentials"},
		{name: "unreachable endpoint", args: []string{"--endpoint", "http://127.0.0.1:1"}, want: "cannot reach the object store"},
		{name: "endpoint scheme", args: []string{"--endpoint", "ftp://127.0.0.1:1"}, want: "invalid S3 endpoint"},
		{name: "max-io-queue", args: append([]string{"--max-io-queue", "1"}, ep...), want: "--max-io-queue 1"},
		{name: "cache beyond memory", args: []string{"--max-io-queue", "65536", "--io-chunksize", "256MiB"}, want: "more than this machine's"},
		{name: "io-chunksize unit", args: []string{"--io-chunksize", "8 parsecs"}, want: "--io-chunksize"},
		{name: "io-chunksize range", args: []string{"--io-chunksize", "1000"}, want: "--io-chunksize 1000"},
		{name: "io-chunksize env", env: []string{"DOWNLOADER_S3_IO_CHUNKSIZE=12345"}, want: "--io-chunksize 12345"},
		{name: "read-ahead-kb", args: []string{"--read-ahead-kb", "-1"}, want: "--read-ahead-kb -1"},
		{name: "concurrency", args: []string{"--concurrency", "0"}, want: "--concurrency 0"},
		{name: "part-size", args: []string{"--part-size", "4K"}, want: "--part-size 4K"},
		{name: "log-level", args: []string{"--log-level", "loud"}, want: `--log-level "loud"`},
		{name: "request-timeout", args: []string{"--request-timeout", "1ms"}, want: "--request-timeout 1ms"},
		{name: "max-attempts", args: []string{"--max-attempts", "0"}, want: "--max-attempts 0"},
		{name: "metadata-ttl", args: []string{"--metadata-ttl", "10ms"}, want: "--metadata-ttl 10ms"},
		{name: "prefetch mode", args: []string{"--prefetch", "some"}, want: `prefetch mode "some"`},
		{name: "tos without region", env: []string{"TOS_REGION=", "TOS_ACCESS_KEY=a", "TOS_SECRET_KEY=b"},
			args: []string{"--endpoint", "http://127.0.0.1:1"}, uri: "tos://bucket/m", want: "TOS needs a region"},
		{name: "log-format", args: []string{"--log-format", "xml"}, want: `--log-format "xml"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mnt := c.mnt
			if mnt == "" {
				mnt = t.TempDir()
			}
			u := c.uri
			if u == "" {
				u = uri
			}
			args := append(append([]string{"mount"}, c.args...), u, mnt)
			code, _, stderr := run(t, c.env, args...)
			if code == 0 {
				t.Fatalf("modelfs %q exited 0", args)
			}
			if !strings.Contains(stderr, c.want) {
				t.Errorf("stderr %q does not say %q", stderr, c.want)
			}
			if strings.Contains(stderr, testenv.SecretKey) || strings.Contains(stderr, "wrong-secret") {
				t.Errorf("stderr shows a secret: %q", stderr)
			}
			if isMounted(mnt) {
				syscall.Unmount(mnt, syscall.MNT_DETACH)
				t.Errorf("%s left mounted", mnt)
			}
		})
	}
	t.Run("warm interval", func(t *testing.T) {
		code, _, stderr := run(t, nil, "warm", "--interval", "0s", "some-model")
		if code != 2 || !strings.Contains(stderr, "--interval 0s") || strings.Contains(stderr, "panic") {
			t.Errorf("warm --interval 0s: exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("no URI and the status address taken", func(t *testing.T) {
		// Without a URI the mount is served only through its status
		// server: with the default address taken it must not start.
		if ln, err := net.Listen("tcp", "127.0.0.1:9090"); err == nil {
			defer ln.Close()
		}
		mnt := t.TempDir()
		code, _, stderr := run(t, nil, "mount", mnt)
		if code == 0 || !strings.Contains(stderr, "status server") {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
		if isMounted(mnt) {
			syscall.Unmount(mnt, syscall.MNT_DETACH)
			t.Errorf("%s left mounted", mnt)
		}
	})
	t.Run("argument count", func(t *testing.T) {
		code, _, stderr := run(t, nil, "mount", uri)
		if code == 0 || !strings.Contains(stderr, "mount needs a MOUNTPOINT after") {
			t.Errorf("exit %d, stderr %q", code, stderr)
		}
	})
}

// TestSIGTERMWithFileHeldOpen: the daemon unmounts and exits 0 promptly
// even while a reader holds a file open.
func TestSIGTERMWithFileHeldOpen(t *testing.T) {
	mnt := t.TempDir()
	d, err := testenv.StartDaemon(srv.Env(), 30*time.Second, "--endpoint", srv.Endpoint, "--log-level", "debug",
		"s3://"+bucket+"/model", mnt)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	f, err := os.Open(filepath.Join(mnt, "weights.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	if n, err := f.Read(buf); err != nil || n == 0 || buf[0] != 'w' {
		t.Fatalf("read through the mount: %d, %v", n, err)
	}
	start := time.Now()
	if err := d.Stop(5 * time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	t.Logf("stopped in %v", time.Since(start))
	if isMounted(mnt) {
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		t.Fatal("still mounted after exit")
	}
	// The held file is cut off, not hung.
	if _, err := f.ReadAt(buf, 2<<20); err == nil {
		t.Error("read from the held file after shutdown succeeded")
	}
	if log := d.Log(); strings.Contains(log, testenv.SecretKey) {
		t.Errorf("log shows the secret key:\n%s", log)
	}
}

func TestLsCatVersion(t *testing.T) {
	ep := []string{"--endpoint", srv.Endpoint}
	code, out, stderr := run(t, nil, append(append([]string{"ls"}, ep...), "s3://"+bucket+"/model")...)
	if code != 0 {
		t.Fatalf("ls: exit %d: %s", code, stderr)
	}
	for _, want := range []string{"config.json", "sub/", "sub/tokenizer.json", fmt.Sprint(3<<20 + 5), "3 files"} {
		if !strings.Contains(out, want) {
			t.Errorf("ls output lacks %q:\n%s", want, out)
		}
	}
	code, out, stderr = run(t, nil, append(append([]string{"cat"}, ep...), "s3://"+bucket+"/model/weights.safetensors")...)
	if code != 0 || out != strings.Repeat("w", 3<<20+5) {
		t.Errorf("cat: exit %d, %d bytes, %s", code, len(out), stderr)
	}
	code, _, stderr = run(t, nil, append(append([]string{"cat"}, ep...), "s3://"+bucket+"/model/")...)
	if code == 0 || !strings.Contains(stderr, "not of a prefix") {
		t.Errorf("cat of a prefix: exit %d, %s", code, stderr)
	}
	code, _, stderr = run(t, nil, append(append([]string{"cat"}, ep...), "s3://"+bucket+"/model/missing")...)
	if code == 0 || !strings.Contains(stderr, "does not exist") {
		t.Errorf("cat of a missing key: exit %d, %s", code, stderr)
	}
	code, out, _ = run(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "modelfs ") {
		t.Errorf("version: exit %d, %q", code, out)
	}
	code, out, _ = run(t, nil, "mount", "--help")
	if code != 0 || !strings.Contains(out, "--max-io-queue") || !strings.Contains(out, "DOWNLOADER_S3_IO_CHUNKSIZE") {
		t.Errorf("mount --help: exit %d:\n%s", code, out)
	}
}

// TestCABundleIgnoredForHTTP: AWS_CA_BUNDLE (set in this environment) must
// not stop a plain-HTTP endpoint from working, even when it names no file.
func TestCABundleIgnoredForHTTP(t *testing.T) {
	for _, bundle := range []string{"/etc/ssl/certs/ca-certificates.crt", "/nonexistent/ca.pem"} {
		code, out, stderr := run(t, []string{"AWS_CA_BUNDLE=" + bundle}, "ls", "--endpoint", srv.Endpoint, "s3://"+bucket+"/model")
		if code != 0 || !strings.Contains(out, "config.json") {
			t.Errorf("AWS_CA_BUNDLE=%s: exit %d: %s", bundle, code, stderr)
		}
	}
}
