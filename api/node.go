package api

import "time"

// NodeInfo is what GET /v1/node says about the server's node: what it
// runs, its capacity, and how much of it live sandboxes hold. Admin keys
// only: it counts every key's sandboxes.
type NodeInfo struct {
	Version string `json:"version"`
	// Role is the server's: all (one machine), node or front (a
	// cluster's, docs/cluster.md). A front runs no sandboxes: it answers
	// for itself (no runtimes, no sandboxes); GET /v1/nodes lists the
	// cluster's nodes. Name is a node's name in the cluster.
	Role           string   `json:"role,omitempty"`
	Name           string   `json:"name,omitempty"`
	Runtimes       []string `json:"runtimes"`        // runsc, runc
	DefaultRuntime string   `json:"default_runtime"` // of creates that name none
	Network        bool     `json:"network"`         // sandbox networking is on (KILN_NETWORK)
	// Capacity of the host: its CPUs, memory, and the file system of the
	// data dir (sandbox disks, templates, snapshots).
	CPUs                 int   `json:"cpus"`
	MemoryBytes          int64 `json:"memory_bytes"`
	MemoryAvailableBytes int64 `json:"memory_available_bytes"`
	DiskBytes            int64 `json:"disk_bytes"`
	DiskFreeBytes        int64 `json:"disk_free_bytes"`
	// Sandboxes counts this node's live sandboxes by state; Allocated adds
	// up their limits.
	Sandboxes map[string]int `json:"sandboxes"`
	Allocated Limits         `json:"allocated"`
	// Pools are the warm pools of templates, if any are configured.
	Pools []PoolInfo `json:"pools,omitempty"`
}

// PoolInfo is one template's warm pool.
type PoolInfo struct {
	Template string `json:"template"`
	Ready    int    `json:"ready"`  // sandboxes waiting to be claimed
	Target   int    `json:"target"` // its configured size
	Hits     uint64 `json:"hits"`   // creates it served
	Misses   uint64 `json:"misses"` // creates that found it empty
}

// ClusterNode is one node of a cluster as the catalog knows it (GET
// /v1/nodes; docs/cluster.md).
type ClusterNode struct {
	Name   string `json:"name"`
	URL    string `json:"url"`
	State  string `json:"state"`            // live, draining or lost
	Reason string `json:"reason,omitempty"` // why it was marked lost
	// Capacity it reported.
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	// DiskBytes and DiskFreeBytes: its data dir's file system, as of its
	// last heartbeat.
	DiskBytes     int64     `json:"disk_bytes"`
	DiskFreeBytes int64     `json:"disk_free_bytes"`
	Slots         int       `json:"slots"`
	Runtimes      []string  `json:"runtimes"`
	Templates     []string  `json:"templates"`
	StartedAt     time.Time `json:"started_at"`
	HeartbeatAt   time.Time `json:"heartbeat_at"` // the catalog's clock
	// Load, from the catalog's records: its sandboxes that have not
	// ended, placements reserved on it, and their limits added up.
	Sandboxes int    `json:"sandboxes"`
	Reserved  int    `json:"reserved"`
	Allocated Limits `json:"allocated"`
}

// ClusterNodeList is the body of GET /v1/nodes.
type ClusterNodeList struct {
	Nodes []ClusterNode `json:"nodes"`
}
