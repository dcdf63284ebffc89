# modelfs: make demo (the tour), make test (what CI runs), make bench (bench-peers, bench-full).
GO            ?= go
TOOLS         := $(CURDIR)/.tools/bin
VERSITYGW_VERSION   := v1.8.0
STATICCHECK_VERSION := v0.8.2
RCLONE_VERSION      := v1.76.0
VERSION       ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

export VERSITYGW := $(TOOLS)/versitygw
export MODELFS_BIN := $(CURDIR)/bin/modelfs

.PHONY: all build tools demo test soak lint bench bench-peers bench-full clean

all: build

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/modelfs ./cmd/modelfs

# versitygw is the S3 server the demo, tests and bench run on loopback.
tools: $(TOOLS)/versitygw

$(TOOLS)/versitygw:
	GOBIN=$(TOOLS) $(GO) install github.com/versity/versitygw/cmd/versitygw@$(VERSITYGW_VERSION)

$(TOOLS)/staticcheck:
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

demo: build tools
	$(GO) run ./bench demo

# Unit and integration tests: real FUSE mounts (root) against versitygw.
# The concurrent packages run under the race detector.
test: build tools lint
	$(GO) test -race -count=1 ./cache/... ./prefetch/... ./backend/... ./node/...
	$(GO) test -count=1 -timeout 20m ./...

# The fault soak for longer than make test runs it: 8 loader processes
# through a fault-injecting proxy, faults switched on and off. SOAK=5m.
SOAK ?= 5m
soak: build tools
	$(GO) test -count=1 -timeout 0 -v -run 'TestSoak$$' ./cmd/modelfs -soak=$(SOAK)

lint: $(TOOLS)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOLS)/staticcheck ./...

# The benchmark: modelfs against the direct ceiling and, when installed, the
# peers (rclone mount, s3fs) on the same server and model. About 10 minutes.
bench: build tools
	$(GO) run ./bench run

# Everything, with the sweeps (model size up to 16 GiB where the disk has
# room, shard count, cache budget, concurrent loaders). About 20 minutes.
bench-full: build tools
	$(GO) run ./bench run -sweeps all -json bench/results/full.json

# The peers the bench compares with (root): s3fs and fuse3 (fusermount3, which
# rclone mount needs) from Debian; a current rclone built into .tools/bin
# (Debian's 1.60 predates --vfs-read-chunk-streams), Debian's if that fails.
bench-peers:
	apt-get install -y s3fs fuse3 || { apt-get update && apt-get install -y s3fs fuse3; }
	GOBIN=$(TOOLS) $(GO) install github.com/rclone/rclone@$(RCLONE_VERSION) || apt-get install -y rclone
	@echo "peers: $$(s3fs --version | head -1); $$({ $(TOOLS)/rclone version || rclone version; } 2>/dev/null | head -1)"

clean:
	rm -rf bin
