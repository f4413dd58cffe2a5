package layer

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// view is the merged, read-only root filesystem that a stack of layers
// (top first) makes under overlayfs, resolved here without mounting it:
// the topmost entry of a path wins, a whiteout (character device 0:0)
// hides the path below, a directory merges with the directories below it
// down to the first opaque one, and symlinks resolve inside the view,
// never on the host.
type view struct {
	roots []*os.File
}

// maxLinks is how many symlinks one lookup follows (Linux's MAXSYMLINKS).
const maxLinks = 40

func openView(dirs []string) (*view, error) {
	v := &view{}
	for _, d := range dirs {
		f, err := os.OpenFile(d, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			v.Close()
			return nil, fmt.Errorf("opening lower layer: %w", err)
		}
		v.roots = append(v.roots, f)
	}
	return v, nil
}

func (v *view) Close() {
	for _, f := range v.roots {
		f.Close()
	}
}

// node is what a path names in the view.
type node struct {
	real   string // absolute, clean, every symlink resolved
	exists bool
	st     unix.Stat_t // of the topmost entry
	layer  int         // index of the layer holding the topmost entry
	layers []int       // for a directory: the layers merged into it, top first
}

func (n node) isDir() bool { return n.exists && n.st.Mode&unix.S_IFMT == unix.S_IFDIR }

// lookup resolves the absolute path p in the view, following a symlink in
// its last component if follow. A path whose parent exists but which does
// not is returned with exists false and real set to where it would be.
func (v *view) lookup(p string, follow bool) (node, error) {
	todo := splitPath(p)
	var real []string
	cur := v.rootNode()
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case ".":
			continue
		case "..":
			if len(real) > 0 {
				real = real[:len(real)-1]
			}
			var err error
			if cur, err = v.dirNode(real); err != nil {
				return node{}, err
			}
			continue
		}
		rel := strings.Join(append(append([]string{}, real...), c), "/")
		n, err := v.entry(cur.layers, rel)
		if err != nil {
			return node{}, err
		}
		if !n.exists {
			rest := path.Clean("/" + strings.Join(append(append(real, c), todo...), "/"))
			for _, t := range todo {
				if t == ".." {
					return node{}, fmt.Errorf("%s: no such directory: %w", errdefs.Clip(p), errdefs.ErrInvalidArgument)
				}
			}
			return node{real: rest}, nil
		}
		if n.st.Mode&unix.S_IFMT == unix.S_IFLNK && (len(todo) > 0 || follow) {
			if links++; links > maxLinks {
				return node{}, fmt.Errorf("%s: too many levels of symbolic links: %w", errdefs.Clip(p), errdefs.ErrInvalidArgument)
			}
			target, err := v.readlink(n)
			if err != nil {
				return node{}, err
			}
			if strings.HasPrefix(target, "/") {
				real, cur = nil, v.rootNode()
			}
			todo = append(splitPath(target), todo...)
			continue
		}
		real = append(real, c)
		if len(todo) > 0 && !n.isDir() {
			return node{}, fmt.Errorf("%s: %s is not a directory: %w", errdefs.Clip(p), errdefs.Clip("/"+n.real), errdefs.ErrInvalidArgument)
		}
		cur = n
	}
	cur.real = "/" + strings.Join(real, "/")
	return cur, nil
}

func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// rootNode is "/": every layer's root merges into it.
func (v *view) rootNode() node {
	n := node{real: "/", exists: len(v.roots) > 0}
	for i := range v.roots {
		n.layers = append(n.layers, i)
	}
	if n.exists {
		_ = unix.Fstat(int(v.roots[0].Fd()), &n.st)
	}
	return n
}

// dirNode walks the resolved directory path real from the root.
func (v *view) dirNode(real []string) (node, error) {
	cur := v.rootNode()
	for i := range real {
		n, err := v.entry(cur.layers, strings.Join(real[:i+1], "/"))
		if err != nil {
			return node{}, err
		}
		cur = n
	}
	return cur, nil
}

// entry finds rel (resolved, relative) among layers, the layers its parent
// directory merges, top first.
func (v *view) entry(layers []int, rel string) (node, error) {
	for k, i := range layers {
		st, ok, err := v.lstat(i, rel)
		if err != nil {
			return node{}, err
		}
		if !ok {
			continue
		}
		if isWhiteout(&st) {
			return node{real: rel}, nil
		}
		n := node{real: rel, exists: true, st: st, layer: i}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return n, nil
		}
		n.layers = []int{i}
		if v.opaque(i, rel) {
			return n, nil
		}
		for _, j := range layers[k+1:] {
			st, ok, err := v.lstat(j, rel)
			if err != nil {
				return node{}, err
			}
			if !ok {
				continue
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				break // a whiteout or a file ends the merge
			}
			n.layers = append(n.layers, j)
			if v.opaque(j, rel) {
				break
			}
		}
		return n, nil
	}
	return node{real: rel}, nil
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// lstat stats rel in layer i; ok is false when it is not there.
func (v *view) lstat(i int, rel string) (unix.Stat_t, bool, error) {
	dir, name := splitRel(rel)
	d, err := openDir(v.roots[i], dir)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return unix.Stat_t{}, false, nil
	}
	if err != nil {
		return unix.Stat_t{}, false, fmt.Errorf("reading lower layer: %w", err)
	}
	defer d.Close()
	st, err := lstatAt(d, name)
	if errors.Is(err, unix.ENOENT) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("reading lower layer: %w", err)
	}
	return st, true, nil
}

func (v *view) opaque(i int, rel string) bool {
	d, err := openDir(v.roots[i], rel)
	if err != nil {
		return false
	}
	defer d.Close()
	val, err := getXattr(procPath(d, ""), opaqueXattr)
	return err == nil && val == "y"
}

const opaqueXattr = "trusted.overlay.opaque"

func (v *view) readlink(n node) (string, error) {
	dir, name := splitRel(n.real)
	d, err := openDir(v.roots[n.layer], dir)
	if err != nil {
		return "", err
	}
	defer d.Close()
	buf := make([]byte, unix.PathMax)
	k, err := unix.Readlinkat(int(d.Fd()), name, buf)
	if err != nil {
		return "", fmt.Errorf("reading a lower layer's symlink: %w", err)
	}
	return string(buf[:k]), nil
}

// header describes the entry n (an existing node) for copying its
// metadata, named rel.
func (v *view) header(n node, rel string) (*tar.Header, error) {
	dir, name := splitRel(strings.TrimPrefix(n.real, "/"))
	if n.real == "/" {
		dir, name = "", ""
	}
	d, err := openDir(v.roots[n.layer], dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return header(d, name, rel, &n.st)
}

// readFile reads the regular file p of the view (symlinks followed), at
// most max bytes; a missing file is ErrNotFound.
func (v *view) readFile(p string, max int64) ([]byte, error) {
	n, err := v.lookup(p, true)
	if err != nil {
		return nil, err
	}
	if !n.exists || n.st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%s: %w", p, errdefs.ErrNotFound)
	}
	f, err := openBeneath(v.roots[n.layer], strings.TrimPrefix(n.real, "/"), unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}
