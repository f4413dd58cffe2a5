package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Load reads an uploaded image archive: an OCI image layout tarball (as
// `skopeo copy … oci-archive:` or `docker buildx --output type=oci` write
// it) or a `docker save` tarball, either of them optionally gzipped. ref
// names the archive in messages and Image.Ref (e.g. its upload's hash);
// the path is never quoted. An OCI layout is unpacked into a temporary
// directory beside the archive, at most maxBytes of it (a compressed
// archive expands), removed by Image.Close; a docker save tarball is read
// in place, so the archive must stay until Close.
func Load(ctx context.Context, archive, ref string, maxBytes int64) (*Image, error) {
	kind, err := archiveKind(ctx, archive, ref)
	if err != nil {
		return nil, err
	}
	if kind == "docker" {
		return readArchive(ref, func() (v1.Image, error) {
			return tarball.Image(func() (io.ReadCloser, error) { return openArchive(archive) }, nil)
		})
	}
	dir, err := os.MkdirTemp(filepath.Dir(archive), ".oci-layout-")
	if err != nil {
		return nil, fmt.Errorf("unpacking archive %s: %w", errdefs.Clip(ref), err)
	}
	i, err := loadLayout(ctx, archive, ref, dir, maxBytes)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	i.close = func() error { return os.RemoveAll(dir) }
	return i, nil
}

func loadLayout(ctx context.Context, archive, ref, dir string, maxBytes int64) (*Image, error) {
	if err := extractLayout(ctx, archive, ref, dir, maxBytes); err != nil {
		return nil, err
	}
	return readArchive(ref, func() (v1.Image, error) {
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			return nil, err
		}
		return fromIndex(ref, idx, 0)
	})
}

// readArchive opens the image of an archive; any failure the code here
// has not classified means the archive is not a valid image.
func readArchive(ref string, open func() (v1.Image, error)) (*Image, error) {
	img, err := open()
	var i *Image
	if err == nil {
		i, err = newImage(ref, img)
	}
	if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
		err = fmt.Errorf("archive %s is not a valid image: %s: %w", errdefs.Clip(ref), errdefs.ClipN(err.Error(), 300), errdefs.ErrInvalidArgument)
	}
	return i, err
}

// openArchive opens the tar stream of an archive, gunzipping it if needed.
func openArchive(archive string) (io.ReadCloser, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(f)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, err
		}
		return struct {
			io.Reader
			io.Closer
		}{zr, f}, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{br, f}, nil
}

// archiveKind says whether an archive is a docker save tarball ("docker",
// which Docker 25+ also makes an OCI layout: read as docker) or an OCI
// image layout ("oci").
func archiveKind(ctx context.Context, archive, ref string) (string, error) {
	rc, err := openArchive(archive)
	if err != nil {
		return "", fmt.Errorf("opening archive %s: %w", errdefs.Clip(ref), errdefs.ErrInvalidArgument)
	}
	defer rc.Close()
	kind := ""
	errFound := errors.New("found")
	err = walkTar(ctx, tar.NewReader(rc), func(h *tar.Header) error {
		switch cleanName(h.Name) {
		case "manifest.json":
			kind = "docker"
			return errFound
		case "oci-layout":
			kind = "oci"
		}
		return nil
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return "", ctx.Err()
	case err != nil && err != errFound:
		return "", fmt.Errorf("archive %s is not a tar archive: %w", errdefs.Clip(ref), errdefs.ErrInvalidArgument)
	case kind == "":
		return "", fmt.Errorf("archive %s is neither an OCI image layout (no oci-layout file) nor a docker save tarball (no manifest.json): %w", errdefs.Clip(ref), errdefs.ErrInvalidArgument)
	}
	return kind, nil
}

// extractLayout writes the files of an OCI layout tarball that a layout
// reader needs (oci-layout, index.json, blobs/…) into dir, at most maxBytes.
func extractLayout(ctx context.Context, archive, ref, dir string, maxBytes int64) error {
	rc, err := openArchive(archive)
	if err != nil {
		return fmt.Errorf("opening archive %s: %w", errdefs.Clip(ref), errdefs.ErrInvalidArgument)
	}
	defer rc.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(rc)
	var total int64
	err = walkTar(ctx, tr, func(h *tar.Header) error {
		name := cleanName(h.Name)
		if h.Typeflag != tar.TypeReg || !(name == "oci-layout" || name == "index.json" || strings.HasPrefix(name, "blobs/")) {
			return nil
		}
		if total += h.Size; total > maxBytes {
			return fmt.Errorf("archive %s unpacks to more than %d bytes: %w", errdefs.Clip(ref), maxBytes, errdefs.ErrResourceExhausted)
		}
		if err := root.MkdirAll(path.Dir(name), 0o700); err != nil {
			return fmt.Errorf("archive %s: %s: %w", errdefs.Clip(ref), errdefs.Clip(name), errdefs.ErrInvalidArgument)
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("archive %s: %s: %w", errdefs.Clip(ref), errdefs.Clip(name), errdefs.ErrInvalidArgument)
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("archive %s: unpacking %s: %w", errdefs.Clip(ref), errdefs.Clip(name), sysErr(err))
		}
		return nil
	})
	if err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.ErrResourceExhausted) && !errors.Is(err, errdefs.ErrInvalidArgument) {
		return fmt.Errorf("archive %s: reading its tar: %s: %w", errdefs.Clip(ref), errdefs.ClipN(err.Error(), 200), errdefs.ErrInvalidArgument)
	}
	return err
}

// walkTar calls fn with each entry of tr until the end, an error, or ctx
// is done. Entries the tar reader finds insecure ("../x", "/abs") are
// passed on: the callers contain their names.
func walkTar(ctx context.Context, tr *tar.Reader, fn func(*tar.Header) error) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return err
		}
		if err := fn(h); err != nil {
			return err
		}
	}
}

// cleanName is a tar entry's name relative to the archive's root: never
// absolute, never above it ("" for the root itself).
func cleanName(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}
