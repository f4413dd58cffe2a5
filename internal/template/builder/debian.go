package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/rootfs"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/layer"
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

// debianKey is the layer key of a Debian base.
func debianKey(d *api.DebianBase) string {
	args := append([]string{debianVersion, d.Suite, d.Variant}, d.Include...)
	args = append(append(args, "--"), d.Packages...)
	return layer.Key("debian", api.TemplateStep{Type: "DEBIAN", Args: args})
}

func (r *run) fromDebian(ctx context.Context) error {
	d := r.spec.From.Debian
	what := fmt.Sprintf("[base] Debian %s (%s, %d packages)", d.Suite, d.Variant, len(d.Include)+len(d.Packages))
	key := debianKey(d)
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

// bootstrap makes the Debian base's layer and publishes it under key.
func (r *run) bootstrap(ctx context.Context, d *api.DebianBase, key string) (*layer.Layer, error) {
	p, err := r.b.cfg.Layers.Create()
	if err != nil {
		return nil, r.hide("making a layer", err)
	}
	root := p.Dir()
	out := r.outputWriter()
	defer out.Close()
	fail := func(what string, err error) (*layer.Layer, error) {
		// debootstrap mounts /proc and /sys in the new root while it
		// works: an interrupted one leaves them.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if uerr := rootfs.Unmount(uctx, root); uerr != nil {
			r.b.log.Warn("unmounting an interrupted Debian base", "build", r.rec.ID, "err", uerr)
		}
		_ = p.Discard()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &stepError{msg: what + ": " + err.Error(), class: errdefs.ErrFailedPrecondition, tail: r.tail.String()}
	}
	r.tail.reset()
	args := []string{"--variant=" + d.Variant}
	if len(d.Include) > 0 {
		args = append(args, "--include="+strings.Join(d.Include, ","))
	}
	// The packages debootstrap and apt-get download are kept in the
	// cache, if there is one, for the next Debian base.
	binds := map[string]string{}
	if c := r.b.cfg.DebianCache; c != "" {
		dc, ac := filepath.Join(c, "debootstrap"), filepath.Join(c, "archives")
		for _, dir := range []string{dc, filepath.Join(ac, "partial")} {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fail("making the package cache", err)
			}
		}
		args = append(args, "--cache-dir="+dc)
		binds[ac] = "/var/cache/apt/archives"
	}
	args = append(args, d.Suite, root, r.b.cfg.DebianMirror)
	if err := hostRun(ctx, out, "debootstrap", args...); err != nil {
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
	_ = os.RemoveAll(filepath.Join(root, "var/cache/apt/archives/partial"))
	_ = os.Remove(filepath.Join(root, "var/cache/apt/archives/lock"))
	l, err := p.Publish(ctx, key)
	if err != nil {
		_ = p.Discard()
		return nil, r.hide("storing the layer", err)
	}
	return l, nil
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
		emit := func(s string) {
			r.tail.add(s)
			r.output(s)
		}
		for {
			n, err := pr.Read(buf)
			lines.write(buf[:n], emit)
			if err != nil {
				lines.flush(emit)
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
