// Package builder is the template build engine: it turns a recipe
// (api.TemplateSpec: a base and E2B-shaped steps) into a build of a custom
// template, a stack of cached layers plus the defaults its sandboxes start
// with, and points the template's name and tag at it.
//
// A build runs in the background. Its base is a Kiln template (built-in or
// custom: its layers are reused) or an OCI image (pulled, its layers
// unpacked once and shared, then provisioned with the user sandboxes
// expect). Each step makes at most one layer, stored in the layer store
// under a key chained onto its parent's (layer.Key), so an unchanged step is
// found again ("CACHED") and a change rebuilds from that step on. COPY and
// ADD run on the host (layer.Copy); RUN runs in an ordinary sandbox made
// through the one bring-up pipeline, whose overlay upper dir is then
// captured as the step's layer. ENV, WORKDIR and USER change the build's
// config only.
//
// What a build did is in its log (BuildDir/build.log, NDJSON entries, read
// with Logs); its record (template.Store) says how it ended. A build that
// fails leaves nothing half-made: its layers not referenced by a finished
// build are collected, its build sandbox killed, and the name keeps
// pointing at its previous build.
package builder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/sandbox"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/image"
	"github.com/kiln-sh/kiln/internal/template/layer"
)

// Defaults of Config's limits.
const (
	DefaultBuildTimeout    = 30 * time.Minute
	DefaultMaxLayerBytes   = 10 << 30
	DefaultMaxContextBytes = 1 << 30
	DefaultMaxPerOwner     = 2
	DefaultMaxConcurrent   = 4
	DefaultReadyTimeout    = 10 * time.Minute
)

// MetaBuild is the metadata key of build sandboxes: its value is the id of
// the build the sandbox runs a step of.
const MetaBuild = "kiln.build"

// interrupted is the reason of builds a restart of kiln serve cut short.
const interrupted = "interrupted by a restart of kiln serve"

// Config configures a Builder.
type Config struct {
	// DataDir holds builds (template.BuildDir) and uploaded files
	// (files/<owner>/<filesHash>).
	DataDir string
	// Node names this kiln serve in build records (cluster nodes; "" on
	// one machine): fronts place a template's sandboxes where its files
	// are, and a restart fails only this node's interrupted builds.
	Node      string
	Records   template.Store
	Layers    *layer.Store
	Catalog   *template.Catalog
	Sandboxes *sandbox.Manager
	// Images takes the warm snapshot of a template with a start command
	// (runsc); nil, or a server without checkpoint/restore, builds such
	// templates without one.
	Images *sandbox.Images
	// Runtime runs build sandboxes ("": the Manager's default).
	Runtime string
	// Network is the network mode of build sandboxes ("": nat, so that
	// RUN steps reach package mirrors; "none" for builds that need none).
	Network string
	// BuildTimeout bounds a build (default DefaultBuildTimeout).
	BuildTimeout time.Duration
	// ReadyTimeout bounds the start and ready commands of a warm snapshot
	// (default DefaultReadyTimeout, E2B's).
	ReadyTimeout time.Duration
	// MaxLayerBytes bounds what one step (or image layer) may write;
	// MaxContextBytes the uploaded files one COPY/ADD step reads.
	MaxLayerBytes   int64
	MaxContextBytes int64
	// MaxPerOwner and MaxConcurrent bound the builds running at once, per
	// owner and in total; over them Start answers ErrResourceExhausted.
	MaxPerOwner   int
	MaxConcurrent int
	// Observer, if set, is told of each layer step and each build as they
	// end (the server's metrics).
	Observer Observer
	// Registries says which addresses image pulls may connect to (nil:
	// any; kiln serve uses image.ServerGuard).
	Registries image.Guard
	// ClusterRegistry, if set, is the cluster registry (host[:port] and a
	// repository prefix, config.Cluster.Registry): every custom build is
	// pushed there before it is marked ready, and Fetch pulls builds this
	// node does not hold (cluster.go). It is the operator's, so no guard
	// applies; ClusterAuth logs in to it (nil: anonymous).
	ClusterRegistry string
	ClusterAuth     *api.RegistryAuth
	// DebianMirror, if set, lets recipes start from a Debian base
	// bootstrapped on the host from this mirror: the built-in templates'
	// local builds (BuildBuiltin). A server leaves it empty and refuses
	// such recipes: debootstrap and apt run as root on the host.
	DebianMirror string
	// DebianCache, if set, is a host dir that keeps the packages Debian
	// bases download, for the next one.
	DebianCache string
	Log         *slog.Logger
}

// Observer is told what builds do.
type Observer interface {
	// StepDone: a RUN, COPY or ADD step made its layer, or found it in
	// the cache (cached).
	StepDone(cached bool)
	// BuildDone: a build ended with status (template.BuildReady or
	// BuildError) after d; err is why it failed (nil when ready).
	BuildDone(status string, d time.Duration, err error)
}

// Builder runs template builds.
type Builder struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context // cancelled by Close: ends every build
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	active map[string]*build // running builds by id
	pulls  map[string]*pull  // Fetches under way by build id

	// reserveMu serializes the changes of waiting builds' records
	// (reserve.go).
	reserveMu sync.Mutex
}

// build is a running build, as other calls see it.
type build struct {
	owner string
	log   *buildLog
	done  chan struct{} // closed when the build has ended and its record says how
}

// New starts a Builder. Builds its store still has waiting or building were
// cut short by a restart: they are marked failed, build sandboxes left over
// are killed, and layers no build references are collected.
func New(ctx context.Context, cfg Config) (*Builder, error) {
	if cfg.Records == nil || cfg.Layers == nil || cfg.Catalog == nil || cfg.DataDir == "" {
		return nil, errors.New("builder: DataDir, Records, Layers and Catalog are required")
	}
	if cfg.BuildTimeout <= 0 {
		cfg.BuildTimeout = DefaultBuildTimeout
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.MaxLayerBytes <= 0 {
		cfg.MaxLayerBytes = DefaultMaxLayerBytes
	}
	if cfg.MaxContextBytes <= 0 {
		cfg.MaxContextBytes = DefaultMaxContextBytes
	}
	if cfg.MaxPerOwner <= 0 {
		cfg.MaxPerOwner = DefaultMaxPerOwner
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.Network == "" {
		cfg.Network = sandbox.NetworkNAT
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	b := &Builder{cfg: cfg, log: cfg.Log.With("component", "builder"), active: map[string]*build{}, pulls: map[string]*pull{}}
	b.ctx, b.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := b.recover(ctx); err != nil {
		b.cancel()
		return nil, err
	}
	return b, nil
}

// recover fails the builds a restart interrupted and removes what they
// left: build sandboxes and unreferenced layers.
func (b *Builder) recover(ctx context.Context) error {
	stale, err := b.cfg.Records.BuildsIn(ctx, template.BuildWaiting, template.BuildBuilding)
	if err != nil {
		return fmt.Errorf("listing interrupted builds: %w", err)
	}
	for _, r := range stale {
		if r.Node != b.cfg.Node {
			continue // another cluster node's build, running there
		}
		r.Status, r.Reason, r.FinishedAt = template.BuildError, interrupted, time.Now().UTC()
		if err := b.cfg.Records.PutBuild(ctx, r); err != nil {
			return fmt.Errorf("failing interrupted build %s: %w", r.ID, err)
		}
		e := entry(levelError, -1, "build failed: "+interrupted)
		e.Event = api.LogError
		appendLog(template.BuildDir(b.cfg.DataDir, r.ID), e)
		b.log.Warn("build interrupted by a restart", "build", r.ID, "template", r.Template)
	}
	if b.cfg.Sandboxes != nil {
		b.killBuildSandboxes(ctx, "")
	}
	return b.GC(ctx)
}

// GC removes the layers that no build still waiting, building or ready
// references, no sandbox that has not ended (running or paused, whatever
// its build's record says now) uses, and no running build holds; and the
// build dirs of deleted builds no such sandbox uses.
func (b *Builder) GC(ctx context.Context) error {
	if err := b.collectBuildDirs(ctx); err != nil {
		return err
	}
	recs, err := b.cfg.Records.BuildsIn(ctx, template.BuildWaiting, template.BuildBuilding, template.BuildReady)
	if err != nil {
		return fmt.Errorf("listing builds for layer GC: %w", err)
	}
	keep := map[string]bool{}
	for _, r := range recs {
		for _, k := range r.Layers {
			keep[k] = true
		}
	}
	if err := b.keepPinned(ctx, keep); err != nil {
		return err
	}
	if err := b.keepBuiltins(keep); err != nil {
		return err
	}
	res, err := b.cfg.Layers.GC(ctx, func(k string) bool { return keep[k] })
	if err != nil {
		return fmt.Errorf("collecting layers: %w", err)
	}
	if res.Removed > 0 {
		b.log.Info("layers collected", "removed", res.Removed, "freed", res.Freed, "leased", res.Leased)
	}
	return nil
}

// keepPinned adds to keep the layers of the builds that sandboxes not
// ended started from (a build whose record is gone, or failed, still has
// sandboxes on it until they end).
func (b *Builder) keepPinned(ctx context.Context, keep map[string]bool) error {
	used, err := b.usedBuilds(ctx)
	if err != nil {
		return err
	}
	for id := range used {
		t, err := b.cfg.Catalog.Build(id)
		if err != nil {
			continue // its manifest is gone: nothing of it to keep
		}
		for _, dir := range t.Layers {
			keep[layerKeyOf(dir)] = true
		}
	}
	return nil
}

// layerKeyOf is the key of a layer store dir (…/layers/<key>/root).
func layerKeyOf(dir string) string { return filepath.Base(filepath.Dir(dir)) }

// Close cancels every running build and waits for each to end (failed,
// its sandbox killed).
func (b *Builder) Close() {
	// Under mu: admit and Fetch check the context under it before they
	// add to wg, so none adds once Wait may have begun.
	b.mu.Lock()
	b.cancel()
	b.mu.Unlock()
	b.wg.Wait()
}

// Get returns a build's record.
func (b *Builder) Get(ctx context.Context, id string) (template.BuildRecord, error) {
	return b.cfg.Records.GetBuild(ctx, id)
}

// List returns owner's builds of the named template ("" owner: everyone's;
// "" name: every template's), newest first.
func (b *Builder) List(ctx context.Context, owner, name string, limit int) ([]template.BuildRecord, error) {
	return b.cfg.Records.ListBuilds(ctx, owner, name, limit)
}

// Wait waits until build id has ended and returns its record.
func (b *Builder) Wait(ctx context.Context, id string) (template.BuildRecord, error) {
	b.mu.Lock()
	bl := b.active[id]
	b.mu.Unlock()
	if bl != nil {
		select {
		case <-bl.done:
		case <-ctx.Done():
			return template.BuildRecord{}, fmt.Errorf("waiting for build %s: %w", id, ctx.Err())
		}
	}
	return b.cfg.Records.GetBuild(ctx, id)
}
