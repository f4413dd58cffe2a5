package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/kiln-sh/kiln/api"
)

// CreateSnapshot takes a named snapshot of a running runsc sandbox: its
// memory, processes and files. The sandbox is frozen for a fraction of a
// second and keeps running. Make sandboxes from it with
// CreateSandbox(ctx, api.CreateSandboxRequest{Snapshot: name}).
func (c *Client) CreateSnapshot(ctx context.Context, id, name string) (*api.Snapshot, error) {
	var s api.Snapshot
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "snapshots"), nil, api.SnapshotRequest{Name: name}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// ListSnapshots lists the caller's snapshots, oldest first, with the disk
// space they take.
func (c *Client) ListSnapshots(ctx context.Context) (*api.SnapshotList, error) {
	var l api.SnapshotList
	if err := c.call(ctx, http.MethodGet, "/v1/snapshots", nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetSnapshot returns one of the caller's snapshots.
func (c *Client) GetSnapshot(ctx context.Context, name string) (*api.Snapshot, error) {
	var s api.Snapshot
	if err := c.call(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(name), nil, nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// DeleteSnapshot deletes a snapshot and its files; sandboxes made from it
// are not affected.
func (c *Client) DeleteSnapshot(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(name), nil, nil, nil)
}
