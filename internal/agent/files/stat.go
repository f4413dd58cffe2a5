package files

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/kiln-sh/kiln/api"
)

// maxListEntries stops a walk early, long before memory matters.
const maxListEntries = 20000

// errTooMany stops a listing walk.
var errTooMany = errors.New("too many entries")

// Detail is what Stat and List add to a description beyond stat(2).
type Detail struct {
	// XattrPrefix adds the extended attributes whose names start with it
	// (it must start with "user."), keyed by the rest of their names.
	XattrPrefix string
	// Links adds to a symlink what it finally points to (FileInfo.Target),
	// unless it is broken.
	Links bool
}

func (d Detail) check() error {
	if d.XattrPrefix == "" {
		return nil
	}
	return checkXattrPrefix(d.XattrPrefix)
}

// add adds the details to info; it runs as the user.
func (d Detail) add(info *api.FileInfo, n *names) error {
	if d.Links && info.Type == api.FileSymlink {
		if t, err := filepath.EvalSymlinks(info.Path); err == nil {
			if fi, err := os.Stat(t); err == nil {
				target := fileInfo(t, fi, n)
				info.Target = &target
			}
		}
	}
	if d.XattrPrefix != "" {
		var err error
		if info.Xattrs, err = readXattrs(info.Path, d.XattrPrefix); err != nil && !ignorableXattrError(err) {
			return err
		}
	}
	return nil
}

// Stat describes path itself (a symlink is not followed), with details.
func (s *Service) Stat(ctx context.Context, u User, path string, d Detail) (api.FileInfo, error) {
	p, err := Resolve(u, path)
	if err != nil {
		return api.FileInfo{}, err
	}
	if err := d.check(); err != nil {
		return api.FileInfo{}, err
	}
	var info api.FileInfo
	err = asUser(u, func() error {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		n := loadNames()
		info = fileInfo(p, fi, n)
		return d.add(&info, n)
	})
	return info, classify("stat", p, err)
}

// List describes the entries of a directory, descending depth levels (1,
// the default, lists the directory's own entries). A symlink named by
// path is followed; symlinks inside are listed, not followed. Entries of
// each directory are sorted by name, each directory's entries following
// the directory itself. Each entry has the details d asks for.
func (s *Service) List(ctx context.Context, u User, path string, depth int, d Detail) ([]api.FileInfo, error) {
	p, err := Resolve(u, path)
	if err != nil {
		return nil, err
	}
	if err := d.check(); err != nil {
		return nil, err
	}
	depth = max(depth, 1)
	out := []api.FileInfo{}
	err = asUser(u, func() error {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return apiErrorf(api.CodeInvalidArgument, "listing %s: not a directory", p)
		}
		n := loadNames()
		if err := listDir(ctx, p, depth, n, &out); err != nil || d == (Detail{}) {
			return err
		}
		for i := range out {
			if err := d.add(&out[i], n); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, errTooMany) {
		return nil, apiErrorf(api.CodeResourceExhausted, "listing %s: more than %d entries; list with a smaller depth", p, maxListEntries)
	}
	if err != nil {
		return nil, classify("listing", p, err)
	}
	return out, nil
}

func listDir(ctx context.Context, dir string, depth int, n *names, out *[]api.FileInfo) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		fi, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		if len(*out) >= maxListEntries {
			return errTooMany
		}
		*out = append(*out, fileInfo(p, fi, n))
		if depth > 1 && fi.IsDir() {
			if err := listDir(ctx, p, depth-1, n, out); err != nil && !os.IsPermission(err) {
				return err
			}
		}
	}
	return nil
}
