package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/layer"
	"golang.org/x/sys/unix"
)

// A Debian base is the bottom layer of the built-in templates: debootstrap
// makes a minimal Debian from the host's mirror into a new layer, apt-get
// (in a chroot of it, on the host's network) adds the packages, and apt's
// caches and the packages' docs are removed. It is cached like any layer,
// keyed by the suite, variant and package lists (debianVersion changes
// when this procedure does). Only a builder with a DebianMirror (a local
// build of the built-ins) makes one: debootstrap and the packages'
// maintainer scripts run as root on the host.

const debianVersion = "1"

// debianKey is the layer key of a Debian base on parent ("": none).
func debianKey(parent string, d *api.DebianBase) string {
	if parent == "" {
		parent = "debian"
	}
	args := append([]string{debianVersion, d.Suite, d.Variant}, d.Include...)
	args = append(append(args, "--"), d.Packages...)
	return layer.Key(parent, api.TemplateStep{Type: "DEBIAN", Args: args})
}

func (r *run) fromDebian(ctx context.Context) error {
	d := r.spec.From.Debian
	what := fmt.Sprintf("[base] Debian %s (%s, %d packages)", d.Suite, d.Variant, len(d.Include)+len(d.Packages))
	parent := ""
	if d.Template != "" {
		t, err := r.b.cfg.Catalog.Resolve(ctx, r.rec.Owner, d.Template)
		if err != nil {
			return fmt.Errorf("template %s: %w", d.Template, err)
		}
		if t.Build != "" || len(t.Layers) == 0 {
			return fmt.Errorf("from.debian.template %s: want a built-in template made of layers: %w", d.Template, errdefs.ErrInvalidArgument)
		}
		r.pushBuiltin(t)
		parent = r.parent()
		what = fmt.Sprintf("[base] Debian packages on %s (%d packages)", d.Template, len(d.Packages))
	}
	key := debianKey(parent, d)
	ok, err := r.cached(key, what)
	r.hit = false // a base is no step of the recipe's
	if err != nil {
		return r.hide("reading the layer store", err)
	}
	if !ok {
		r.logf(levelInfo, "%s", what)
		t0 := time.Now()
		l, err := r.bootstrap(ctx, d, key)
		if err != nil {
			return err
		}
		r.push(l, key, l.Dir())
		r.logEvent(api.LogDone, levelInfo, "[base] done in %s", since(t0))
	}
	// Steps run as root in /; the recipe's USER, WORKDIR and ENV steps
	// make the template's defaults.
	r.setBase(template.Config{Defaults: template.Defaults{User: "root", Workdir: "/"}})
	return nil
}

// bootstrap makes the Debian base's layer and publishes it under key:
// debootstrap and apt-get into a new layer, or, on a built-in's layers
// (the stack so far), apt-get in a host overlay of them whose upper dir
// is then captured as the layer.
func (r *run) bootstrap(ctx context.Context, d *api.DebianBase, key string) (*layer.Layer, error) {
	p, err := r.b.cfg.Layers.Create()
	if err != nil {
		return nil, r.hide("making a layer", err)
	}
	root := p.Dir()
	var scratch string // the overlay's dirs, on a built-in's layers
	if d.Template != "" {
		scratch = filepath.Join(r.b.buildDir(r.rec.ID), "debian")
		root = filepath.Join(scratch, "root")
	}
	out := r.outputWriter()
	defer out.Close()
	// debootstrap mounts /proc and /sys in the new root while it works:
	// an interrupted one leaves them, as an interrupted overlay its mount.
	unmount := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if uerr := rootfs.Unmount(uctx, root); uerr != nil {
			r.b.log.Warn("unmounting an interrupted Debian base", "build", r.rec.ID, "err", uerr)
		}
	}
	if scratch != "" {
		defer os.RemoveAll(scratch)
	}
	fail := func(what string, err error) (*layer.Layer, error) {
		unmount()
		_ = p.Discard()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &stepError{msg: what + ": " + err.Error(), class: errdefs.ErrFailedPrecondition, tail: r.tail.String()}
	}
	r.tail.reset()
	binds, err := r.packageCache()
	if err != nil {
		return fail("making the package cache", err)
	}
	if scratch != "" {
		if err := overlay(r.dirs, scratch); err != nil {
			return fail("mounting the template's layers", err)
		}
	} else if err := r.debootstrap(ctx, out, d, root, binds); err != nil {
		return fail("debootstrap", err)
	}
	script := "rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*"
	if len(d.Packages) > 0 {
		script = "apt-get update -q && apt-get install -y -q --no-install-recommends " + strings.Join(d.Packages, " ") + " && " + script
	}
	if len(binds) == 0 {
		script += " && apt-get clean"
	}
	if err := chroot(ctx, out, root, script, binds); err != nil {
		return fail("installing packages", err)
	}
	if scratch != "" {
		unmount()
		if err := layer.Capture(ctx, p.Dir(), filepath.Join(scratch, "upper"), layer.CaptureParams{
			Exclude: append(slices.Clone(captureExclude), "/var/cache/apt/archives/*"), Limit: r.b.cfg.MaxLayerBytes, Log: r.b.log}); err != nil {
			return fail("capturing the packages", err)
		}
	}
	_ = os.RemoveAll(filepath.Join(p.Dir(), "var/cache/apt/archives/partial"))
	_ = os.Remove(filepath.Join(p.Dir(), "var/cache/apt/archives/lock"))
	l, err := p.Publish(ctx, key)
	if err != nil {
		_ = p.Discard()
		return nil, r.hide("storing the layer", err)
	}
	return l, nil
}

// packageCache is where the packages Debian bases download are kept, if
// the builder has a cache: bound at apt's archives in the new root (and
// given to debootstrap).
func (r *run) packageCache() (map[string]string, error) {
	c := r.b.cfg.DebianCache
	if c == "" {
		return nil, nil
	}
	for _, dir := range []string{filepath.Join(c, "debootstrap"), filepath.Join(c, "archives", "partial")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
	}
	return map[string]string{filepath.Join(c, "archives"): "/var/cache/apt/archives"}, nil
}

// debootstrap makes a minimal Debian in root.
func (r *run) debootstrap(ctx context.Context, out io.Writer, d *api.DebianBase, root string, cache map[string]string) error {
	args := []string{"--variant=" + d.Variant}
	if len(d.Include) > 0 {
		args = append(args, "--include="+strings.Join(d.Include, ","))
	}
	if c := r.b.cfg.DebianCache; c != "" && cache != nil {
		args = append(args, "--cache-dir="+filepath.Join(c, "debootstrap"))
	}
	args = append(args, d.Suite, root, r.b.cfg.DebianMirror)
	return hostRun(ctx, out, "debootstrap", args...)
}

// overlay mounts the layer dirs (bottom first) at scratch/root, read-write
// into scratch/upper.
func overlay(layers []string, scratch string) error {
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.MkdirAll(filepath.Join(scratch, d), 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", template.Lower(layers),
		filepath.Join(scratch, "upper"), filepath.Join(scratch, "work"))
	if err := unix.Mount("overlay", filepath.Join(scratch, "root"), "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting overlay: %w", err)
	}
	return nil
}

// outputWriter is a writer whose lines go to the build log as the
// current step's output (and to the tail of a failure's reason).
func (r *run) outputWriter() io.WriteCloser {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var lines lineSplitter
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			lines.write(buf[:n], r.output)
			if err != nil {
				lines.flush(r.output)
				return
			}
		}
	}()
	return &logWriter{pw: pw, done: done}
}

type logWriter struct {
	pw   *io.PipeWriter
	done chan struct{}
}

func (w *logWriter) Write(p []byte) (int, error) { return w.pw.Write(p) }
func (w *logWriter) Close() error {
	err := w.pw.Close()
	<-w.done
	return err
}

// chroot runs a shell script inside root with /proc mounted, and each
// host dir of binds bound at its path in root.
func chroot(ctx context.Context, out io.Writer, root, script string, binds map[string]string) error {
	proc := filepath.Join(root, "proc")
	if err := hostRun(ctx, out, "mount", "-t", "proc", "proc", proc); err != nil {
		return err
	}
	defer exec.Command("umount", "-l", proc).Run()
	for host, in := range binds {
		at := filepath.Join(root, in)
		if err := os.MkdirAll(at, 0o755); err != nil {
			return err
		}
		if err := hostRun(ctx, out, "mount", "--bind", host, at); err != nil {
			return err
		}
		defer exec.Command("umount", "-l", at).Run()
	}
	return hostRun(ctx, out, "chroot", root, "/bin/sh", "-ec", script)
}

// hostRun runs a program on the host, its output to out.
func hostRun(ctx context.Context, out io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	// Cancelling kills the whole process group: debootstrap's and apt's
	// children (dpkg, maintainer scripts) too, not only the top process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("%s exited with status %d", name, ee.ExitCode())
		}
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
