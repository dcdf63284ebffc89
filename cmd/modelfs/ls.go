package main

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/modelfs/modelfs/backend"
	"github.com/modelfs/modelfs/fs"
)

func lsCommand() *cli.Command {
	return &cli.Command{
		Name:      "ls",
		Usage:     "list what a mount of URI would show, without mounting",
		ArgsUsage: "URI",
		Flags: concat([]cli.Flag{
			&cli.StringFlag{Name: "allow-suffix", EnvVars: []string{"MODELFS_ALLOW_SUFFIX", "DOWNLOADER_ALLOW_FILE_SUFFIX"},
				Usage: "list only files with these comma-separated suffixes"},
		}, storeFlags, logFlags),
		Action: func(c *cli.Context) error {
			loc, err := uriArg(c)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(c.Context, backend.MetadataTimeout)
			defer cancel()
			store, err := openStore(ctx, c, loc, 4)
			if err != nil {
				return err
			}
			defer store.Close()
			var filter fs.Filter
			if s := c.String("allow-suffix"); s != "" {
				filter = fs.SuffixFilter(strings.Split(s, ","))
			}
			tree, err := fs.List(ctx, store, loc.Prefix, filter)
			if err != nil {
				return explain(err, loc, store)
			}
			w := bufio.NewWriter(c.App.Writer)
			fs.Walk(tree.Root, func(p string, e *fs.Entry) {
				if e.IsDir() {
					fmt.Fprintf(w, "%14s  %s  %s/\n", "-", e.ModTime.UTC().Format(time.DateTime), p)
					return
				}
				fmt.Fprintf(w, "%14d  %s  %s\n", e.Obj.Size, e.ModTime.UTC().Format(time.DateTime), p)
			})
			fmt.Fprintf(w, "%d files, %d bytes\n", tree.Files, tree.Bytes)
			return w.Flush()
		},
	}
}

func catCommand() *cli.Command {
	return &cli.Command{
		Name:      "cat",
		Usage:     "write one object to standard output, without mounting",
		ArgsUsage: "URI (s3://BUCKET/KEY or tos://BUCKET/KEY)",
		Flags:     concat(storeFlags, policyFlags, logFlags),
		Action: func(c *cli.Context) error {
			loc, err := uriArg(c)
			if err != nil {
				return err
			}
			key := strings.TrimSuffix(loc.Prefix, "/")
			if key == "" || strings.HasSuffix(c.Args().First(), "/") {
				return usageErr("cat needs the URI of an object, not of a prefix: %s", c.Args().First())
			}
			policy, err := parsePolicy(c)
			if err != nil {
				return err
			}
			ctx := c.Context
			store, err := openStore(ctx, c, loc, 4)
			if err != nil {
				return err
			}
			defer store.Close()
			statCtx, cancel := context.WithTimeout(ctx, backend.MetadataTimeout)
			obj, err := store.Stat(statCtx, key)
			cancel()
			if err != nil {
				return explain(err, loc, store)
			}
			r := backend.NewReader(store, policy)
			w := bufio.NewWriterSize(c.App.Writer, 1<<20)
			buf := make([]byte, 8<<20)
			for off := int64(0); off < obj.Size; {
				n := min(int64(len(buf)), obj.Size-off)
				if err := r.ReadAt(ctx, obj, buf[:n], off); err != nil {
					return err
				}
				if _, err := w.Write(buf[:n]); err != nil {
					return err
				}
				off += n
			}
			return w.Flush()
		},
	}
}

// uriArg sets up logging and parses the one URI argument of ls and cat.
func uriArg(c *cli.Context) (backend.Location, error) {
	if err := setupLogging(c, c.App.ErrWriter); err != nil {
		return backend.Location{}, err
	}
	if c.NArg() != 1 {
		return backend.Location{}, usageErr("%s needs one URI, got %d argument(s)", c.Command.Name, c.NArg())
	}
	loc, err := backend.ParseURI(c.Args().First())
	if err != nil {
		return backend.Location{}, usageErr("%v", err)
	}
	return loc, nil
}
