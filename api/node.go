package api

// NodeInfo is what GET /v1/node says about the server's node: what it
// runs, its capacity, and how much of it live sandboxes hold. Admin keys
// only: it counts every key's sandboxes.
type NodeInfo struct {
	Version        string   `json:"version"`
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
