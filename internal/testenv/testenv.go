// Package testenv starts the servers that modelfs's tests, demo and bench
// talk to on loopback: versitygw (a real S3 gateway over a local directory)
// and an in-process TOS protocol server (tos.go). It is shared by tests and
// by the demo and bench programs, so it takes no *testing.T.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Credentials of every test server. They are test-only values.
const (
	AccessKey = "modelfs-test-ak"
	SecretKey = "modelfs-test-secret-key"
	Region    = "us-east-1"
)

// S3Server is a running versitygw.
type S3Server struct {
	Endpoint string // http://127.0.0.1:PORT
	Root     string // directory holding ROOT/<bucket>/<key>
	cmd      *exec.Cmd
	logPath  string
}

// VersitygwPath finds the versitygw binary: $VERSITYGW, then PATH, then the
// repository's .tools/bin (where `make tools` installs it).
func VersitygwPath() (string, error) {
	if p := os.Getenv("VERSITYGW"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	if dir, err := os.Getwd(); err == nil {
		for ; dir != "/" && dir != "."; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, ".tools", "bin", "versitygw")
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
		}
	}
	return "", errors.New("versitygw not found: run `make tools` (or set VERSITYGW)")
}

// StartS3 starts versitygw serving root (created if needed) on a free
// loopback port and waits until it answers.
func StartS3(root string) (*S3Server, error) {
	bin, err := VersitygwPath()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &S3Server{Endpoint: "http://" + addr, Root: root, logPath: filepath.Clean(root) + ".log"}
	logf, err := os.Create(s.logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(bin, "--port", addr, "--access", AccessKey, "--secret", SecretKey,
		"--region", Region, "--quiet", "posix", root)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start versitygw: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("versitygw did not listen on %s: %s", addr, s.Log())
		}
		time.Sleep(20 * time.Millisecond) // polling a port that is not open yet
	}
}

// Stop kills the server.
func (s *S3Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
}

// Client returns an S3 client for seeding and inspecting the server.
func (s *S3Server) Client() *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint:               aws.String(s.Endpoint),
		Region:                     Region,
		UsePathStyle:               true,
		Credentials:                credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// CreateBucket makes a bucket through the S3 API.
func (s *S3Server) CreateBucket(ctx context.Context, bucket string) error {
	_, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	return err
}

// Put uploads one object through the S3 API.
func (s *S3Server) Put(ctx context.Context, bucket, key string, data []byte) error {
	_, err := s.Client().PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(data),
	})
	return err
}

// PutFile uploads a local file as key.
func (s *S3Server) PutFile(ctx context.Context, bucket, key, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = s.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: f})
	return err
}

// PutDir uploads every regular file under dir, keyed by prefix + its
// slash-separated relative path.
func (s *S3Server) PutDir(ctx context.Context, bucket, prefix, dir string) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		return s.PutFile(ctx, bucket, prefix+filepath.ToSlash(rel), p)
	})
}

// Log returns what the server printed.
func (s *S3Server) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// TrimETag removes the quotes S3 puts around ETags.
func TrimETag(e string) string { return strings.Trim(e, `"`) }

// Pid is the server's process id.
func (s *S3Server) Pid() int { return s.cmd.Process.Pid }

// MainWithS3 is the body of a TestMain for tests that mount FUSE file
// systems against versitygw: it skips them unless run as root, starts the
// server in a temporary directory, runs setup (for the package's globals
// and fixtures) and then run (m.Run), cleans up, and returns the exit code.
func MainWithS3(pkg string, setup func(srv *S3Server, dir string) error, run func() int) int {
	if os.Geteuid() != 0 {
		fmt.Printf("%s tests mount FUSE file systems and need root; skipping\n", pkg)
		return 0
	}
	dir, err := os.MkdirTemp("", "modelfs-"+pkg+"-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	srv, err := StartS3(filepath.Join(dir, "s3"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer srv.Stop()
	if err := setup(srv, dir); err != nil {
		fmt.Fprintf(os.Stderr, "%s tests: %v\n", pkg, err)
		return 1
	}
	return run()
}
