package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/template"
)

func templateCmd(ctx context.Context, cfg config.Config, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: kiln template build [NAME...] | kiln template ls")
	}
	switch args[0] {
	case "build":
		fs := flag.NewFlagSet("template build", flag.ContinueOnError)
		force := fs.Bool("force", false, "rebuild even if the cached build is up to date")
		warm := fs.Bool("warm", true, "also build the warm checkpoints of templates with a warm step (needs root and runsc)")
		fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory")
		fs.StringVar(&cfg.Mirror, "mirror", cfg.Mirror, "Debian mirror")
		if err := fs.Parse(args[1:]); err != nil {
			return exitError{2}
		}
		recipes := template.Builtin()
		names := fs.Args()
		if len(names) == 0 {
			for n := range recipes {
				names = append(names, n)
			}
			sort.Strings(names)
		}
		for _, n := range names {
			r, ok := recipes[n]
			if !ok {
				return fmt.Errorf("unknown template %q", n)
			}
			opts := template.BuildOptions{Mirror: cfg.Mirror, Progress: os.Stderr, Force: *force}
			if _, err := template.Build(ctx, cfg.DataDir, r, opts); err != nil {
				return err
			}
			if *warm && r.Warm != nil {
				if err := buildWarm(ctx, cfg, r.Name); err != nil {
					return err
				}
			}
		}
		return nil
	case "ls", "list":
		ts, err := template.List(cfg.DataDir)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tBUILD\tUSER\tWORKDIR\tWARM")
		for _, t := range ts {
			warm := "-"
			if t.Warm != nil {
				warm = t.Warm.Language + ": " + strings.ReplaceAll(t.Warm.Code, "\n", "; ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, t.Hash, t.Defaults.User, t.Defaults.Workdir, warm)
		}
		return tw.Flush()
	}
	return fmt.Errorf("unknown template command %q", args[0])
}

// buildWarm makes the template's warm checkpoint for this host's runsc and
// kiln-agent, unless it exists.
func buildWarm(ctx context.Context, cfg config.Config, name string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	_, im, _, closeManager, err := privateManager(ctx, cfg, log, "warm-")
	if err != nil {
		return fmt.Errorf("warm checkpoint of %s: %w", name, err)
	}
	defer closeManager()
	start := time.Now()
	c, err := im.BuildWarm(ctx, name)
	if err != nil {
		return fmt.Errorf("warm checkpoint of %s: %w", name, err)
	}
	fmt.Fprintf(os.Stderr, "template %s: warm checkpoint %s ready (%s; built in %s)\n", name, c.Key, time.Since(start).Round(time.Millisecond), c.Took)
	return nil
}
