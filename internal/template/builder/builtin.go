package builder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kiln-sh/kiln/internal/template"
)

// Built-in templates are built by this engine like any recipe, by a local
// builder: its layer store is template.BuiltinLayers, its records and
// build dirs are its own (scratch), and its DebianMirror lets recipes start
// from Debian. The finished build is published as the built-in's current
// build (template.PublishBuiltin), its manifest naming the layers, which
// GC then keeps.

// BuildBuiltin builds the built-in recipe rc (every step again when
// force), sending the build's log entries to emit as they are written,
// and makes the result the built-in's current build. A build whose layers
// and defaults are those of a published build (every step CACHED) finds
// that build again, with its warm checkpoints.
func (b *Builder) BuildBuiltin(ctx context.Context, rc *template.Recipe, force bool, emit func(LogEntry)) (t *template.Template, existed bool, err error) {
	spec := rc.Spec
	spec.NoCache = force
	rec, err := b.Start(ctx, "", rc.Name, spec, false)
	if err != nil {
		return nil, false, err
	}
	dir := b.buildDir(rec.ID)
	defer os.RemoveAll(dir) // a local build's record and log are scratch
	lerr := b.Logs(ctx, rec.ID, 0, true, func(e LogEntry) error {
		if emit != nil {
			emit(e)
		}
		return nil
	})
	rec, err = b.Wait(ctx, rec.ID)
	if err != nil {
		return nil, false, errors.Join(err, lerr)
	}
	if rec.Status != template.BuildReady {
		return nil, false, fmt.Errorf("building template %s: %s", rc.Name, rec.Reason)
	}
	built, err := template.ReadBuild(dir)
	if err != nil {
		return nil, false, err
	}
	t = &template.Template{Name: rc.Name, Hash: template.BuiltinHash(rec.Layers, built.Defaults),
		Layers: built.Layers, Defaults: built.Defaults, Warm: rc.Warm}
	existed, err = template.PublishBuiltin(b.cfg.Catalog.DataDir, t)
	if err != nil {
		return nil, false, err
	}
	t, err = template.Lookup(b.cfg.Catalog.DataDir, rc.Name)
	return t, existed, err
}

// keepBuiltins adds to keep the layers the built-in templates' builds
// name (a server's layer store has none of them; a local builder's has
// nothing else).
func (b *Builder) keepBuiltins(keep map[string]bool) error {
	manifests, err := filepath.Glob(filepath.Join(template.Dir(b.cfg.Catalog.DataDir), "*", "*", "template.json"))
	if err != nil {
		return fmt.Errorf("listing built-in templates: %w", err)
	}
	for _, m := range manifests {
		t, err := template.ReadBuild(filepath.Dir(m))
		if err != nil {
			return fmt.Errorf("reading built-in template %s: %w", m, err)
		}
		for _, dir := range t.Layers {
			keep[layerKeyOf(dir)] = true
		}
	}
	return nil
}
