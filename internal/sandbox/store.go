package sandbox

import "context"

// Store persists sandbox records so that nothing acknowledged to a client
// is lost when kiln serve crashes. Two implementations: SQLite (embedded,
// the default) and PostgreSQL, in internal/store; both pass the same suite
// (internal/store/storetest).
type Store interface {
	// PutSandbox inserts or replaces a record.
	PutSandbox(ctx context.Context, s Sandbox) error
	// GetSandbox returns a record; errdefs.ErrNotFound if there is none.
	GetSandbox(ctx context.Context, id ID) (Sandbox, error)
	// ListSandboxes returns records matching f, oldest first, one page at
	// a time; the returned token fetches the next page ("" at the end).
	ListSandboxes(ctx context.Context, f Filter) ([]Sandbox, string, error)
	// DeleteSandbox removes a record; deleting a missing one succeeds.
	DeleteSandbox(ctx context.Context, id ID) error

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
	Owner    string            // "" = any owner
	Node     string            // "" = any node
	States   []State           // empty = any state
	Metadata map[string]string // every pair must match
	Limit    int               // page size; 0 = 100, at most 1000
	Token    string            // from the previous page
}
