package api

import "time"

// Volume is a persistent volume: a directory on the server's disk, with
// a size quota, that sandboxes mount at create and that outlives them.
type Volume struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateVolumeRequest is the body of POST /v1/volumes.
type CreateVolumeRequest struct {
	// Name is unique among the caller's volumes: 1-63 letters, digits,
	// '.', '_' or '-', starting with a letter or digit.
	Name string `json:"name"`
	// SizeBytes caps what the volume holds; 0 takes the server's default.
	SizeBytes int64 `json:"size_bytes,omitempty"`
}

// VolumeList is the body of GET /v1/volumes.
type VolumeList struct {
	Volumes []Volume `json:"volumes"`
	// TotalBytes is the sum of the volumes' sizes, which the caller's
	// volume quota bounds.
	TotalBytes int64 `json:"total_bytes"`
}

// VolumeMount mounts one of the caller's volumes into a sandbox at
// create.
type VolumeMount struct {
	Volume   string `json:"volume"` // the volume's id or name
	Path     string `json:"path"`   // absolute, in the sandbox
	ReadOnly bool   `json:"read_only,omitempty"`
}
