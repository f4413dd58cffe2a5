package api

import "time"

// Snapshot is a named snapshot of a sandbox: its memory, processes and
// files at one moment, from which new sandboxes can be created
// (CreateSandboxRequest.Snapshot).
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Source    string    `json:"source"` // the sandbox it was taken of
	Template  string    `json:"template"`
	Runtime   string    `json:"runtime"`
	Limits    Limits    `json:"limits"`
	SizeBytes int64     `json:"size_bytes"` // disk space it takes
	CreatedAt time.Time `json:"created_at"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	// Name is unique among the caller's snapshots: 1-64 letters, digits,
	// '.', '_' or '-', starting with a letter or digit.
	Name string `json:"name"`
}

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots  []Snapshot `json:"snapshots"`
	TotalBytes int64      `json:"total_bytes"`
}
