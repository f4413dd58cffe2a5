package files

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"github.com/kiln-sh/kiln/api"
)

const (
	// maxListResult bounds a listing's encoded size: the result travels
	// in one channel frame (channel.MaxPayload, 256 KiB).
	maxListResult = 240 << 10
	// maxListEntries stops a walk early, long before memory matters.
	maxListEntries = 20000
)

// errTooMany stops a listing walk.
var errTooMany = errors.New("too many entries")

// Stat describes path itself (a symlink is not followed). With an
// xattrPrefix, the description carries its extended attributes under it
// (see Xattrs).
func (s *Service) Stat(ctx context.Context, u User, path, xattrPrefix string) (api.FileInfo, error) {
	p, err := Resolve(u, path)
	if err != nil {
		return api.FileInfo{}, err
	}
	if xattrPrefix != "" {
		if err := checkXattrPrefix(xattrPrefix); err != nil {
			return api.FileInfo{}, err
		}
	}
	var info api.FileInfo
	err = asUser(u, func() error {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		info = fileInfo(p, fi, loadNames())
		if xattrPrefix != "" {
			if info.Xattrs, err = readXattrs(p, xattrPrefix); err != nil && !ignorableXattrError(err) {
				return err
			}
		}
		return nil
	})
	return info, classify("stat", p, err)
}

// List describes the entries of a directory, descending depth levels (1,
// the default, lists the directory's own entries). A symlink named by
// path is followed; symlinks inside are listed, not followed. Entries of
// each directory are sorted by name, each directory's entries following
// the directory itself. With an xattrPrefix, each entry carries its
// extended attributes under it (see Xattrs).
func (s *Service) List(ctx context.Context, u User, path string, depth int, xattrPrefix string) ([]api.FileInfo, error) {
	p, err := Resolve(u, path)
	if err != nil {
		return nil, err
	}
	if xattrPrefix != "" {
		if err := checkXattrPrefix(xattrPrefix); err != nil {
			return nil, err
		}
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
		if err := listDir(ctx, p, depth, loadNames(), &out); err != nil || xattrPrefix == "" {
			return err
		}
		for i := range out {
			if out[i].Xattrs, err = readXattrs(out[i].Path, xattrPrefix); err != nil && !ignorableXattrError(err) {
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
	if b, _ := json.Marshal(out); len(b) > maxListResult {
		return nil, apiErrorf(api.CodeResourceExhausted, "listing %s: %d entries are too many for one reply; list with a smaller depth or a subdirectory", p, len(out))
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
