package builder

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/image"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// builtinPrefix starts the keys of a built-in template's layers in a
// recipe built on it: "builtin:<name>:<hash>:<i>", its layer i, bottom
// first (or "builtin:<name>:<hash>", the one rootfs dir of a built-in made
// before the built-ins were layered). They are not in the server's layer
// store: the built-in's manifest names their dirs.
const builtinPrefix = "builtin:"

// base puts the recipe's base on the stack: a template's layers and
// config, or an image's layers, provisioned.
func (r *run) base(ctx context.Context) error {
	f := r.spec.From
	r.user = "root"
	if f.Template != "" {
		r.logf(levelInfo, "[base] FROM template %s", f.Template)
		return r.fromTemplate(ctx, f.Template)
	}
	if f.Debian != nil {
		return r.fromDebian(ctx)
	}
	return r.fromImage(ctx)
}

func (r *run) fromTemplate(ctx context.Context, ref string) error {
	t, err := r.b.cfg.Catalog.Resolve(ctx, r.rec.Owner, ref)
	if err != nil {
		return fmt.Errorf("template %s: %w", ref, err)
	}
	if t.Build == "" { // a built-in
		r.pushBuiltin(t)
		r.setBase(template.Config{Defaults: t.Defaults})
		return nil
	}
	rec, err := r.b.cfg.Records.GetBuild(ctx, t.Build)
	if err != nil {
		return fmt.Errorf("template %s: its build %s: %w", ref, t.Build, err)
	}
	if rec.Status != template.BuildReady || len(rec.Layers) == 0 {
		return fmt.Errorf("template %s: its build %s is not ready: %w", ref, t.Build, errdefs.ErrFailedPrecondition)
	}
	for _, k := range rec.Layers {
		if name, ok := strings.CutPrefix(k, builtinPrefix); ok {
			dir, err := builtinDir(r.b.cfg.Catalog.DataDir, name)
			if err != nil {
				return fmt.Errorf("template %s: %w", ref, err)
			}
			r.push(nil, k, dir)
			continue
		}
		l, err := r.b.cfg.Layers.Acquire(k)
		if err != nil {
			return r.hide(fmt.Sprintf("template %s: layer %.12s", ref, k), err)
		}
		r.push(l, k, l.Dir())
	}
	r.setBase(rec.Config)
	return nil
}

// pushBuiltin puts a built-in template's layers on the stack.
func (r *run) pushBuiltin(t *template.Template) {
	if len(t.Layers) == 0 {
		r.push(nil, builtinPrefix+t.Name+":"+t.Hash, t.Rootfs)
	}
	for i, dir := range t.Layers {
		r.push(nil, fmt.Sprintf("%s%s:%s:%d", builtinPrefix, t.Name, t.Hash, i), dir)
	}
}

// builtinDir is the dir, under dataDir, of a built-in template's layer
// "<name>:<hash>:<i>" (or the rootfs of an unlayered built-in
// "<name>:<hash>").
func builtinDir(dataDir, key string) (string, error) {
	parts := strings.Split(key, ":")
	malformed := fmt.Errorf("malformed built-in layer %q: %w", errdefs.ClipN(key, 80), errdefs.ErrInvalidArgument)
	if len(parts) < 2 || len(parts) > 3 || !template.ValidName(parts[0]) || !hexRE.MatchString(parts[1]) {
		return "", malformed
	}
	name, hash := parts[0], parts[1]
	gone := fmt.Errorf("the build %s of built-in template %s is gone (rebuild on the current one): %w", hash, name, errdefs.ErrFailedPrecondition)
	dir := filepath.Join(template.Dir(dataDir), name, hash)
	if len(parts) == 2 {
		dir = filepath.Join(dir, "rootfs")
	} else {
		i, err := strconv.Atoi(parts[2])
		if err != nil || i < 0 {
			return "", malformed
		}
		t, err := template.ReadBuild(dir)
		if err != nil || i >= len(t.Layers) {
			return "", gone
		}
		dir = t.Layers[i]
	}
	if _, err := os.Stat(dir); err != nil {
		return "", gone
	}
	return dir, nil
}

var hexRE = regexp.MustCompile(`^[0-9a-f]{1,64}$`)

// setBase takes the base's config: its defaults and start command.
func (r *run) setBase(c template.Config) {
	r.cfg = c
	r.cfg.Env = maps.Clone(c.Env)
	if r.cfg.Env == nil {
		r.cfg.Env = map[string]string{}
	}
	if r.spec.StartCmd != "" {
		r.cfg.StartCmd, r.cfg.ReadyCmd = r.spec.StartCmd, r.spec.ReadyCmd
	}
	// The recipe's resources, else the base's.
	if r.spec.CPUs > 0 {
		r.cfg.CPUs = float64(r.spec.CPUs)
	}
	if r.spec.MemoryMB > 0 {
		r.cfg.MemoryBytes = int64(r.spec.MemoryMB) << 20
	}
	if r.spec.DiskMB > 0 {
		r.cfg.DiskBytes = int64(r.spec.DiskMB) << 20
	}
	if r.cfg.StartCmd != "" && r.cfg.ReadyCmd == "" {
		r.cfg.ReadyCmd = DefaultReadyCmd
	}
	r.workdir = r.cfg.Workdir
	if r.workdir == "" {
		r.workdir = "/"
	}
}

// DefaultReadyCmd is the ready command of a template with a start command
// and none of its own: a fixed wait, as E2B's.
const DefaultReadyCmd = "sleep 20"

func (r *run) fromImage(ctx context.Context) error {
	f := r.spec.From
	var img *image.Image
	var err error
	if f.Image != "" {
		r.logf(levelInfo, "[base] FROM image %s", f.Image)
		img, err = image.Pull(ctx, f.Image, f.Registry, r.b.cfg.Registries)
	} else {
		r.logf(levelInfo, "[base] FROM image archive %.12s", f.Archive)
		p := r.b.filesPath(r.rec.Owner, f.Archive)
		if _, serr := os.Stat(p); serr != nil {
			return fmt.Errorf("image archive %.12s was not uploaded: %w", f.Archive, errdefs.ErrInvalidArgument)
		}
		img, err = image.Load(ctx, p, "archive "+f.Archive[:12], r.b.cfg.MaxLayerBytes)
	}
	if err != nil {
		return err
	}
	defer img.Close()
	layers := img.Layers()
	for i, il := range layers {
		if l, err := r.b.cfg.Layers.Acquire(il.Key); err == nil {
			r.push(l, il.Key, l.Dir())
			r.logf(levelInfo, "[base] layer %d/%d %.12s CACHED", i+1, len(layers), il.Key)
			continue
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			return r.hide("reading the layer store", err)
		}
		r.logf(levelInfo, "[base] layer %d/%d %.12s: unpacking", i+1, len(layers), il.Key)
		l, err := r.b.unpack(ctx, il, il.Key)
		var se *storeError
		if errors.As(err, &se) {
			return r.hide(se.what, se.err)
		}
		if err != nil {
			return err
		}
		r.push(l, il.Key, l.Dir())
	}
	if len(layers) == 0 {
		return fmt.Errorf("image %s has no layers: %w", img.Ref(), errdefs.ErrInvalidArgument)
	}
	c := img.Config()
	env := map[string]string{}
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	// Sandboxes run as user in its home, whatever the image says, unless
	// the recipe says otherwise; steps run as root in the image's workdir.
	r.setBase(template.Config{Defaults: template.Defaults{User: "user", Workdir: c.Workdir, Env: env}})
	if c.Workdir == "" {
		r.cfg.Workdir = "/home/user"
	}
	return r.runCmd(ctx, "[base] provisioning the image (user, sudo, /tmp)",
		api.TemplateStep{Type: api.StepRun, Args: []string{provisionScript}}, "root")
}

// unpack stores an image layer in the layer store under key (its diffID
// for a base image's layer, the build's own key for a layer of a build
// pulled from the cluster registry) and leases it. The layer store's own
// failures are storeErrors; the image's (a download, a malformed tar,
// over the layer limit) are not.
func (b *Builder) unpack(ctx context.Context, il image.Layer, key string) (*layer.Layer, error) {
	p, err := b.cfg.Layers.Create()
	if err != nil {
		return nil, &storeError{"making a layer", err}
	}
	if _, err := il.Unpack(ctx, p.Dir(), image.UnpackOptions{MaxBytes: b.cfg.MaxLayerBytes, Log: b.log}); err != nil {
		_ = p.Discard()
		return nil, err
	}
	l, err := p.Publish(ctx, key)
	if err != nil {
		_ = p.Discard()
		return nil, &storeError{"storing the layer", err}
	}
	return l, nil
}

// storeError is a failure of the layer store: what was being done.
type storeError struct {
	what string
	err  error
}

func (e *storeError) Error() string { return e.what + ": " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

// provisionScript gives an image what Kiln's sandboxes expect, with the
// tools any image has (POSIX sh; useradd, busybox adduser, or the account
// files themselves): uid 1000 "user" with home /home/user, passwordless
// sudo when sudo is installed, a world-writable /tmp.
const provisionScript = `set -e
if ! grep -q '^user:' /etc/passwd; then
  if command -v useradd >/dev/null 2>&1; then
    useradd -m -d /home/user -u 1000 -U -s /bin/sh user 2>/dev/null || useradd -m -d /home/user -u 1000 -s /bin/sh user
  elif command -v adduser >/dev/null 2>&1; then
    adduser -D -h /home/user -u 1000 -s /bin/sh user
  else
    grep -q '^user:' /etc/group || echo 'user:x:1000:' >>/etc/group
    echo 'user:x:1000:1000::/home/user:/bin/sh' >>/etc/passwd
  fi
fi
mkdir -p /home/user /.kiln /tmp
chown "$(id -u user):$(id -g user)" /home/user
chmod 1777 /tmp
if command -v sudo >/dev/null 2>&1; then
  mkdir -p /etc/sudoers.d
  echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' >/etc/sudoers.d/kiln-user
  chmod 0440 /etc/sudoers.d/kiln-user
fi
`
