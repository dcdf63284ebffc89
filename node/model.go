package node

import (
	"context"
	"sync"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/prefetch"
)

// Model states, as the runtime API reports them.
const (
	StatusDownloading = "downloading" // being listed or pulled into the cache
	StatusDownloaded  = "downloaded"  // every byte the pull covers was fetched or already read
	StatusFailed      = "failed"      // listing or pulling failed; see the error
)

// model is one model the mount shows.
type model struct {
	name, uri string
	own       bool // the mount's own model, named at mount
	progress  prefetch.Progress

	mu     sync.Mutex
	store  backend.Store // nil until listed
	files  int
	bytes  int64
	probe  string // a key of the model, for reachability checks
	err    error
	gone   bool               // detached
	cancel context.CancelFunc // stops the pull
}

// ModelStatus is a model as GET /v1/model/list shows it.
type ModelStatus struct {
	Name       string `json:"model_name"`
	URI        string `json:"model_uri"`
	Status     string `json:"status"`
	BytesDone  int64  `json:"bytes_done"`
	BytesTotal int64  `json:"bytes_total"`
	Files      int    `json:"files"`
	Bytes      int64  `json:"bytes"`
	// CacheLimited says the pull covers more than the cache can hold
	// ahead of readers: it stops when the cache is full and goes on as the
	// model is read, so the status stays downloading until then.
	CacheLimited bool   `json:"cache_limited,omitempty"`
	Error        string `json:"error,omitempty"`
}

func (m *model) fail(err error) {
	m.mu.Lock()
	if m.err == nil {
		m.err = err
	}
	m.mu.Unlock()
}

func (m *model) status(window int64) ModelStatus {
	m.mu.Lock()
	err := m.err
	listed := m.store != nil
	st := ModelStatus{Name: m.name, URI: m.uri, Files: m.files, Bytes: m.bytes,
		BytesDone: m.progress.Done.Load(), BytesTotal: m.progress.Total.Load()}
	m.mu.Unlock()
	st.CacheLimited = st.BytesTotal > window
	switch {
	case err != nil:
		st.Status, st.Error = StatusFailed, err.Error()
	case listed && m.progress.Planned.Load() && st.BytesDone >= st.BytesTotal:
		st.Status = StatusDownloaded
	default:
		st.Status = StatusDownloading
	}
	return st
}
