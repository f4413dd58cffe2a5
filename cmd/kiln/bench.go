package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-sh/kiln/internal/bench"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/template"
)

func benchCmd(ctx context.Context, cfg config.Config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	rts := fs.String("runtimes", "runsc,runc", "comma-separated runtimes to measure")
	creates := fs.Int("creates", 30, "sandboxes to create per runtime")
	execs := fs.Int("execs", 200, "command round trips per runtime")
	idle := fs.Int("idle", 10, "idle sandboxes to measure memory over")
	out := fs.String("out", "docs/benchmarks.md", "markdown report to write (- for stdout)")
	load := fs.Bool("load", true, "also load the API: concurrent creates and commands through a real server")
	code := fs.Bool("code", true, "also measure the code interpreter (needs the code-interpreter template)")
	lo := bench.LoadOptions{}
	fs.StringVar(&lo.Runtime, "load-runtime", "runsc", "runtime of the load run")
	fs.IntVar(&lo.Sandboxes, "load-sandboxes", 50, "sandboxes created concurrently in the load run")
	fs.IntVar(&lo.Commands, "load-commands", 1000, "commands run across them")
	fs.IntVar(&lo.Concurrency, "load-concurrency", 16, "commands in flight")
	fs.IntVar(&lo.Overhead, "overhead", 200, "round trips per path for the API overhead comparison")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory (templates)")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	m, st, closeManager, err := privateManager(ctx, cfg, log, "bench-")
	if err != nil {
		return err
	}
	defer closeManager()
	opts := bench.Options{Runtimes: strings.Split(*rts, ","), Creates: *creates, Execs: *execs, Idle: *idle, Progress: os.Stderr}
	if t, err := template.Lookup(cfg.DataDir, "base"); err == nil {
		opts.Rootfs = t.Rootfs
	}
	res, err := bench.Run(ctx, m, opts)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	res.WriteMarkdown(&b)
	if *code {
		crs, err := bench.Code(ctx, m, opts.Runtimes, 100, os.Stderr)
		if err != nil {
			return err
		}
		bench.WriteCodeMarkdown(&b, crs)
	}
	if *load {
		lo.Config = cfg
		lr, err := bench.Load(ctx, m, st, lo, os.Stderr)
		if err != nil {
			return err
		}
		lr.WriteMarkdown(&b)
	}
	if *out == "-" {
		_, err = os.Stdout.Write(b.Bytes())
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s\n", *out)
	return os.WriteFile(*out, b.Bytes(), 0o644)
}
