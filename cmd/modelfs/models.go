package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/modelfs/modelfs/node"
)

var addrFlag = &cli.StringFlag{Name: "addr", Value: "127.0.0.1:9090", EnvVars: []string{"MODELFS_STATUS_ADDR"},
	Usage: "the status server of a running modelfs mount"}

// api is a client of a mount's status server.
type api struct{ base string }

func newAPI(c *cli.Context) api {
	a := c.String("addr")
	if !strings.Contains(a, "://") {
		a = "http://" + a
	}
	return api{base: strings.TrimSuffix(a, "/")}
}

// call sends a request and decodes a JSON answer into out; a non-2xx answer
// becomes an error carrying the server's message.
func (a api) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("modelfs at %s: %w", a.base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e struct{ Error string }
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s %s: %s", method, path, e.Error)
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

func (a api) list(ctx context.Context) ([]node.ModelStatus, error) {
	var out struct{ Models []node.ModelStatus }
	err := a.call(ctx, "GET", "/v1/model/list", nil, &out)
	return out.Models, err
}

func healthCommand() *cli.Command {
	return &cli.Command{
		Name:  "health",
		Usage: "check a running mount: exit 0 when it is healthy (mounted, stores reachable), for probes",
		Flags: []cli.Flag{addrFlag,
			&cli.BoolFlag{Name: "ready", Usage: "check readiness (mounted and answering) instead"}},
		Action: func(c *cli.Context) error {
			path := "/healthz"
			if c.Bool("ready") {
				path = "/readyz"
			}
			ctx, cancel := context.WithTimeout(c.Context, 10*time.Second)
			defer cancel()
			if err := newAPI(c).call(ctx, "GET", path, nil, nil); err != nil {
				return cli.Exit(err.Error(), 1)
			}
			fmt.Fprintln(c.App.Writer, "ok")
			return nil
		},
	}
}

func modelsCommand() *cli.Command {
	return &cli.Command{
		Name:  "models",
		Usage: "list, attach and detach models of a running mount (its runtime API)",
		Subcommands: []*cli.Command{
			{
				Name:  "list",
				Usage: "list the models and how far their download is",
				Flags: []cli.Flag{addrFlag},
				Action: func(c *cli.Context) error {
					ms, err := newAPI(c).list(c.Context)
					if err != nil {
						return err
					}
					tw := tabwriter.NewWriter(c.App.Writer, 2, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tSTATUS\tDONE\tTOTAL\tURI")
					for _, m := range ms {
						status := m.Status
						if m.Error != "" {
							status += ": " + m.Error
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", m.Name, status, human(m.BytesDone), human(m.BytesTotal), m.URI)
					}
					return tw.Flush()
				},
			},
			{
				Name:      "add",
				Usage:     "attach URI under MOUNTPOINT/NAME and start downloading it",
				ArgsUsage: "URI",
				Flags: []cli.Flag{addrFlag,
					&cli.StringFlag{Name: "name", Usage: "directory name under the mount (default: the URI's last element)"},
					&cli.StringFlag{Name: "endpoint", Usage: "the model's store endpoint (default: the mount's)"},
					&cli.StringFlag{Name: "region", Usage: "the model's store region (default: the mount's)"},
					&cli.StringFlag{Name: "allow-suffix", Usage: "show only files with these comma-separated suffixes"},
				},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageErr("models add needs one URI, got %d argument(s)", c.NArg())
					}
					st, err := addModel(c, c.Args().First())
					if err != nil {
						return err
					}
					fmt.Fprintf(c.App.Writer, "%s: %s\n", st.Name, st.Status)
					return nil
				},
			},
			{
				Name:      "rm",
				Usage:     "detach a model",
				ArgsUsage: "NAME",
				Flags:     []cli.Flag{addrFlag},
				Action: func(c *cli.Context) error {
					if c.NArg() != 1 {
						return usageErr("models rm needs one NAME, got %d argument(s)", c.NArg())
					}
					return newAPI(c).call(c.Context, "DELETE", "/v1/model/"+url.PathEscape(c.Args().First()), nil, nil)
				},
			},
		},
	}
}

func addModel(c *cli.Context, uri string) (node.ModelStatus, error) {
	body := map[string]any{"model_uri": uri, "model_name": c.String("name")}
	extra := map[string]any{}
	for _, f := range []string{"endpoint", "region"} {
		if v := c.String(f); v != "" {
			extra[f] = v
		}
	}
	if v := c.String("allow-suffix"); v != "" {
		extra["allow_file_suffix"] = v
	}
	body["download_extra_config"] = extra
	var st node.ModelStatus
	err := newAPI(c).call(c.Context, "POST", "/v1/model/download", body, &st)
	return st, err
}

func warmCommand() *cli.Command {
	return &cli.Command{
		Name:      "warm",
		Usage:     "download a model into a running mount's cache and show the progress until it is done",
		ArgsUsage: "NAME | URI",
		Description: `With a URI the model is attached first (as modelfs models add). The progress
bar shows bytes, rate and time left; the command exits 0 once every byte the
pull covers is in the cache (or, for a model larger than the cache, once the
cache is full), 1 if the download fails.`,
		Flags: []cli.Flag{addrFlag,
			&cli.StringFlag{Name: "name", Usage: "with a URI: directory name under the mount"},
			&cli.StringFlag{Name: "endpoint", Usage: "with a URI: the model's store endpoint"},
			&cli.StringFlag{Name: "region", Usage: "with a URI: the model's store region"},
			&cli.StringFlag{Name: "allow-suffix", Usage: "with a URI: show only these suffixes"},
			&cli.DurationFlag{Name: "interval", Value: 500 * time.Millisecond, Usage: "how often to poll"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageErr("warm needs one NAME or URI, got %d argument(s)", c.NArg())
			}
			if c.Duration("interval") <= 0 {
				return usageErr("--interval %v: want a positive duration", c.Duration("interval"))
			}
			name := c.Args().First()
			if strings.Contains(name, "://") {
				st, err := addModel(c, name)
				if err != nil {
					return err
				}
				name = st.Name
			}
			return watch(c, newAPI(c), name)
		},
	}
}

// watch polls a model until it is downloaded or failed, drawing progress.
func watch(c *cli.Context, a api, name string) error {
	out := c.App.ErrWriter
	tty := isTerminal(out)
	start := time.Now()
	var firstDone, lastDone int64 = -1, -1
	still := 0 // polls without progress
	t := time.NewTicker(c.Duration("interval"))
	defer t.Stop()
	for {
		ms, err := a.list(c.Context)
		if err != nil {
			return err
		}
		var st *node.ModelStatus
		for i := range ms {
			if ms[i].Name == name {
				st = &ms[i]
			}
		}
		if st == nil {
			return fmt.Errorf("no model named %q on %s", name, a.base)
		}
		if firstDone < 0 {
			firstDone = st.BytesDone
		}
		line := progressLine(st, st.BytesDone-firstDone, time.Since(start))
		if tty {
			fmt.Fprintf(out, "\r\033[K%s", line)
		} else {
			fmt.Fprintln(out, line)
		}
		if st.BytesDone == lastDone {
			still++
		} else {
			still = 0
		}
		lastDone = st.BytesDone
		switch {
		case st.Status == node.StatusDownloading && st.CacheLimited && still >= 4:
			if tty {
				fmt.Fprintln(out)
			}
			fmt.Fprintf(c.App.Writer, "%s: the cache is full with %s of %s; the rest is fetched as the model is read\n",
				name, human(st.BytesDone), human(st.BytesTotal))
			return nil
		case st.Status == node.StatusDownloaded:
			if tty {
				fmt.Fprintln(out)
			}
			fmt.Fprintf(c.App.Writer, "%s: downloaded %s in %.1f s\n", name, human(st.BytesTotal), time.Since(start).Seconds())
			return nil
		case st.Status == node.StatusFailed:
			if tty {
				fmt.Fprintln(out)
			}
			return fmt.Errorf("%s: download failed: %s", name, st.Error)
		}
		select {
		case <-c.Context.Done():
			return c.Context.Err()
		case <-t.C:
		}
	}
}

// progressLine is "name [#####-----] 1.2 GiB / 4.0 GiB  850 MiB/s  3s left".
func progressLine(st *node.ModelStatus, moved int64, elapsed time.Duration) string {
	const width = 30
	frac := 0.0
	if st.BytesTotal > 0 {
		frac = min(float64(st.BytesDone)/float64(st.BytesTotal), 1)
	}
	bar := strings.Repeat("#", int(frac*width)) + strings.Repeat("-", width-int(frac*width))
	rate := float64(moved) / max(elapsed.Seconds(), 1e-3)
	left := "?"
	if rate > 0 && st.BytesTotal > 0 {
		left = time.Duration(float64(st.BytesTotal-st.BytesDone) / rate * float64(time.Second)).Round(time.Second).String()
	}
	return fmt.Sprintf("%s [%s] %s / %s  %s/s  %s left  (%s)", st.Name, bar, human(st.BytesDone), human(st.BytesTotal),
		human(int64(rate)), left, st.Status)
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
