package builder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/image"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// Templates across a cluster's nodes (docs/cluster.md). A node with a
// cluster registry pushes each custom build there before it marks it
// ready, and records the image in the build's record; a node asked for a
// build whose files it does not hold pulls that image (Fetch) and lays
// the build out as the building node did: the same layers under the
// same keys in its layer store, the same manifest.
//
// A build on a built-in template (base, code-interpreter, desktop) pushes only its
// own layers: the built-in's (hundreds of MB of Debian) are named in the
// manifest's annotations and in the record's layer keys
// ("builtin:<name>:<hash>:<i>"), and every node builds its built-ins
// itself, so a pulling node checks it holds that exact build of the
// built-in.

// Annotations of a build's image in the cluster registry.
const (
	// AnnotationBuild is the build's id.
	AnnotationBuild = "sh.kiln.build"
	// AnnotationBuiltin names the built-in template build the image's
	// layers go on, "<name>:<hash>" ("" or absent: none, the image is
	// whole).
	AnnotationBuiltin = "sh.kiln.builtin"
)

// repoPartRE is what a repository path component may be (OCI
// distribution's grammar).
var repoPartRE = regexp.MustCompile(`^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$`)

// repoPart turns s (an API key's id, a template name) into a repository
// path component: lowercase, runs of other characters as one '-'.
func repoPart(s string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(s) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	p := strings.TrimRight(b.String(), "-")
	if !repoPartRE.MatchString(p) {
		return "x"
	}
	return p
}

// clusterRef is where build rec goes in the cluster registry:
// REGISTRY/<owner>/<template>:<build id>. The build id is unique, so two
// owners' templates of one name never share a tag.
func (b *Builder) clusterRef(rec template.BuildRecord) string {
	owner := rec.Owner
	if owner == "" {
		owner = "local"
	}
	return b.cfg.ClusterRegistry + "/" + repoPart(owner) + "/" + repoPart(rec.Template) + ":" + rec.ID
}

// pushToCluster pushes the finished build rec (its layers and config
// set) to the cluster registry and returns the image's reference by
// digest. A failed push fails the build: a ready build of a node with a
// cluster registry is always usable on every node.
func (r *run) pushToCluster(ctx context.Context, rec template.BuildRecord) (string, error) {
	ref := r.b.clusterRef(rec)
	var dirs []string
	builtin := ""
	for i, k := range rec.Layers {
		name, ok := strings.CutPrefix(k, builtinPrefix)
		if !ok {
			dirs = append(dirs, r.dirs[i])
			continue
		}
		parts := strings.Split(name, ":")
		if base := parts[0] + ":" + parts[min(1, len(parts)-1)]; builtin == "" {
			builtin = base
		} else if base != builtin {
			return "", fmt.Errorf("the build stacks two built-in templates (%s, %s): %w", builtin, base, errdefs.ErrFailedPrecondition)
		}
	}
	c := imageConfig(rec.Config.Defaults, rec.Config.StartCmd)
	c.Annotations = map[string]string{AnnotationBuild: rec.ID}
	if builtin != "" {
		c.Annotations[AnnotationBuiltin] = builtin
	}
	n := fmt.Sprintf("%d layers", len(dirs))
	if len(dirs) == 1 {
		n = "1 layer"
	}
	if builtin != "" {
		r.logf(levelInfo, "[finalize] pushing %s to the cluster registry: %s (on built-in %s, which every node holds)", n, ref, builtin)
	} else {
		r.logf(levelInfo, "[finalize] pushing %s to the cluster registry: %s", n, ref)
	}
	t0 := time.Now()
	digest, err := image.Push(ctx, ref, dirs, c, r.b.cfg.ClusterAuth, nil)
	if err != nil {
		return "", fmt.Errorf("pushing the build to the cluster registry: %w", err)
	}
	r.logf(levelInfo, "[finalize] pushed %s in %s", digest, since(t0))
	r.b.log.Info("build pushed to the cluster registry", "build", rec.ID, "image", ref, "digest", digest, "layers", len(dirs), "took", time.Since(t0))
	return ref + "@" + digest, nil
}

// Fetch makes build rec, whose files this node does not hold, usable
// here from its image in the cluster registry (rec.Image): it pulls the
// layers its layer store lacks, stores them under the build's own layer
// keys, and writes the build's manifest with the record's config, so the
// build is laid out as on the node that made it (and a build there with
// the same steps finds them cached). One pull runs per build: concurrent
// callers wait for it, each as long as its ctx allows; the pull itself
// is bounded by the build timeout and ended by Close. The files stay: a
// restart finds them, later creates are local. A template with a start
// command has no warm checkpoint here yet: one is taken in the
// background (runsc), and its sandboxes boot cold meanwhile.
func (b *Builder) Fetch(ctx context.Context, rec template.BuildRecord) (*template.Template, error) {
	if rec.Image == "" || rec.Status != template.BuildReady {
		return nil, fmt.Errorf("template build %s is on node %s only (it has no image in the cluster registry): %w",
			rec.ID, rec.Node, errdefs.ErrNotFound)
	}
	b.mu.Lock()
	p := b.pulls[rec.ID]
	if p == nil {
		if b.ctx.Err() != nil {
			b.mu.Unlock()
			return nil, fmt.Errorf("the template builder is shutting down: %w", errdefs.ErrUnavailable)
		}
		p = &pull{done: make(chan struct{})}
		b.pulls[rec.ID] = p
		pctx, cancel := context.WithTimeout(b.ctx, b.cfg.BuildTimeout)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			defer cancel()
			p.err = b.fetch(pctx, rec)
			b.mu.Lock()
			delete(b.pulls, rec.ID)
			b.mu.Unlock()
			close(p.done)
		}()
	}
	b.mu.Unlock()
	select {
	case <-p.done:
		if p.err != nil {
			return nil, p.err
		}
		return b.cfg.Catalog.Build(rec.ID) // each caller its own copy
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for template build %s to be pulled from the cluster registry: %w", rec.ID, ctx.Err())
	}
}

// unavailable is what a failure to pull build rec (doing what) tells the
// client: that this node cannot have the template now (503: a front
// tries another node), not the registry's address or the host's paths,
// which go to the log.
func unavailable(ctx context.Context, log *slog.Logger, rec template.BuildRecord, what string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s template build %s from the cluster registry: %w", what, rec.ID, ctx.Err())
	}
	log.Error("fetching a template build from the cluster registry", "doing", what, "err", err)
	return fmt.Errorf("template %s (build %s) cannot be had on this node now: %s it from the cluster registry failed "+
		"(the server's log has the details): %w", rec.Template, rec.ID, what, errdefs.ErrUnavailable)
}

// pull is a Fetch in progress.
type pull struct {
	done chan struct{} // closed when err is set
	err  error
}

// fetch lays build rec out here (Fetch).
func (b *Builder) fetch(ctx context.Context, rec template.BuildRecord) error {
	if _, err := b.cfg.Catalog.Build(rec.ID); err == nil {
		return nil // an earlier fetch finished
	}
	t0 := time.Now()
	log := b.log.With("build", rec.ID, "template", rec.Template, "image", rec.Image)
	dirs := make([]string, len(rec.Layers))
	var own, missing []int // indexes of the layers in the image; of those not here
	var leased []*layer.Layer
	defer func() {
		for _, l := range leased {
			_ = l.Release()
		}
	}()
	for i, k := range rec.Layers {
		if name, ok := strings.CutPrefix(k, builtinPrefix); ok {
			dir, err := builtinDir(b.cfg.DataDir, name)
			if err != nil {
				return fmt.Errorf("template %s (build %s) goes on built-in template build %s, which this node does not hold "+
					"(its built-in templates must be the same build as node %s's): %w", rec.Template, rec.ID, name, rec.Node, errdefs.ErrFailedPrecondition)
			}
			dirs[i] = dir
			continue
		}
		own = append(own, i)
		l, err := b.cfg.Layers.Acquire(k)
		switch {
		case err == nil:
			leased = append(leased, l)
			dirs[i] = l.Dir()
		case errors.Is(err, errdefs.ErrNotFound):
			missing = append(missing, i)
		default:
			return fmt.Errorf("reading the layer store: %w", err)
		}
	}
	if len(missing) > 0 {
		log.Info("pulling a template build from the cluster registry", "layers", len(missing))
		img, err := image.Pull(ctx, rec.Image, b.cfg.ClusterAuth, nil)
		if err != nil {
			return unavailable(ctx, log, rec, "pulling", err)
		}
		defer img.Close()
		ils := img.Layers()
		if len(ils) != len(own) {
			return fmt.Errorf("the cluster registry's image of build %s has %d layers, its record %d: %w", rec.ID, len(ils), len(own), errdefs.ErrFailedPrecondition)
		}
		for j, i := range own {
			if dirs[i] != "" {
				continue
			}
			l, err := b.unpack(ctx, ils[j], rec.Layers[i])
			if err != nil {
				return unavailable(ctx, log, rec, fmt.Sprintf("unpacking layer %d of", j+1), err)
			}
			leased = append(leased, l)
			dirs[i] = l.Dir()
		}
	}
	dir := b.buildDir(rec.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating build dir: %w", err)
	}
	if err := template.WriteManifest(dir, b.manifest(rec.Template, rec.ID, dirs, rec.Config)); err != nil {
		return err
	}
	t, err := b.cfg.Catalog.Build(rec.ID)
	if err != nil {
		return err
	}
	log.Info("template build fetched from the cluster registry", "layers", len(rec.Layers), "pulled", len(missing), "took", time.Since(t0))
	if t.Warm != nil && b.cfg.Images != nil && b.cfg.Images.CanWarm() {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			if _, err := b.cfg.Images.BuildWarmTemplate(b.ctx, t); err != nil && b.ctx.Err() == nil {
				log.Warn("taking the warm checkpoint of a pulled template build; its sandboxes boot cold", "err", err)
			}
		}()
	}
	return nil
}
