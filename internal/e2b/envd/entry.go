package envd

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"sync"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// metadataXattrs is where envd keeps a file's metadata: extended
// attributes user.e2b.<key>.
const metadataXattrs = "user.e2b."

// maxLinkHops bounds how many symlinks entry follows, as the kernel does.
const maxLinkHops = 40

// entry describes fi as envd does: a symlink reports the type and mode of
// what it finally points to and that target's absolute path (a broken
// link: unspecified type and its own path), but its own name, size and
// permission string.
func (t *target) entry(ctx context.Context, user string, fi api.FileInfo) (*filesystem.EntryInfo, error) {
	e := &filesystem.EntryInfo{
		Name:         fi.Name,
		Type:         fileType(fi.Type),
		Path:         fi.Path,
		Size:         fi.Size,
		Mode:         fi.Mode & 0o777,
		Permissions:  fileMode(fi).String(),
		Owner:        fi.Owner,
		Group:        fi.Group,
		ModifiedTime: timestamppb.New(fi.ModTime),
		Metadata:     fi.Xattrs,
	}
	if fi.Type != api.FileSymlink {
		return e, nil
	}
	if fi.Target != nil { // the agent resolved it
		e.Type, e.Mode, e.SymlinkTarget = fileType(fi.Target.Type), fi.Target.Mode&0o777, &fi.Target.Path
		return e, nil
	}
	target, err := t.resolveLink(ctx, user, fi)
	switch {
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrInvalidArgument), errors.Is(err, errdefs.ErrPermissionDenied):
		e.Type, e.Mode, e.SymlinkTarget = filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0, &fi.Path
	case err != nil:
		return nil, err
	default:
		e.Type, e.Mode, e.SymlinkTarget = fileType(target.Type), target.Mode&0o777, &target.Path
	}
	return e, nil
}

// linkWorkers bounds the symlinks of one listing resolved at once; each
// is an agent round trip, and the channel carries many calls at a time.
const linkWorkers = 16

// entries describes a listing, resolving the symlinks the agent did not
// (the broken ones) concurrently.
func (t *target) entries(ctx context.Context, user string, fis []api.FileInfo) ([]*filesystem.EntryInfo, error) {
	out := make([]*filesystem.EntryInfo, len(fis))
	errs := make([]error, len(fis))
	sem := make(chan struct{}, linkWorkers)
	var wg sync.WaitGroup
	for i, fi := range fis {
		if fi.Type != api.FileSymlink || fi.Target != nil {
			out[i], errs[i] = t.entry(ctx, user, fi)
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = t.entry(ctx, user, fi)
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// resolveLink follows the symlink fi to what it finally names, one agent
// call per link, for descriptions the agent made without ResolveLinks
// and for broken links.
func (t *target) resolveLink(ctx context.Context, user string, fi api.FileInfo) (api.FileInfo, error) {
	for range maxLinkHops {
		next := fi.SymlinkTarget
		if !path.IsAbs(next) {
			next = path.Join(path.Dir(fi.Path), next)
		}
		var err error
		if fi, err = t.agent.Stat(ctx, wire.PathParams{Path: next, User: user}); err != nil {
			return fi, err
		}
		if fi.Type != api.FileSymlink || fi.Target != nil {
			return fi, nil
		}
	}
	return fi, errdefs.ErrInvalidArgument // a loop: ELOOP
}

func fileType(t api.FileType) filesystem.FileType {
	switch t {
	case api.FileRegular:
		return filesystem.FileType_FILE_TYPE_FILE
	case api.FileDir:
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case api.FileSymlink:
		return filesystem.FileType_FILE_TYPE_SYMLINK
	}
	return filesystem.FileType_FILE_TYPE_UNSPECIFIED
}

// fileMode rebuilds Go's fs.FileMode of fi, for envd's permissions string
// ("-rw-r--r--", "drwxr-xr-x", "Lrwxrwxrwx").
func fileMode(fi api.FileInfo) fs.FileMode {
	m := fs.FileMode(fi.Mode & 0o777)
	switch fi.Type {
	case api.FileDir:
		m |= fs.ModeDir
	case api.FileSymlink:
		m |= fs.ModeSymlink
	case api.FileOther:
		m |= fs.ModeIrregular
	}
	for bit, mode := range map[uint32]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if fi.Mode&bit != 0 {
			m |= mode
		}
	}
	return m
}
