package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Push writes an image of a template to ref in a registry and returns its
// manifest digest: one layer per directory of layers (bottom first, each
// in the overlay form of the layer store and of Unpack: whiteouts as
// character devices 0:0, opaque directories marked with the
// trusted.overlay.opaque xattr), turned into the OCI layer form (".wh."
// files, ".wh..wh..opq" markers), and c as its config (Cmd as a shell
// form). Pull and Unpack give the same directories back, so a template
// pushed from one host is a base image on another.
//
// Each layer is read once, into a compressed file in a temporary
// directory (CompressedLayer) that the digests and the upload read; its
// entries are in name order with no access or change times, so the same
// layer is the same blob. c.Annotations go in the manifest. guard, if set, checks every address the push
// connects to, as for Pull.
func Push(ctx context.Context, ref string, layers []string, c Config, auth *api.RegistryAuth, guard Guard) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("malformed image reference %q: want [registry/]repository[:tag]: %w", errdefs.Clip(ref), errdefs.ErrInvalidArgument)
	}
	tmp, err := os.MkdirTemp("", "kiln-push-")
	if err != nil {
		return "", fmt.Errorf("making room for the layers: %w", err)
	}
	defer os.RemoveAll(tmp)
	ls := make([]v1.Layer, 0, len(layers))
	for i, dir := range layers {
		l, err := CompressedLayer(ctx, filepath.Join(tmp, strconv.Itoa(i)+".tar.gz"), func(w io.Writer) error {
			return WriteLayer(ctx, dir, w)
		})
		if err != nil {
			return "", fmt.Errorf("pushing %s: %w %s: %w", errdefs.Clip(ref), errLayerRead, filepath.Base(dir), err)
		}
		ls = append(ls, l)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		return "", fmt.Errorf("assembling the image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", fmt.Errorf("assembling the image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = Platform.OS, Platform.Architecture
	cf.Config.Env, cf.Config.User, cf.Config.WorkingDir = c.Env, c.User, c.Workdir
	if c.Cmd != "" {
		cf.Config.Cmd = []string{"/bin/sh", "-c", c.Cmd}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", fmt.Errorf("assembling the image: %w", err)
	}
	if len(c.Annotations) > 0 {
		img = mutate.Annotations(img, c.Annotations).(v1.Image)
	}
	p := puller{ctx: ctx, ref: ref, host: r.Context().RegistryStr(), anonymous: authenticator(auth) == authn.Anonymous}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithAuth(authenticator(auth)),
		remote.WithUserAgent("kiln"), remote.WithTransport(guarded(guard))); err != nil {
		return "", p.explainPush(err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("digesting the image: %w", err)
	}
	return d.String(), nil
}

// explainPush says why a push failed, in the terms explain uses for a
// pull.
func (p puller) explainPush(err error) error {
	ref := errdefs.Clip(p.ref)
	if cerr := p.ctx.Err(); cerr != nil {
		return fmt.Errorf("pushing %s: %w", ref, cerr)
	}
	if errors.Is(err, errRefusedAddr) {
		return fmt.Errorf("registry %s is at an address this server may not push to (this host's loopback, "+
			"link-local or cloud metadata addresses): %w", p.host, errdefs.ErrPermissionDenied)
	}
	var te *transport.Error
	switch {
	case errors.As(err, &te) && (te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden):
		if p.anonymous {
			return fmt.Errorf("registry %s refused an anonymous push of %s: give credentials: %w", p.host, ref, errdefs.ErrPermissionDenied)
		}
		return fmt.Errorf("registry %s refused the credentials for pushing %s: %w", p.host, ref, errdefs.ErrPermissionDenied)
	case errors.As(err, &te):
		return fmt.Errorf("registry %s answered %d %s to pushing %s: %w", p.host, te.StatusCode, http.StatusText(te.StatusCode), ref, errdefs.ErrUnavailable)
	}
	if cause := networkCause(err); cause != "" {
		return fmt.Errorf("registry %s is unreachable (%s): %w", p.host, cause, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("pushing %s to registry %s: %s: %w", ref, p.host, errdefs.ClipN(err.Error(), 300), errdefs.ErrUnavailable)
}

// errLayerRead marks a failure to read a layer directory (not the
// registry's fault).
var errLayerRead = errors.New("reading a layer")

// WriteLayer writes to w the OCI layer tar of dir, a directory in the
// overlay form of the layer store and of Unpack: whiteouts (character
// devices 0:0) become ".wh." entries and directories marked opaque get a
// ".wh..wh..opq" entry; owners, modes, modification times, hard links
// and xattrs (but overlayfs's own) are kept. Entries are in name order
// and carry no access or change times, so the same directory gives the
// same bytes.
func WriteLayer(ctx context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	lw := &layerWriter{tw: tw, root: dir, links: map[fileID]string{}}
	if err := lw.walk(ctx, ""); err != nil {
		return err
	}
	return tw.Close()
}

type fileID struct{ dev, ino uint64 }

type layerWriter struct {
	tw    *tar.Writer
	root  string
	links map[fileID]string // first name of each multiply linked file
}

// walk writes the entries under rel ("" for the root), in name order.
func (w *layerWriter) walk(ctx context.Context, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(w.root, rel))
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, n := range names {
		p := filepath.Join(rel, n)
		isDir, err := w.entry(p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if isDir {
			if err := w.walk(ctx, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// entry writes the entry at rel and says whether it is a directory to
// descend into.
func (w *layerWriter) entry(rel string) (bool, error) {
	full := filepath.Join(w.root, rel)
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		return false, err
	}
	h := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()).UTC(),
		Format:  tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return false, nil // layers hold no other device nodes
		}
		h.Name = filepath.Join(filepath.Dir(rel), whiteoutPrefix+filepath.Base(rel))
		// Its time is when it was made, not content: the same layer
		// must give the same tar.
		h.Typeflag, h.Mode, h.ModTime = tar.TypeReg, 0o600, time.Unix(0, 0).UTC()
		return false, w.tw.WriteHeader(h)
	case unix.S_IFDIR:
		h.Typeflag, h.Name = tar.TypeDir, rel+"/"
		opaque, err := w.xattrs(full, h)
		if err != nil {
			return false, err
		}
		if err := w.tw.WriteHeader(h); err != nil {
			return false, err
		}
		if opaque {
			m := &tar.Header{Name: filepath.Join(rel, opaqueMarker), Typeflag: tar.TypeReg, Mode: 0o600, ModTime: h.ModTime, Format: tar.FormatPAX}
			if err := w.tw.WriteHeader(m); err != nil {
				return false, err
			}
		}
		return true, nil
	case unix.S_IFLNK:
		target, err := os.Readlink(full)
		if err != nil {
			return false, err
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
		return false, w.tw.WriteHeader(h)
	case unix.S_IFREG:
		if st.Nlink > 1 {
			id := fileID{st.Dev, st.Ino}
			if first, ok := w.links[id]; ok {
				h.Typeflag, h.Linkname = tar.TypeLink, first
				return false, w.tw.WriteHeader(h)
			}
			w.links[id] = rel
		}
		if _, err := w.xattrs(full, h); err != nil {
			return false, err
		}
		h.Typeflag, h.Size = tar.TypeReg, st.Size
		f, err := os.Open(full)
		if err != nil {
			return false, err
		}
		defer f.Close()
		if err := w.tw.WriteHeader(h); err != nil {
			return false, err
		}
		if n, err := io.Copy(w.tw, io.LimitReader(f, st.Size)); err != nil {
			return false, err
		} else if n != st.Size {
			return false, fmt.Errorf("changed while being read: %w", syscall.EIO)
		}
		return false, nil
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
		return false, w.tw.WriteHeader(h)
	}
	return false, nil // sockets and block devices are not layer content
}

// xattrs puts the extended attributes of path into h's PAX records,
// except overlayfs's own, and says whether it is marked opaque.
func (w *layerWriter) xattrs(path string, h *tar.Header) (opaque bool, err error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(path, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, k := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if k == "" {
			continue
		}
		val := make([]byte, 64<<10)
		m, err := unix.Lgetxattr(path, k, val)
		if err != nil {
			return false, err
		}
		if k == opaqueXattr {
			opaque = string(val[:m]) == "y"
			continue
		}
		if strings.HasPrefix(k, "trusted.overlay.") {
			continue
		}
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords[xattrPAXPrefix+k] = string(val[:m])
	}
	return opaque, nil
}

// CompressedLayer writes the tar that write makes, gzipped, into the
// file path in one pass and returns it as an OCI layer (its digests are
// computed once, by reading the file back).
func CompressedLayer(ctx context.Context, path string, write func(io.Writer) error) (v1.Layer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zw, err := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if err := write(zw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return tarball.LayerFromFile(path, tarball.WithMediaType(types.OCILayer))
}
