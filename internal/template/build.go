package template

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// BuildOptions tune a build.
type BuildOptions struct {
	Mirror   string    // Debian mirror; default http://deb.debian.org/debian
	Progress io.Writer // build output and progress lines; nil discards
	Force    bool      // rebuild even if the recipe's build is cached
}

// Build makes the recipe's root filesystem under dataDir unless a build of
// the same recipe exists, and points the template's "current" at it.
// A failed or interrupted build leaves the previous build in place.
func Build(ctx context.Context, dataDir string, r *Recipe, opts BuildOptions) (*Template, error) {
	if !ValidName(r.Name) {
		return nil, fmt.Errorf("template name %q is not valid", r.Name)
	}
	if opts.Mirror == "" {
		opts.Mirror = "http://deb.debian.org/debian"
	}
	out := opts.Progress
	if out == nil {
		out = io.Discard
	}
	hash := r.Hash()
	tdir := filepath.Join(Dir(dataDir), r.Name)
	final := filepath.Join(tdir, hash)
	if !opts.Force {
		if t, err := readBuild(final); err == nil {
			fmt.Fprintf(out, "template %s: up to date (%s)\n", r.Name, hash)
			if err := updateWarm(t, r.Warm); err != nil {
				return nil, err
			}
			return t, setCurrent(tdir, hash)
		}
	}
	if err := os.MkdirAll(tdir, 0o755); err != nil {
		return nil, fmt.Errorf("creating template dir: %w", err)
	}
	work := final + ".building"
	if err := os.RemoveAll(work); err != nil {
		return nil, fmt.Errorf("removing stale build: %w", err)
	}
	rootfs := filepath.Join(work, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return nil, err
	}
	start := time.Now()
	step := func(n int, what string) {
		fmt.Fprintf(out, "template %s: [%d/3] %s (%s elapsed)\n", r.Name, n, what, time.Since(start).Round(time.Second))
	}

	step(1, "debootstrap "+r.Suite+" "+r.Variant)
	args := []string{"--variant=" + r.Variant}
	if len(r.Include) > 0 {
		args = append(args, "--include="+strings.Join(r.Include, ","))
	}
	args = append(args, r.Suite, rootfs, opts.Mirror)
	if err := run(ctx, out, "debootstrap", args...); err != nil {
		return nil, fmt.Errorf("bootstrapping %s: %w", r.Name, err)
	}

	step(2, fmt.Sprintf("installing %d packages", len(r.Packages)))
	if len(r.Packages) > 0 {
		cmd := "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends " + strings.Join(r.Packages, " ")
		if err := chroot(ctx, out, rootfs, cmd); err != nil {
			return nil, fmt.Errorf("installing packages into %s: %w", r.Name, err)
		}
	}

	step(3, "configuring")
	for _, s := range r.Steps {
		if err := chroot(ctx, out, rootfs, s); err != nil {
			return nil, fmt.Errorf("running build step %q: %w", s, err)
		}
	}
	t := &Template{Name: r.Name, Hash: hash, Defaults: r.Defaults, Warm: r.Warm}
	b, _ := json.MarshalIndent(t, "", "  ")
	if err := os.WriteFile(filepath.Join(work, manifestName), b, 0o644); err != nil {
		return nil, fmt.Errorf("writing template manifest: %w", err)
	}
	if err := os.RemoveAll(final); err != nil {
		return nil, fmt.Errorf("removing previous build: %w", err)
	}
	if err := os.Rename(work, final); err != nil {
		return nil, fmt.Errorf("publishing build: %w", err)
	}
	if err := setCurrent(tdir, hash); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "template %s: built %s in %s\n", r.Name, hash, time.Since(start).Round(time.Second))
	t.Dir = final
	t.Rootfs = filepath.Join(final, "rootfs")
	return t, nil
}

// setCurrent atomically points tdir/current at the build hash.
func setCurrent(tdir, hash string) error {
	link := filepath.Join(tdir, "current")
	if cur, err := os.Readlink(link); err == nil && cur == hash {
		return nil
	}
	tmp := link + ".new"
	_ = os.Remove(tmp)
	if err := os.Symlink(hash, tmp); err != nil {
		return fmt.Errorf("linking current build: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		return fmt.Errorf("switching current build: %w", err)
	}
	return nil
}

// chroot runs a shell command inside rootfs with /proc mounted.
func chroot(ctx context.Context, out io.Writer, rootfs, script string) error {
	proc := filepath.Join(rootfs, "proc")
	if err := run(ctx, out, "mount", "-t", "proc", "proc", proc); err != nil {
		return err
	}
	defer exec.Command("umount", "-l", proc).Run()
	return run(ctx, out, "chroot", rootfs, "/bin/sh", "-ec", script)
}

func run(ctx context.Context, out io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
