package sandbox

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/oci"
	"github.com/kiln-sh/kiln/internal/template"
)

// Images is the checkpoint-image side of a host's sandboxes: images of
// running sandboxes and what is made from them. Named snapshots
// (snapshot.go), forks (fork.go), templates' warm checkpoints (warm.go),
// pools of ready sandboxes restored from them (pool.go), and new
// sandboxes restored from any of these.
//
// The Manager keeps the sandboxes themselves (records, state machine,
// the bring-up pipeline, destroy); Images is built on one (NewImages) and
// reaches it only through core, the operations listed below, so that what
// it depends on stays visible and small. It reads a box's record and dir
// (under the box's lock while it captures an image, so no lifecycle change
// or liveness ping runs meanwhile) but changes sandboxes only through
// core. The Manager, in turn, reaches Images only through one seam,
// imageHooks (seam.go).
type Images struct {
	core     core
	cfg      Config // the Manager's, with its defaults
	runtimes map[string]oci.Runtime
	records  snapshotRecords
	log      *slog.Logger
	// agentBuild names the Manager's agent build: a warm checkpoint is
	// only usable by the agent it was made with.
	agentBuild string

	// snapMu orders snapshot records and files: restores from snapshots
	// hold it shared, deletes and retention checks exclusively.
	snapMu sync.RWMutex

	warm warmBuilds // warm checkpoint builds (warm.go)

	mu    sync.Mutex
	pools *pools // ready sandboxes per template (pool.go)
	// poolBursts are the pools' burst sizes (SetPoolBursts).
	poolBursts map[string]int
}

// core is what Images uses of the Manager, and all it uses (the compiler
// holds Images to it). Each operation says why Images needs it.
type core interface {
	// box returns a live sandbox: Snapshot and Fork capture an image of
	// it, under its lock.
	box(id ID) (*box, error)
	// restoreNew brings a new, listed sandbox up from an image (the
	// pipeline's restore path): each fork, and a create from a snapshot.
	restoreNew(ctx context.Context, rec Sandbox, tmpl *template.Template, imageDir string, q Quota) (*box, error)
	// prepareNew and finishNew are restoreNew in two halves: a fork's
	// sandboxes are prepared, their containers created, while the
	// source is checkpointed, and restored once its image is written.
	prepareNew(ctx context.Context, rec Sandbox, tmpl *template.Template, imageDir string, q Quota, create bool) (*prepared, error)
	finishNew(ctx context.Context, p *prepared) (*box, error)
	// retract destroys a sandbox made in vain and deletes its record: a
	// fork is all or nothing.
	retract(ctx context.Context, id ID, final State, reason string) error
	// unlisted brings up a running sandbox with no record, outside the
	// live set (the pipeline's pool path): a pool's (restored from the
	// warm checkpoint ck when there is one) and a warm build's.
	unlisted(ctx context.Context, tmpl *template.Template, rt oci.Runtime, limits Limits, ck *template.Checkpoint, stateDir string, net *NetworkOptions) (*box, error)
	// resolveNetwork resolves a create's network: a pool's sandboxes get
	// the one a create that does not ask would get.
	resolveNetwork(o *NetworkOptions, tmplMode string) (*NetworkOptions, error)
	// claimNetwork gives a pooled sandbox the network policy of the
	// create that claims it.
	claimNetwork(ctx context.Context, b *box, o *NetworkOptions) error
	// enlist makes an unlisted sandbox the listed sandbox a create asks
	// for: a claim from a pool.
	enlist(ctx context.Context, b *box, want Sandbox, q Quota, w *template.Warm) (_ Sandbox, kept bool, _ error)
	// watchUnlisted watches a pooled sandbox's agent as the core watches
	// every sandbox's, and tells the pool when it dies unclaimed.
	watchUnlisted(b *box, conn *channel.Conn, gone func())
	// discard destroys an unlisted sandbox: a pool's that died, was stale
	// or was never claimed, and a warm build's once its image is taken.
	discard(ctx context.Context, b *box)
}

var _ core = (*Manager)(nil)

// snapshotRecords is the part of the Store that Images uses: snapshot
// records. Sandbox records are the core's.
type snapshotRecords interface {
	PutSnapshot(ctx context.Context, s Snapshot) error
	GetSnapshot(ctx context.Context, owner, name string) (Snapshot, error)
	ListSnapshots(ctx context.Context, owner string) ([]Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// NewImages builds the checkpoint-image features on m and installs them as
// m's image seam: from then on m's creates restore warm checkpoints, claim
// pooled sandboxes and restore snapshots, and m's Close stops the pools.
// With m's config's Adopt (kiln serve) it first reconciles the snapshot
// records with their files and removes what interrupted forks left. Call
// it once per Manager, before the Manager serves creates.
func NewImages(ctx context.Context, m *Manager) (*Images, error) {
	im := &Images{
		core: m, cfg: m.cfg, runtimes: m.runtimes, records: m.store, log: m.log,
		agentBuild: filepath.Base(m.agentDir),
	}
	if m.cfg.Adopt {
		if err := im.gcSnapshots(ctx); err != nil {
			return nil, err
		}
		im.gcForks()
		if shared := m.cfg.Cluster.SnapshotDir; shared != "" {
			if err := gcSharedTemp(shared, m.cfg.Node); err != nil {
				im.log.Warn("removing this node's unfinished images in the shared snapshot dir", "err", err)
			}
		}
	}
	m.setImages(im)
	return im, nil
}

// gcForks removes the images that forks interrupted by a crash left in
// the state dir.
func (im *Images) gcForks() {
	ents, _ := os.ReadDir(im.cfg.StateDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), forkTmpPrefix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(im.cfg.StateDir, e.Name())); err != nil {
			im.log.Error("removing stale fork snapshot", "dir", e.Name(), "err", err)
		}
	}
}
