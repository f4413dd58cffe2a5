package server

import (
	"fmt"
	"net/http"
	goruntime "runtime"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/cluster"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// nodeInfo answers GET /v1/node: the node's runtimes, capacity and what
// its live sandboxes hold (docs/api.md, "Node").
func (s *Server) nodeInfo(w http.ResponseWriter, r *http.Request) error {
	out := api.NodeInfo{
		Version: s.version, Role: config.RoleAll, Runtimes: []string{"runsc", "runc"}, DefaultRuntime: s.cfg.Runtime,
		Network: s.m.Networking(), Sandboxes: map[string]int{},
	}
	if s.node != "" {
		out.Role, out.Name = config.RoleNode, s.node
	}
	if err := s.hostInfo(&out, true); err != nil {
		return err
	}
	for _, sb := range s.m.Live() {
		out.Sandboxes[string(sb.State)]++
		out.Allocated.CPUs += sb.Limits.CPUs
		out.Allocated.MemoryBytes += sb.Limits.MemoryBytes
		out.Allocated.DiskBytes += sb.Limits.DiskBytes
		out.Allocated.Pids += sb.Limits.Pids
	}
	if s.im != nil {
		for _, p := range s.im.PoolStats() {
			out.Pools = append(out.Pools, api.PoolInfo{Template: p.Template, Ready: p.Ready, Target: p.Target, Hits: p.Hits, Misses: p.Misses})
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

// frontNodeInfo answers GET /v1/node on a front: itself, with no
// runtimes, no sandboxes and no disk of its own (GET /v1/nodes lists the
// cluster's nodes).
func (s *Server) frontNodeInfo(w http.ResponseWriter, r *http.Request) error {
	out := api.NodeInfo{Version: s.version, Role: config.RoleFront, Runtimes: []string{}, Sandboxes: map[string]int{}}
	if err := s.hostInfo(&out, false); err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

// hostInfo fills in the host's CPUs, memory, and with disk the file
// system of the data dir.
func (s *Server) hostInfo(out *api.NodeInfo, disk bool) error {
	out.CPUs = goruntime.NumCPU()
	var err error
	if out.MemoryBytes, out.MemoryAvailableBytes, err = cluster.Meminfo(); err != nil {
		return fmt.Errorf("reading the host's memory: %w", err)
	}
	if !disk {
		return nil
	}
	if out.DiskBytes, out.DiskFreeBytes, err = cluster.Disk(s.cfg.DataDir); err != nil {
		return fmt.Errorf("reading the data dir's file system: %w", err)
	}
	return nil
}

// listNodes answers GET /v1/nodes: the cluster's nodes as the catalog
// knows them (none on a server outside a cluster).
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	if s.nodes == nil {
		return fmt.Errorf("no node registry: %w", errdefs.ErrUnavailable)
	}
	ns, err := s.nodes.Nodes(r.Context())
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	out := api.ClusterNodeList{Nodes: make([]api.ClusterNode, 0, len(ns))}
	for _, n := range ns {
		out.Nodes = append(out.Nodes, api.ClusterNode{
			Name: n.Name, URL: n.URL, State: n.State, Reason: n.Reason, CPUs: n.CPUs, MemoryBytes: n.MemoryBytes,
			DiskBytes: n.DiskBytes, DiskFreeBytes: n.DiskFreeBytes,
			Slots: n.Slots, Runtimes: n.Runtimes, Templates: n.Templates, StartedAt: n.StartedAt, HeartbeatAt: n.HeartbeatAt,
			Sandboxes: n.Sandboxes, Reserved: n.Reserved,
			Allocated: api.Limits{CPUs: n.AllocatedCPUs, MemoryBytes: n.AllocatedMemoryBytes},
		})
	}
	return writeJSON(w, http.StatusOK, out)
}
