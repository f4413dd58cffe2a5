package builder

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
)

// Start validates a recipe, records a build of owner's template ref
// ("name[:tag]") as building and runs it in the background, bounded by the
// build timeout and ended by Close. It returns at once. public marks the
// template usable by every key once the build is ready (a template that
// is public stays public).
func (b *Builder) Start(ctx context.Context, owner, ref string, spec api.TemplateSpec, public bool) (template.BuildRecord, error) {
	name, tag, err := template.ParseRef(ref)
	if err != nil {
		return template.BuildRecord{}, err
	}
	if err := validate(&spec); err != nil {
		return template.BuildRecord{}, err
	}
	rec := template.BuildRecord{ID: newBuildID(), Template: name, Owner: owner, Step: -1, Node: b.cfg.Node, CreatedAt: time.Now().UTC()}
	return b.launch(ctx, rec, []string{tag}, spec, public)
}

// launch records rec (a new build, or a waiting one) as building with
// spec and runs it in the background; once it is ready, tags point at it.
// spec has been validated.
func (b *Builder) launch(ctx context.Context, rec template.BuildRecord, tags []string, spec api.TemplateSpec, public bool) (template.BuildRecord, error) {
	if spec.From.Debian != nil && b.cfg.DebianMirror == "" {
		return template.BuildRecord{}, fmt.Errorf("from.debian: only kiln's built-in templates are bootstrapped from Debian, by a local build "+
			"(kiln template build); start from a template (e.g. base) or an image: %w", errdefs.ErrInvalidArgument)
	}
	id, owner := rec.ID, rec.Owner
	// A waiting build (reserved) starts now, here: it was reserved on
	// whichever node a cluster's front sent the reservation to.
	rec.Status, rec.Spec, rec.StartedAt, rec.Node = template.BuildBuilding, spec, time.Now().UTC(), b.cfg.Node
	rec.Spec.From.Registry = nil // credentials are never stored
	if cur, err := b.cfg.Records.ListTags(ctx, owner, rec.Template); err == nil && len(cur) > 0 && cur[0].Public {
		public = true
	}
	dir := b.buildDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return template.BuildRecord{}, fmt.Errorf("creating build dir: %w", err)
	}
	bl := &build{owner: owner, done: make(chan struct{})}
	var err error
	if bl.log, err = openLog(dir); err != nil {
		_ = os.RemoveAll(dir)
		return template.BuildRecord{}, err
	}
	if err := b.admit(id, bl); err != nil {
		bl.log.end()
		_ = os.RemoveAll(dir)
		return template.BuildRecord{}, err
	}
	if err := b.cfg.Records.PutBuild(ctx, rec); err != nil {
		b.forget(id)
		bl.log.end()
		_ = os.RemoveAll(dir)
		return template.BuildRecord{}, fmt.Errorf("recording build: %w", err)
	}
	r := &run{b: b, rec: rec, tags: tags, spec: spec, public: public, log: bl.log}
	bctx, cancel := context.WithTimeout(b.ctx, b.cfg.BuildTimeout)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer cancel()
		r.run(bctx)
		b.forget(id)
		close(bl.done)
	}()
	return rec, nil
}

// admit adds a build to the running ones unless that would exceed the
// limits, or the Builder is closed.
func (b *Builder) admit(id string, bl *build) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ctx.Err() != nil {
		return fmt.Errorf("the template builder is shutting down: %w", errdefs.ErrUnavailable)
	}
	if b.active[id] != nil {
		return fmt.Errorf("build %s has already started: %w", id, errdefs.ErrFailedPrecondition)
	}
	mine := 0
	for _, o := range b.active {
		if o.owner == bl.owner {
			mine++
		}
	}
	if mine >= b.cfg.MaxPerOwner {
		return fmt.Errorf("%d template builds are running for this key, the most allowed: %w", mine, errdefs.ErrResourceExhausted)
	}
	if len(b.active) >= b.cfg.MaxConcurrent {
		return fmt.Errorf("%d template builds are running, the most this server allows: %w", len(b.active), errdefs.ErrResourceExhausted)
	}
	b.active[id] = bl
	return nil
}

func (b *Builder) forget(id string) {
	b.mu.Lock()
	delete(b.active, id)
	b.mu.Unlock()
}

func (b *Builder) buildDir(id string) string { return template.BuildDir(b.cfg.DataDir, id) }

// filesPath is where owner's uploaded file hash is kept.
func (b *Builder) filesPath(owner, hash string) string {
	if owner == "" {
		owner = "_local"
	}
	return filepath.Join(b.cfg.DataDir, "files", owner, hash)
}

// FilesPath is where an upload of owner's (a COPY step's sources, or an
// image archive) named by its hash is to be stored for builds to find.
func (b *Builder) FilesPath(owner, hash string) (string, error) {
	if !filesHashRE.MatchString(hash) {
		return "", fmt.Errorf("files hash: want 64 hex digits: %w", errdefs.ErrInvalidArgument)
	}
	return b.filesPath(owner, hash), nil
}

// newBuildID returns a random build id: 'b' and 24 base-32 digits.
func newBuildID() string {
	const digits = "abcdefghijklmnopqrstuvwxyz234567"
	var raw [24]byte
	_, _ = rand.Read(raw[:])
	id := []byte{'b'}
	for _, c := range raw {
		id = append(id, digits[c&31])
	}
	return string(id)
}
