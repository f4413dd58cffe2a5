package files

import (
	"context"
	"os"
	"path/filepath"

	"github.com/kiln-sh/kiln/api"
)

// Mkdir creates a directory and its missing parents (mode 0755, owned by
// the user), like mkdir -p. An existing directory is not an error.
func (s *Service) Mkdir(ctx context.Context, u User, path string) (api.FileInfo, error) {
	p, err := Resolve(u, path)
	if err != nil {
		return api.FileInfo{}, err
	}
	var info api.FileInfo
	err = asUser(u, func() error {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		info = fileInfo(p, fi, loadNames())
		return nil
	})
	return info, classify("creating directory", p, err)
}

// Move renames from to to, creating to's missing parents. It replaces an
// existing file at to (rename(2) semantics); moving across file systems is
// a failed precondition.
func (s *Service) Move(ctx context.Context, u User, from, to string) (api.FileInfo, error) {
	src, err := Resolve(u, from)
	if err != nil {
		return api.FileInfo{}, err
	}
	dst, err := Resolve(u, to)
	if err != nil {
		return api.FileInfo{}, err
	}
	var info api.FileInfo
	err = asUser(u, func() error {
		if _, err := os.Lstat(src); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.Rename(src, dst); err != nil {
			return err
		}
		fi, err := os.Lstat(dst)
		if err != nil {
			return err
		}
		info = fileInfo(dst, fi, loadNames())
		return nil
	})
	return info, classify("moving", src+" to "+dst, err)
}

// Remove removes a file, a symlink (not its target) or a directory tree.
// A missing path is not_found; "/" is refused.
func (s *Service) Remove(ctx context.Context, u User, path string) error {
	p, err := Resolve(u, path)
	if err != nil {
		return err
	}
	if p == "/" {
		return apiErrorf(api.CodeInvalidArgument, "refusing to remove /")
	}
	err = asUser(u, func() error {
		if _, err := os.Lstat(p); err != nil {
			return err
		}
		return os.RemoveAll(p)
	})
	return classify("removing", p, err)
}
