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
