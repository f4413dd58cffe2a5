package template

import (
	"context"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// Records of custom templates and their builds, kept in the server's
// store (SQLite or PostgreSQL) so that no build or tag is lost when kiln
// serve restarts, and so every node of a cluster sees the same catalog.
// A build's files (layers, warm checkpoint, log) live under the data dir;
// the records say which exist and what they mean.

// Build states. A build is created waiting (its files may still be
// uploading), runs, and ends ready or failed. A build found building
// when kiln serve starts was interrupted: it is marked failed.
const (
	BuildWaiting  = "waiting"
	BuildBuilding = "building"
	BuildReady    = "ready"
	BuildError    = "error"
)

// BuildRecord is one build of a template.
type BuildRecord struct {
	ID       string `json:"id"`
	Template string `json:"template"` // the name it was built for
	Owner    string `json:"owner"`    // the API key that started it ("" for built-ins)
	Status   string `json:"status"`
	// Spec is the recipe, without registry credentials.
	Spec api.TemplateSpec `json:"spec"`
	// Reason says why a build failed; Step is the index of the step that
	// failed (-1: none, e.g. the base could not be pulled).
	Reason string `json:"reason,omitempty"`
	Step   int    `json:"step"`
	// Layers are the keys of the build's layers, bottom first; Config is
	// what its sandboxes start with. Both are set once it is ready.
	Layers []string `json:"layers,omitempty"`
	Config Config   `json:"config"`
	Node   string   `json:"node,omitempty"` // where its files live
	// Image is the build as an OCI image in the cluster registry
	// ("registry/repo:tag@sha256:…"), set before it is marked ready when
	// its node has one (kiln serve --cluster-registry): a node without
	// the build's files pulls it from there on first use. Empty: the
	// build's files are on Node only.
	Image string `json:"image,omitempty"`
	// StepsDone is how many of the recipe's steps the build got through
	// (ran, or found in the layer cache); CachedSteps how many of those
	// were found in the cache. Both are set when the build ends.
	StepsDone   int `json:"steps_done"`
	CachedSteps int `json:"cached_steps"`
	// CreatedAt is when the build was requested; StartedAt when it left
	// waiting (zero until it does); FinishedAt when it ended (zero while
	// it has not).
	CreatedAt  time.Time `json:"created_at"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// Config is what sandboxes made from a build start with.
type Config struct {
	Defaults
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
}

// TagRecord points a template's tag at a build: (Owner, Name, Tag) is
// unique. Name and tag follow ValidName.
type TagRecord struct {
	Owner     string    `json:"owner"`
	Name      string    `json:"name"`
	Tag       string    `json:"tag"`
	BuildID   string    `json:"build_id"`
	Public    bool      `json:"public"` // any key may use it (set per template, copied to each tag)
	UpdatedAt time.Time `json:"updated_at"`
}

// DefaultTag is the tag of "name" without one.
const DefaultTag = "default"

// Store keeps template records. Two implementations (internal/store/sqlite
// and internal/store/postgres) pass internal/store/storetest.
type Store interface {
	// PutBuild inserts or replaces a build record. Spec.From.Registry is
	// dropped: credentials are never stored.
	PutBuild(ctx context.Context, b BuildRecord) error
	// GetBuild returns a build record; errdefs.ErrNotFound if none.
	GetBuild(ctx context.Context, id string) (BuildRecord, error)
	// ListBuilds returns owner's builds of the named template ("" owner:
	// any owner's; "" name: every template's), newest first, at most
	// limit (0: 100; capped at 1000; negative: errdefs.ErrInvalidArgument).
	ListBuilds(ctx context.Context, owner, name string, limit int) ([]BuildRecord, error)
	// BuildsIn returns every build in one of the given states, oldest
	// first (used at start-up to fail interrupted builds).
	BuildsIn(ctx context.Context, states ...string) ([]BuildRecord, error)
	// DeleteBuild removes a build record; deleting a missing one succeeds.
	DeleteBuild(ctx context.Context, id string) error

	// PutTag points a tag at a build, replacing what it pointed at. Public
	// is stored as given: the caller copies the template's flag.
	PutTag(ctx context.Context, t TagRecord) error
	// GetTag returns owner's tag; errdefs.ErrNotFound if none.
	GetTag(ctx context.Context, owner, name, tag string) (TagRecord, error)
	// ListTags returns the tags of owner's templates ("" owner: every
	// owner's; "" name: every template's), by name then tag (then owner).
	ListTags(ctx context.Context, owner, name string) ([]TagRecord, error)
	// PublicTags returns the tags of public templates named name ("":
	// all), by owner then tag (then name).
	PublicTags(ctx context.Context, name string) ([]TagRecord, error)
	// DeleteTag removes a tag; errdefs.ErrNotFound if it did not exist.
	DeleteTag(ctx context.Context, owner, name, tag string) error
	// SetPublic marks every tag of owner's template public or private;
	// errdefs.ErrNotFound if it has none.
	SetPublic(ctx context.Context, owner, name string, public bool) error
}
