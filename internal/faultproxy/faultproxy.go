// Package faultproxy is an HTTP proxy for tests that sits between an S3
// client and an S3 server on loopback and injects the failures object
// stores and networks produce: bodies that stall mid-transfer, connections
// reset mid-transfer, 503 SlowDown bursts, bodies cut short of their
// Content-Length, bodies that trickle in below any sane speed, and late
// first bytes.
//
// Faults apply only to object GETs (GET /BUCKET/KEY: the proxy assumes
// path-style addressing, which S3 clients use for IP endpoints); listings,
// HEADs and writes always pass through untouched. One Fault is armed at a
// time (Set), switched off with Off, and the proxy counts how often each
// kind actually fired (Fired), so a test can assert that the failure it
// meant to cause really happened.
//
// Requests are forwarded with their Host header unchanged, so SigV4
// signatures made for the proxy's address still verify upstream.
package faultproxy

import (
	"bytes"
	"cmp"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is a type of fault.
type Kind int

// The faults a Proxy injects into object GETs.
const (
	// None injects nothing.
	None Kind = iota
	// Stall forwards the response headers and After body bytes, then
	// sends nothing more and holds the connection open until the client
	// gives up (or the proxy closes).
	Stall
	// Reset forwards the headers and After body bytes and, once the
	// client has acknowledged them, resets the connection (TCP RST).
	Reset
	// SlowDown answers 503 with an S3 SlowDown error without forwarding
	// the request.
	SlowDown
	// Truncate forwards the headers and After body bytes, then closes the
	// connection cleanly (FIN), short of the Content-Length it announced.
	Truncate
	// Drip forwards the body at Rate bytes per second.
	Drip
	// Delay waits Delay before forwarding the request, so no byte of the
	// response arrives before then.
	Delay

	numKinds
)

// Kinds lists every fault kind but None.
var Kinds = []Kind{Stall, Reset, SlowDown, Truncate, Drip, Delay}

var kindNames = [numKinds]string{"none", "stall", "reset", "slowdown", "truncate", "drip", "delay"}

func (k Kind) String() string {
	if k < 0 || k >= numKinds {
		return "kind(" + strconv.Itoa(int(k)) + ")"
	}
	return kindNames[k]
}

// DefaultRate is the Drip rate when Fault.Rate is 0: far below the 1 MiB/s
// low-speed limits clients use.
const DefaultRate = 64 << 10

// Fault describes what to inject and into which object GETs.
type Fault struct {
	Kind Kind
	// After is how many body bytes Stall, Reset and Truncate forward
	// before they strike. A response whose body is no longer than After
	// is forwarded whole, and the fault does not count as fired.
	After int64
	// Rate is Drip's speed in bytes per second (0: DefaultRate).
	Rate int64
	// Delay is how long Delay waits before forwarding.
	Delay time.Duration

	// Which matching GETs the fault strikes: with Probability > 0, each
	// one with that probability; otherwise every Every-th one counted
	// from Set (0 and 1 mean every one).
	Every       int
	Probability float64
	// Limit, if positive, bounds how often the fault fires; after that
	// every GET passes. A SlowDown burst of K requests is
	// {Kind: SlowDown, Limit: K}.
	Limit int64
	// Match, if set, restricts the fault to GETs of the keys it accepts
	// (the key without the bucket).
	Match func(key string) bool
}

// armed is the fault in force, with its own selection counters so that a
// new Set starts counting afresh.
type armed struct {
	Fault
	seen     atomic.Int64 // matching GETs since Set
	reserved atomic.Int64 // firings taken against Limit
}

// take decides whether the GET of key is struck, reserving a firing
// against Limit when it is; give the firing back with untake if the fault
// then cannot apply.
func (a *armed) take(key string) bool {
	if a.Kind == None || (a.Match != nil && !a.Match(key)) {
		return false
	}
	n := a.seen.Add(1)
	if a.Probability > 0 {
		if rand.Float64() >= a.Probability {
			return false
		}
	} else if every := int64(max(a.Every, 1)); n%every != 0 {
		return false
	}
	if a.Limit > 0 && a.reserved.Add(1) > a.Limit {
		a.reserved.Add(-1)
		return false
	}
	return true
}

func (a *armed) untake() {
	if a.Limit > 0 {
		a.reserved.Add(-1)
	}
}

// Proxy is a running fault-injecting proxy. Its methods are safe for
// concurrent use.
type Proxy struct {
	// URL is where clients reach the proxy: http://127.0.0.1:PORT.
	URL string

	upstream *url.URL
	srv      *http.Server
	tr       *http.Transport

	fault    atomic.Pointer[armed]
	fired    [numKinds]atomic.Int64
	gets     atomic.Int64 // object GETs seen
	requests atomic.Int64 // requests of any kind
	ids      atomic.Int64

	done     chan struct{} // closed by Close: releases stalls, drips and delays
	mu       sync.Mutex
	closed   bool
	handlers sync.WaitGroup
}

// New starts a proxy for upstream (http://HOST:PORT) on a free loopback
// port, with no fault armed.
func New(upstream string) (*Proxy, error) {
	u, err := url.Parse(upstream)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("faultproxy: upstream %q: want http://HOST:PORT", upstream)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{
		URL:      "http://" + ln.Addr().String(),
		upstream: u,
		tr: &http.Transport{
			Proxy:               nil, // never an HTTP_PROXY from the environment
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true, // pass bodies as the server sent them
		},
		done: make(chan struct{}),
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go p.srv.Serve(ln)
	return p, nil
}

// Set arms f in place of whatever fault was armed; its Every and Limit
// count from now.
func (p *Proxy) Set(f Fault) { p.fault.Store(&armed{Fault: f}) }

// Off disarms the fault. Faults already striking (a held stall, a drip in
// progress) run their course.
func (p *Proxy) Off() { p.fault.Store(nil) }

// Fired is how many times faults of kind k have struck.
func (p *Proxy) Fired(k Kind) int64 {
	if k <= None || k >= numKinds {
		return 0
	}
	return p.fired[k].Load()
}

// TotalFired is how many faults of any kind have struck.
func (p *Proxy) TotalFired() int64 {
	var n int64
	for _, k := range Kinds {
		n += p.Fired(k)
	}
	return n
}

// ObjectGets is how many object GETs the proxy has seen.
func (p *Proxy) ObjectGets() int64 { return p.gets.Load() }

// Requests is how many requests of any kind the proxy has seen.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

// Close stops the proxy: it releases every held stall, drip and delay,
// closes all connections and waits for its handlers to return.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.done)
	err := p.srv.Close()
	p.handlers.Wait()
	p.tr.CloseIdleConnections()
	return err
}

// enter registers a handler unless the proxy is closing.
func (p *Proxy) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.handlers.Add(1)
	return true
}

// ServeHTTP forwards r upstream, injecting the armed fault into object GETs.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !p.enter() {
		http.Error(w, "faultproxy closed", http.StatusServiceUnavailable)
		return
	}
	defer p.handlers.Done()
	p.requests.Add(1)
	var a *armed
	if key, ok := objectKey(r); ok {
		p.gets.Add(1)
		if cur := p.fault.Load(); cur != nil && cur.take(key) {
			a = cur
		}
	}
	if a == nil {
		p.forward(w, r, nil)
		return
	}
	switch a.Kind {
	case SlowDown:
		p.fire(a.Kind)
		p.slowDown(w, r)
	case Delay:
		p.fire(a.Kind)
		if p.sleep(r.Context(), a.Delay) {
			p.forward(w, r, nil)
		}
	default:
		p.forward(w, r, a)
	}
}

func (p *Proxy) fire(k Kind) { p.fired[k].Add(1) }

// objectKey returns the key of an object GET: GET /BUCKET/KEY.
func objectKey(r *http.Request) (string, bool) {
	if r.Method != http.MethodGet {
		return "", false
	}
	bucket, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	return key, bucket != "" && key != ""
}

// hopHeaders are meaningful for one connection only and are not forwarded.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// forward sends r upstream and copies the response back, applying a's body
// fault (Stall, Reset, Truncate or Drip) when a is set.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, a *armed) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = p.upstream.Scheme, p.upstream.Host
	out.Host = r.Host // the client signed it
	removeHopHeaders(out.Header)
	if r.ContentLength == 0 {
		out.Body = nil
	}
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		if a != nil {
			a.untake()
		}
		if r.Context().Err() == nil {
			http.Error(w, "faultproxy: "+err.Error(), http.StatusBadGateway)
		}
		return
	}
	defer resp.Body.Close()
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	removeHopHeaders(h)
	h.Del("Content-Length")
	if resp.ContentLength >= 0 {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	w.WriteHeader(resp.StatusCode)
	if r.Method == http.MethodHead {
		return
	}
	// Only successful bodies of known length are struck: errors and
	// precondition failures pass as they are.
	ok := resp.StatusCode/100 == 2 && resp.ContentLength >= 0
	if a == nil || !ok || (a.Kind != Drip && resp.ContentLength <= a.After) {
		if a != nil {
			a.untake()
		}
		copyBody(w, resp.Body)
		return
	}
	body := resp.Body
	rc := http.NewResponseController(w)
	switch a.Kind {
	case Drip:
		p.fire(a.Kind)
		p.drip(r.Context(), w, rc, body, cmp.Or(a.Rate, DefaultRate))
		return
	case Stall, Reset, Truncate:
		if _, err := io.CopyN(w, body, a.After); err != nil {
			a.untake() // the client or the server went away first
			return
		}
		if err := rc.Flush(); err != nil {
			a.untake()
			return
		}
		p.fire(a.Kind)
	}
	switch a.Kind {
	case Stall:
		// Hold the connection until the client gives up; returning then
		// closes it, short of its Content-Length.
		select {
		case <-r.Context().Done():
		case <-p.done:
		}
	case Reset:
		abort(rc, true)
	case Truncate:
		abort(rc, false)
	}
}

// copyBuffers recycles the buffers of plain forwarding.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

func copyBody(w io.Writer, body io.Reader) {
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	io.CopyBuffer(w, body, *buf)
}

// abort takes the connection from the HTTP server, whose buffered output
// has been flushed, and closes it: with reset, by RST (linger 0), else
// with an orderly FIN.
//
// A reset discards whatever the kernel has not sent yet, so before it abort
// waits (up to resetDrain) until the client has acknowledged every byte
// written: the client then reads exactly the bytes forwarded before the
// fault, as it would from a server that died at that point.
func abort(rc *http.ResponseController, reset bool) {
	conn, _, err := rc.Hijack()
	if err != nil {
		return // returning short of Content-Length makes the server close it
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		waitAcked(tc, resetDrain)
		tc.SetLinger(0)
	}
	conn.Close()
}

// resetDrain bounds how long a reset waits for the client to acknowledge
// the bytes before it.
const resetDrain = 2 * time.Second

// drip copies body to w at about rate bytes per second, in slices every
// dripTick, until the body ends, the client leaves or the proxy closes.
func (p *Proxy) drip(ctx context.Context, w io.Writer, rc *http.ResponseController, body io.Reader, rate int64) {
	per := max(rate*int64(dripTick)/int64(time.Second), 1)
	buf := make([]byte, per)
	t := time.NewTicker(dripTick)
	defer t.Stop()
	for {
		n, err := io.ReadFull(body, buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
		if err != nil {
			return
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		case <-p.done:
			return
		}
	}
}

const dripTick = 50 * time.Millisecond

// sleep waits d; it reports false if the client left or the proxy closed
// first.
func (p *Proxy) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-p.done:
		return false
	}
}

// slowDown answers r the way S3 throttles: 503 with a SlowDown error.
func (p *Proxy) slowDown(w http.ResponseWriter, r *http.Request) {
	id := fmt.Sprintf("FAULTPROXY%08d", p.ids.Add(1))
	var res bytes.Buffer
	if err := xml.EscapeText(&res, []byte(r.URL.Path)); err != nil {
		res.Reset()
	}
	body := `<?xml version="1.0" encoding="UTF-8"?>` + "\n" +
		`<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>` +
		`<Resource>` + res.String() + `</Resource><RequestId>` + id + `</RequestId></Error>`
	h := w.Header()
	h.Set("Content-Type", "application/xml")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Amz-Request-Id", id)
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, body)
}
