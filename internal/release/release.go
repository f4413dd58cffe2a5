// Package release assembles Kiln's container image without a container
// engine: a Debian root filesystem (the layers of a built template, e.g.
// base, turned into OCI layers) plus one layer with kiln, kiln-agent,
// runsc and runc, written as an OCI image layout and, optionally, a
// `docker save` tarball that `ctr images import`, `docker load` and
// `skopeo copy docker-archive:` take, and optionally pushed to a
// registry. Nothing is pulled from a registry.
package release

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kiln-sh/kiln/internal/template/image"
)

// Where the image puts Kiln's files. kiln finds kiln-agent next to itself
// and prefers runsc at config.ModernRunsc; runc is found on PATH.
const (
	KilnPath  = "/usr/local/bin/kiln"
	AgentPath = "/usr/local/bin/kiln-agent"
	RunscPath = "/usr/local/lib/kiln/runsc"
	RuncPath  = "/usr/local/bin/runc"
)

// Options say what goes into the image and where it is written.
type Options struct {
	// Rootfs are the root filesystem's layer dirs in overlay format,
	// bottom first (a template's Layers).
	Rootfs []string
	// Host paths of the binaries.
	Kiln, Agent, Runsc, Runc string
	// Tag names the image in the layout's index and the tarball
	// (e.g. kiln:v1.2.3).
	Tag string
	// Created is the image's creation time and the kiln layer's file
	// times; zero is the Unix epoch (reproducible builds).
	Created time.Time
	// Layout is the OCI image layout dir to write (replaced if present).
	Layout string
	// Tarball, if set, is a `docker save` tarball to write as well.
	Tarball string
	// Push, if set, is a registry reference (host/repo:tag) to push the
	// image to, with the credentials of ~/.docker/config.json.
	Push string
	// TmpDir holds the compressed layers while the image is written
	// ("" for the system's).
	TmpDir string
}

// Build writes the image and returns its manifest digest.
func Build(ctx context.Context, o Options) (v1.Hash, error) {
	tag, err := name.NewTag(o.Tag)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image tag %q: %w", o.Tag, err)
	}
	if o.Created.IsZero() {
		o.Created = time.Unix(0, 0).UTC()
	}
	tmp, err := os.MkdirTemp(o.TmpDir, "kiln-image-")
	if err != nil {
		return v1.Hash{}, fmt.Errorf("making a temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)

	var adds []mutate.Addendum
	for i, dir := range o.Rootfs {
		l, err := image.CompressedLayer(ctx, filepath.Join(tmp, fmt.Sprintf("rootfs-%d.tar.gz", i)), func(w io.Writer) error {
			return image.WriteLayer(ctx, dir, w)
		})
		if err != nil {
			return v1.Hash{}, fmt.Errorf("packing root filesystem layer %s: %w", dir, err)
		}
		adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{Created: v1.Time{Time: o.Created},
			CreatedBy: "kiln template layer " + filepath.Base(filepath.Dir(dir)), Comment: "Debian root filesystem"}})
	}
	files := []fileEntry{
		{o.Kiln, KilnPath[1:], 0o755}, {o.Agent, AgentPath[1:], 0o755},
		{o.Runsc, RunscPath[1:], 0o755}, {o.Runc, RuncPath[1:], 0o755},
	}
	l, err := image.CompressedLayer(ctx, filepath.Join(tmp, "kiln.tar.gz"), func(w io.Writer) error {
		return filesTar(files, o.Created, w)
	})
	if err != nil {
		return v1.Hash{}, fmt.Errorf("packing the kiln layer: %w", err)
	}
	adds = append(adds, mutate.Addendum{Layer: l, History: v1.History{Created: v1.Time{Time: o.Created},
		CreatedBy: "kiln release: kiln, kiln-agent, runsc, runc"}})

	img, err := assemble(adds, o.Created)
	if err != nil {
		return v1.Hash{}, err
	}
	if err := os.RemoveAll(o.Layout); err != nil {
		return v1.Hash{}, fmt.Errorf("removing the old layout: %w", err)
	}
	p, err := layout.Write(o.Layout, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("writing the image layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(), "io.containerd.image.name": tag.Name(),
	})); err != nil {
		return v1.Hash{}, fmt.Errorf("writing the image layout: %w", err)
	}
	if o.Tarball != "" {
		if err := tarball.WriteToFile(o.Tarball, tag, img); err != nil {
			return v1.Hash{}, fmt.Errorf("writing the image tarball: %w", err)
		}
	}
	if o.Push != "" {
		ref, err := name.ParseReference(o.Push)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("push reference %q: %w", o.Push, err)
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return v1.Hash{}, fmt.Errorf("pushing to %s: %w", ref, err)
		}
	}
	return img.Digest()
}

// image is the OCI image of the layers, with Kiln's config: kiln serve
// as the command, the data dir and the listen address of a container.
func assemble(adds []mutate.Addendum, created time.Time) (v1.Image, error) {
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.ConfigFile(base, &v1.ConfigFile{
		Architecture: "amd64", OS: "linux",
		Config: v1.Config{
			Entrypoint: []string{KilnPath},
			Cmd:        []string{"serve"},
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"KILN_DATA_DIR=/var/lib/kiln",
				"KILN_LISTEN=0.0.0.0:8420",
			},
			WorkingDir:   "/",
			ExposedPorts: map[string]struct{}{"8420/tcp": {}},
			Labels: map[string]string{
				"org.opencontainers.image.title":       "kiln",
				"org.opencontainers.image.description": "Kiln: self-hosted sandboxes for AI agents (kiln serve; --role node needs a privileged container)",
			},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("setting the image config: %w", err)
	}
	if img, err = mutate.Append(img, adds...); err != nil {
		return nil, fmt.Errorf("adding layers: %w", err)
	}
	if img, err = mutate.CreatedAt(img, v1.Time{Time: created}); err != nil {
		return nil, fmt.Errorf("setting the creation time: %w", err)
	}
	return img, nil
}
