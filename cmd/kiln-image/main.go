// Command kiln-image writes Kiln's container image without a container
// engine (`make image`): the built template's Debian root filesystem plus
// kiln, kiln-agent, runsc and runc, as an OCI image layout and a
// `docker save` tarball (internal/release), and optionally pushes it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/release"
	"github.com/kiln-sh/kiln/internal/template"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kiln-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	cfg := config.FromEnv()
	fs := flag.NewFlagSet("kiln-image", flag.ContinueOnError)
	tmpl := fs.String("template", "base", "the built template whose root filesystem the image runs on")
	kiln := fs.String("kiln", "bin/kiln", "the kiln binary")
	agent := fs.String("agent", "bin/kiln-agent", "the static kiln-agent binary")
	runsc := fs.String("runsc", cfg.RunscPath, "the runsc binary (a static one: scripts/install-runsc.sh)")
	runc := fs.String("runc", "runc", "the runc binary")
	out := fs.String("out", "bin/kiln-image", "the OCI image layout dir to write")
	tarball := fs.String("tar", "bin/kiln-image.tar", "the docker-save tarball to write too (\"\": none)")
	tag := fs.String("tag", "kiln:dev", "the image's name")
	push := fs.String("push", "", "a registry reference (host/repo:tag) to push the image to as well")
	if err := fs.Parse(args); err != nil {
		return err
	}
	t, err := template.Lookup(cfg.DataDir, *tmpl)
	if err != nil {
		return err
	}
	if len(t.Layers) == 0 {
		return fmt.Errorf("template %s has no layers (rebuild it with `kiln template build %s`)", *tmpl, *tmpl)
	}
	paths := []*string{runsc, runc}
	for _, p := range paths {
		if *p, err = exec.LookPath(*p); err != nil {
			return err
		}
	}
	start := time.Now()
	digest, err := release.Build(ctx, release.Options{Rootfs: t.Layers, Kiln: *kiln, Agent: *agent, Runsc: *runsc,
		Runc: *runc, Tag: *tag, Layout: *out, Tarball: *tarball, Push: *push})
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s (%s) in %v\n", *tag, digest, *out, time.Since(start).Round(time.Millisecond))
	return nil
}
