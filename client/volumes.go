package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/kiln-sh/kiln/api"
)

// CreateVolume creates a persistent volume of size bytes (0: the
// server's default). Mount it at create with
// api.CreateSandboxRequest{Volumes: []api.VolumeMount{{Volume: name, Path: "/data"}}}.
func (c *Client) CreateVolume(ctx context.Context, name string, size int64) (*api.Volume, error) {
	var v api.Volume
	if err := c.call(ctx, http.MethodPost, "/v1/volumes", nil, api.CreateVolumeRequest{Name: name, SizeBytes: size}, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// ListVolumes lists the caller's volumes, oldest first, with the sum of
// their sizes.
func (c *Client) ListVolumes(ctx context.Context) (*api.VolumeList, error) {
	var l api.VolumeList
	if err := c.call(ctx, http.MethodGet, "/v1/volumes", nil, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// GetVolume returns one of the caller's volumes, by id or name.
func (c *Client) GetVolume(ctx context.Context, ref string) (*api.Volume, error) {
	var v api.Volume
	if err := c.call(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(ref), nil, nil, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// DeleteVolume deletes a volume (by id or name) and its data; a volume
// that a running or paused sandbox mounts is a conflict (409).
func (c *Client) DeleteVolume(ctx context.Context, ref string) error {
	return c.call(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(ref), nil, nil, nil)
}
