package sandbox

import (
	"context"
	"time"
)

// Store persists sandbox records so that nothing acknowledged to a client
// is lost when kiln serve crashes. Two implementations: SQLite (embedded,
// the default) and PostgreSQL, in internal/store; both pass the same suite
// (internal/store/storetest).
type Store interface {
	// PutSandbox inserts or replaces a record. A record in a terminal
	// state (stopped, failed) is stored without its Env and Metadata, and
	// with EndedAt set (now, if the record has none): an ended sandbox's
	// record is a small tombstone until DeleteEnded removes it.
	PutSandbox(ctx context.Context, s Sandbox) error
	// GetSandbox returns a record; errdefs.ErrNotFound if there is none.
	GetSandbox(ctx context.Context, id ID) (Sandbox, error)
	// ListSandboxes returns records matching f, oldest first (newest
	// first with f.Desc), one page of at most f.Limit at a time; the
	// returned token fetches the next page ("" at the end). A page is one
	// bounded query: no more than a page is ever read into memory.
	ListSandboxes(ctx context.Context, f Filter) ([]Sandbox, string, error)
	// DeleteSandbox removes a record; deleting a missing one succeeds.
	DeleteSandbox(ctx context.Context, id ID) error
	// DeleteEnded removes up to limit records of sandboxes that ended
	// (stopped or failed) before before, oldest end first, and returns
	// how many it removed.
	DeleteEnded(ctx context.Context, before time.Time, limit int) (int, error)

	// PutSnapshot inserts a snapshot record; errdefs.ErrAlreadyExists if
	// its id, or its name for its owner, is taken.
	PutSnapshot(ctx context.Context, s Snapshot) error
	// GetSnapshot returns owner's snapshot called name;
	// errdefs.ErrNotFound if there is none.
	GetSnapshot(ctx context.Context, owner, name string) (Snapshot, error)
	// ListSnapshots returns owner's snapshots ("" for every owner's),
	// oldest first.
	ListSnapshots(ctx context.Context, owner string) ([]Snapshot, error)
	// DeleteSnapshot removes a snapshot record by id; deleting a missing
	// one succeeds.
	DeleteSnapshot(ctx context.Context, id string) error

	Close() error
}

// Filter selects sandbox records.
type Filter struct {
	Owner        string            // "" = any owner
	Node         string            // "" = any node
	Template     string            // "" = any template
	States       []State           // empty = any state
	Metadata     map[string]string // every pair must match
	CreatedAfter time.Time         // zero = any; else created strictly after
	Desc         bool              // newest first
	Limit        int               // page size; 0 = 100, at most 1000
	Token        string            // from the previous page (of the same order)
}
