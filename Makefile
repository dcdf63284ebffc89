# modelfs: make demo (the tour), make test (what CI runs), make bench.
GO            ?= go
TOOLS         := $(CURDIR)/.tools/bin
VERSITYGW_VERSION   := v1.8.0
STATICCHECK_VERSION := v0.8.2
VERSION       ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

export VERSITYGW := $(TOOLS)/versitygw
export MODELFS_BIN := $(CURDIR)/bin/modelfs

.PHONY: all build tools demo test test-short lint bench clean

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

lint: $(TOOLS)/staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(TOOLS)/staticcheck ./...

bench: build tools
	$(GO) run ./bench run

clean:
	rm -rf bin
