package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/builder"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// kiln template manages a server's templates (build from a Dockerfile,
// an image or steps; list, inspect, tag, delete), and, with --local or
// without a name to build (-t), builds the built-in templates on this
// host, as make setup does.

const templateUsage = `Usage:
  kiln template build -t NAME[:TAG] [flags] CONTEXT_DIR   build a template from a Dockerfile
  kiln template build -t NAME[:TAG] --from-image REF [--run CMD]...
                                                  build one from an OCI image (or --from TEMPLATE)
  kiln template ls                                list templates: yours, public ones, built-ins
  kiln template get REF                           show a template and its current build
  kiln template rm REF...                         delete a tag (name:tag) or a template (name)
  kiln template tag NAME:TAG BUILD_ID             point a tag at a build
  kiln template untag NAME:TAG                    remove a tag
  kiln template publish|unpublish NAME            let every key use it, or only yours
  kiln template builds [NAME]                     list builds, newest first
  kiln template logs BUILD_ID [-f]                print (or follow) a build's log

On this host, without a server (make setup):
  kiln template build [--local] [NAME...]         build the built-in templates (default: all but
                                                  desktop, which is built when named)
  kiln template ls --local                        list the built-in templates built here

A REF is name or name:tag (tag "default" when left out). Run
'kiln template COMMAND -h' for a command's flags and examples.
` + remoteHelp

func templateCmd(ctx context.Context, cfg config.Config, args []string) error {
	return newRemote().template(ctx, cfg, args)
}

func (r *remote) template(ctx context.Context, cfg config.Config, args []string) error {
	cmds := map[string]func(context.Context, []string) error{
		"build":   func(ctx context.Context, args []string) error { return r.templateBuild(ctx, cfg, args) },
		"ls":      func(ctx context.Context, args []string) error { return r.templateList(ctx, cfg, args) },
		"get":     r.templateGet,
		"rm":      r.templateRemove,
		"delete":  r.templateRemove,
		"tag":     r.templateTag,
		"untag":   r.templateUntag,
		"push":    r.templatePush,
		"publish": func(ctx context.Context, args []string) error { return r.templatePublish(ctx, "publish", true, args) },
		"unpublish": func(ctx context.Context, args []string) error {
			return r.templatePublish(ctx, "unpublish", false, args)
		},
		"builds": r.templateBuilds,
		"logs":   r.templateLogs,
	}
	cmds["list"] = cmds["ls"]
	return r.dispatch(ctx, "template", templateUsage, cmds, args)
}

// localFlags are the flags of a local build of the built-ins.
type localFlags struct {
	local, force, warm *bool
}

// buildLocal builds the built-in templates names (all when empty) into
// cfg.DataDir with the template engine, then their warm checkpoints.
func (r *remote) buildLocal(ctx context.Context, cfg config.Config, f localFlags, mode string, names []string) error {
	recipes := template.Builtin()
	if len(names) == 0 {
		for n, rc := range recipes {
			if !rc.OnDemand {
				names = append(names, n)
			}
		}
		sort.Strings(names)
	}
	// Each after the built-in it is made from.
	var order []string
	seen := map[string]bool{}
	var add func(n string) error
	add = func(n string) error {
		rc, ok := recipes[n]
		if !ok {
			return fmt.Errorf("unknown built-in template %q (to build a Dockerfile on a server: kiln template build -t NAME -f Dockerfile CONTEXT_DIR)", n)
		}
		if seen[n] {
			return nil
		}
		seen[n] = true
		if d := rc.Spec.From.Debian; d != nil && recipes[d.Template] != nil {
			if err := add(d.Template); err != nil {
				return err
			}
		}
		order = append(order, n)
		return nil
	}
	for _, n := range names {
		if err := add(n); err != nil {
			return err
		}
	}
	names = order
	b, closeBuilder, err := localBuilder(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeBuilder()
	for _, n := range names {
		rc := recipes[n]
		start := time.Now()
		fmt.Fprintf(r.stderr, "template %s:\n", n)
		d, closeDisplay := display(r.stderr, mode)
		t, existed, err := b.BuildBuiltin(ctx, rc, *f.force, d.Add)
		closeDisplay()
		if err != nil {
			return err
		}
		if existed {
			fmt.Fprintf(r.stderr, "template %s: up to date (%s)\n", n, t.Hash)
		} else {
			fmt.Fprintf(r.stderr, "template %s: built %s in %s\n", n, t.Hash, time.Since(start).Round(time.Second))
		}
		if *f.warm && rc.Warm != nil {
			if err := buildWarm(ctx, cfg, rc.Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// localBuilder is a template engine on this host for the built-ins: its
// own sandboxes (without networking: the built-ins' RUN steps need none;
// their packages come with the Debian base), in-memory records and
// scratch build dirs, the built-ins' layer store, and the Debian mirror.
func localBuilder(ctx context.Context, cfg config.Config) (*builder.Builder, func(), error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, _, st, closeManager, err := privateManager(ctx, cfg, log, "build-")
	if err != nil {
		return nil, nil, fmt.Errorf("building templates: %w", err)
	}
	layers, err := layer.Open(template.BuiltinLayers(cfg.DataDir))
	if err != nil {
		closeManager()
		return nil, nil, err
	}
	mirror := cfg.Mirror
	if mirror == "" {
		mirror = "http://deb.debian.org/debian"
	}
	b, err := builder.New(ctx, builder.Config{
		DataDir: filepath.Join(template.BuiltinLayers(cfg.DataDir), "builds"), Records: st, Layers: layers,
		Catalog: &template.Catalog{DataDir: cfg.DataDir}, Sandboxes: m, Network: sandbox.NetworkNone,
		DebianMirror: mirror, DebianCache: filepath.Join(template.Dir(cfg.DataDir), ".apt-cache"), Log: log,
	})
	if err != nil {
		closeManager()
		return nil, nil, err
	}
	return b, func() {
		b.Close()
		closeManager()
	}, nil
}

// listLocal lists the built-in templates built in cfg.DataDir.
func (r *remote) listLocal(cfg config.Config) error {
	ts, err := template.List(cfg.DataDir)
	if err != nil {
		return err
	}
	tw := r.table()
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
