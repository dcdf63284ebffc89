// Command modelfs mounts an object-store prefix as a read-only model
// directory. It only wires flags to the packages that do the work.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"

	"github.com/urfave/cli/v2"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	app := &cli.App{
		Name:                 "modelfs",
		Usage:                "mount an object-store prefix (S3, TOS) as a read-only model directory",
		Version:              buildVersion(),
		HideVersion:          true,
		EnableBashCompletion: true,
		Commands: []*cli.Command{mountCommand(), lsCommand(), catCommand(), modelsCommand(), warmCommand(),
			healthCommand(), versionCommand()},
		ExitErrHandler: func(*cli.Context, error) {}, // main reports errors
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "modelfs:", err)
		code := 1
		var ec cli.ExitCoder
		if errors.As(err, &ec) && ec.ExitCode() != 0 {
			code = ec.ExitCode()
		}
		os.Exit(code)
	}
}

func buildVersion() string {
	if version != "dev" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
	}
	return version
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version",
		Action: func(c *cli.Context) error {
			fmt.Fprintln(c.App.Writer, "modelfs", buildVersion())
			return nil
		},
	}
}

// logFlags configure log/slog for every command.
var logFlags = []cli.Flag{
	&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"MODELFS_LOG_LEVEL"},
		Usage: "debug, info, warn or error"},
	&cli.StringFlag{Name: "log-format", Value: "text", EnvVars: []string{"MODELFS_LOG_FORMAT"},
		Usage: "text or json"},
}

func setupLogging(c *cli.Context, w io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return usageErr("--log-level %q: want debug, info, warn or error", c.String("log-level"))
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	switch strings.ToLower(c.String("log-format")) {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return usageErr("--log-format %q: want text or json", c.String("log-format"))
	}
	slog.SetDefault(slog.New(h))
	return nil
}

// usageErr is a bad-input error: exit status 2.
func usageErr(format string, a ...any) error {
	return cli.Exit(fmt.Sprintf(format, a...), 2)
}

// concat joins flag groups into a new slice.
func concat(groups ...[]cli.Flag) []cli.Flag {
	var out []cli.Flag
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}
