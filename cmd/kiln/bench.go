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
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory (templates)")
	if err := fs.Parse(args); err != nil {
		return exitError{2}
	}
	m, closeManager, err := privateManager(ctx, cfg, log, "bench-")
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
