package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/fs"
)

// serve runs the status server on ln.
func (n *Node) serve(ln net.Listener) {
	n.StatusURL = "http://" + ln.Addr().String()
	n.reg = n.registry()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", n.handleHealth)
	mux.HandleFunc("GET /readyz", n.handleReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /v1/model/download", n.handleDownload)
	mux.HandleFunc("GET /v1/model/list", n.handleList)
	mux.HandleFunc("DELETE /v1/model/{name}", n.handleDelete)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	n.status = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go n.status.Serve(ln)
	slog.Info("status server listening", "addr", n.StatusURL)
}

// apiError is the body of every failed API request.
type apiError struct {
	Error string `json:"error"`
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, format string, a ...any) {
	reply(w, code, apiError{Error: fmt.Sprintf(format, a...)})
}

// handleHealth: the mount answers and every model's store is reachable.
func (n *Node) handleHealth(w http.ResponseWriter, r *http.Request) {
	if err := n.mountAlive(); err != nil {
		fail(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	if err := n.storesReachable(r.Context()); err != nil {
		fail(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"status": "ok"})
}

// handleReady: the mount is up and answers.
func (n *Node) handleReady(w http.ResponseWriter, r *http.Request) {
	if err := n.mountAlive(); err != nil {
		fail(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"status": "ready"})
}

// mountAlive asks the mount for its root's attributes, bypassing the
// kernel's cache: a wedged server fails the check instead of passing it.
// While a wedged mount keeps a check blocked, later checks wait on that
// one instead of blocking a goroutine each.
func (n *Node) mountAlive() error {
	n.mu.Lock()
	p := n.alive
	if p == nil {
		p = &probe{done: make(chan struct{})}
		n.alive = p
		go func() {
			p.err = n.mount.Alive()
			n.mu.Lock()
			n.alive = nil
			n.mu.Unlock()
			close(p.done)
		}()
	}
	n.mu.Unlock()
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("mount %s: %v", n.cfg.Mountpoint, p.err)
		}
		return nil
	case <-time.After(2 * time.Second):
		return fmt.Errorf("mount %s does not answer", n.cfg.Mountpoint)
	}
}

// probe is one check of the mount: err is set before done is closed.
type probe struct {
	done chan struct{}
	err  error
}

// storesReachable asks each model's store about one of its objects; any
// answer, even "not found", shows the store is reachable.
func (n *Node) storesReachable(ctx context.Context) error {
	for _, m := range n.modelList() {
		m.mu.Lock()
		store, key := m.store, m.probe
		m.mu.Unlock()
		if store == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := store.Stat(ctx, key)
		cancel()
		if err != nil && !errors.Is(err, backend.ErrNotExist) {
			return fmt.Errorf("model %s: store unreachable: %v", m.name, err)
		}
	}
	return nil
}

// downloadRequest is POST /v1/model/download, the body AIBrix's runtime
// takes. Credentials in it are used, never logged or echoed.
type downloadRequest struct {
	ModelURI  string `json:"model_uri"`
	ModelName string `json:"model_name"`
	Extra     struct {
		AK              string          `json:"ak"`
		SK              string          `json:"sk"`
		Endpoint        string          `json:"endpoint"`
		Region          string          `json:"region"`
		AllowFileSuffix json.RawMessage `json:"allow_file_suffix"`
	} `json:"download_extra_config"`
}

// suffixes reads allow_file_suffix: a list or a comma-separated string.
func suffixes(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		return list, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, errors.New("allow_file_suffix: want a string or a list of strings")
	}
	return strings.Split(s, ","), nil
}

func (n *Node) handleDownload(w http.ResponseWriter, r *http.Request) {
	var req downloadRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&req); err != nil {
		fail(w, http.StatusBadRequest, "malformed request body: %v", err)
		return
	}
	if req.ModelURI == "" {
		fail(w, http.StatusBadRequest, "model_uri is required")
		return
	}
	loc, err := backend.ParseURI(req.ModelURI)
	if err != nil {
		fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	name := req.ModelName
	if name == "" {
		name = loc.Name()
	}
	if err := fs.ValidName(name); err != nil {
		fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	sfx, err := suffixes(req.Extra.AllowFileSuffix)
	if err != nil {
		fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	if (req.Extra.AK == "") != (req.Extra.SK == "") {
		fail(w, http.StatusBadRequest, "download_extra_config needs both ak and sk, or neither")
		return
	}
	if req.Extra.Endpoint != "" && req.Extra.AK == "" {
		// The mount's own credentials are for its own store only.
		fail(w, http.StatusBadRequest, "download_extra_config: an endpoint needs its own ak and sk")
		return
	}
	cfg := n.cfg.Store
	if req.Extra.Endpoint != "" {
		cfg.Endpoint = req.Extra.Endpoint
	}
	if req.Extra.Region != "" {
		cfg.Region = req.Extra.Region
	}
	if req.Extra.AK != "" {
		cfg.AccessKey, cfg.SecretKey, cfg.SessionToken = req.Extra.AK, req.Extra.SK, ""
	}
	m := &model{name: name, uri: loc.String()}
	n.mu.Lock()
	_, taken := n.models[name]
	if !taken {
		n.models[name] = m
	}
	n.mu.Unlock()
	if taken {
		fail(w, http.StatusConflict, "a model named %q is already attached", name)
		return
	}
	slog.Info("attaching model", "model", name, "uri", m.uri)
	go n.attach(m, loc, cfg, fs.SuffixFilter(sfx))
	reply(w, http.StatusOK, m.status(n.cache.WindowMax()))
}

// attach lists a model and shows it under the mount, then warms it.
func (n *Node) attach(m *model, loc backend.Location, cfg backend.Config, filter fs.Filter) {
	store, src, err := n.open(n.ctx, loc, m.name, cfg, filter)
	if err != nil {
		slog.Warn("attaching model failed", "model", m.name, "err", err)
		m.fail(err)
		return
	}
	// Under m.mu from the check to the cancel func: a DELETE either comes
	// first (and the model is never attached) or finds it attached and
	// warming, with a store and a cancel func to end them.
	m.mu.Lock()
	if m.gone { // deleted while it was being listed
		m.mu.Unlock()
		store.Close()
		return
	}
	files, err := n.mount.Attach(m.name, src)
	if err != nil {
		m.mu.Unlock()
		store.Close()
		m.fail(err)
		return
	}
	m.store, m.files, m.bytes, m.probe = store, src.Tree.Files, src.Tree.Bytes, firstKey(src.Tree)
	ctx, cancel := context.WithCancel(n.ctx)
	m.cancel = cancel
	m.mu.Unlock()
	slog.Info("model attached", "model", m.name, "files", src.Tree.Files, "bytes", src.Tree.Bytes)
	n.pull(ctx, m, files)
}

func (n *Node) handleList(w http.ResponseWriter, r *http.Request) {
	reply(w, http.StatusOK, map[string]any{"models": n.Models()})
}

func (n *Node) handleDelete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	n.mu.Lock()
	m, ok := n.models[name]
	own := ok && n.cfg.Root != nil && name == n.cfg.Root.Name() && m.own
	if ok && !own {
		delete(n.models, name)
	}
	n.mu.Unlock()
	switch {
	case !ok:
		fail(w, http.StatusNotFound, "no model named %q", name)
		return
	case own:
		fail(w, http.StatusBadRequest, "%q is the mount's own model; unmount to remove it", name)
		return
	}
	m.mu.Lock()
	m.gone = true
	store, cancel := m.store, m.cancel
	m.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if store != nil {
		if err := n.mount.Detach(name); err != nil {
			slog.Warn("detaching model", "model", name, "err", err)
		}
		store.Close()
	}
	slog.Info("model detached", "model", name)
	reply(w, http.StatusOK, map[string]string{"model_name": name, "status": "deleted"})
}

// firstKey is an object of t, for reachability probes.
func firstKey(t *fs.Tree) string {
	var key string
	fs.Walk(t.Root, func(p string, e *fs.Entry) {
		if key == "" && !e.IsDir() {
			key = e.Obj.Key
		}
	})
	return key
}
