package layer

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// CopyParams are the inputs of a COPY or ADD step.
type CopyParams struct {
	// Step is the COPY or ADD step: Args[0] the source pattern (relative
	// to the build context; path.Match wildcards per component), Args[1]
	// the absolute destination, Args[2] an optional owner ("user",
	// "user:group", "uid[:gid]"), Args[3] an optional octal mode.
	Step api.TemplateStep
	// Files is the uploaded tar of the step's sources (plain or gzip),
	// with paths relative to the build context.
	Files io.Reader
	// Lower are the layers below, top first: the root filesystem the step
	// copies into, for the destination's symlinks and existing
	// directories and for owner names.
	Lower []string
	// Limit is the most bytes of file content the step may write (0: no
	// limit); over it the copy fails with ErrResourceExhausted.
	Limit int64
	Log   *slog.Logger
}

// Copy applies a COPY or ADD step to the empty layer directory dir, on the
// host (no sandbox), with Docker's (BuildKit's) rules:
//   - a source directory copies its contents, not itself;
//   - the destination is a directory when it ends in "/", when the
//     pattern matches several sources, when a source is a directory, or
//     when it already is one in the layers below (a file then goes into
//     it under its own name); an existing directory merges (it is not
//     made opaque), and an existing non-directory where a directory is
//     needed is an error;
//   - missing parent directories are made 0755; existing ones below keep
//     their attributes;
//   - what is copied, and the directories the copy makes, belong to root
//     unless an owner is given; names resolve against the /etc/passwd and
//     /etc/group of the layers below;
//   - the mode, when given, applies to every file and directory copied;
//   - ADD unpacks a source that is a tar archive (plain, gzip, bzip2, or
//     xz when the host has the xz tool) into the destination, keeping the
//     archive's owners unless one is given.
//
// A pattern that matches nothing is ErrInvalidArgument ("COPY data.csv: no
// such file in the build context"). Nothing is written outside dir: the
// destination's symlinks are resolved inside the view of Lower, and
// entries of the uploaded tar cannot climb out of it or write through
// links. On error dir holds a partial copy; discard it.
func Copy(ctx context.Context, dir string, p CopyParams) error {
	op, err := parseCopy(p.Step)
	if err != nil {
		return err
	}
	v, err := openView(p.Lower)
	if err != nil {
		return err
	}
	defer v.Close()
	c := &copier{op: op, v: v}
	if op.owner != "" {
		if c.uid, c.gid, err = v.owner(op.owner); err != nil {
			return fmt.Errorf("%s --chown: %w", op.kind, err)
		}
	}
	root, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("opening layer dir: %w", err)
	}
	defer root.Close()
	c.layer = &tree{root: root, parent: c.layerParent, xattr: untrustedXattr, noDevices: true, log: p.Log}
	// The view with the new layer on top, for ADD: an archive's entries
	// resolve their directories through what it unpacked before them.
	if c.top, err = openView(append([]string{dir}, p.Lower...)); err != nil {
		return err
	}
	defer c.top.Close()
	stage, err := c.makeStage(root)
	if err != nil {
		return err
	}
	defer func() { _ = removeAt(root, c.stageName) }()
	defer stage.Close()
	c.stage = &tree{root: stage, limit: p.Limit, parent: c.newDir, xattr: untrustedXattr, noDevices: true, log: p.Log}

	files, done, err := decompress(ctx, p.Files)
	if err == nil {
		if err = untar(ctx, c.stage, files, c.fixSource); err == nil {
			err = c.stage.finish()
		}
		if derr := done(); err == nil {
			err = derr
		}
	}
	if err != nil {
		return fmt.Errorf("unpacking the build context: %w", err)
	}
	if p.Limit > 0 {
		c.layer.limit = p.Limit - c.stage.written
	}
	if err := c.run(ctx); err != nil {
		return err
	}
	if err := removeAt(root, c.stageName); err != nil {
		return err
	}
	if err := c.layer.finish(); err != nil {
		return err
	}
	// The layer's root stands for "/": it keeps the attributes it has below.
	h, err := c.layerParent(".")
	if err != nil {
		return err
	}
	return c.layer.setMeta(root, "", h)
}

// copyOp is a parsed COPY or ADD step.
type copyOp struct {
	kind, src, dest, owner string
	mode                   int64 // -1: keep
}

func parseCopy(s api.TemplateStep) (copyOp, error) {
	op := copyOp{kind: s.Type, mode: -1}
	if s.Type != api.StepCopy && s.Type != api.StepAdd {
		return op, fmt.Errorf("step %q is not COPY or ADD: %w", errdefs.Clip(s.Type), errdefs.ErrInvalidArgument)
	}
	if len(s.Args) < 2 || len(s.Args) > 4 {
		return op, fmt.Errorf("%s: want source, destination[, owner[, mode]]: %w", op.kind, errdefs.ErrInvalidArgument)
	}
	op.src, op.dest = s.Args[0], s.Args[1]
	if len(s.Args) > 2 {
		op.owner = s.Args[2]
	}
	if len(s.Args) > 3 && s.Args[3] != "" {
		m, err := strconv.ParseUint(s.Args[3], 8, 32)
		if err != nil || m > 0o7777 {
			return op, fmt.Errorf("%s: mode %q is not an octal file mode: %w", op.kind, errdefs.Clip(s.Args[3]), errdefs.ErrInvalidArgument)
		}
		op.mode = int64(m)
	}
	if !strings.HasPrefix(op.dest, "/") || strings.Contains(op.dest, "\x00") {
		return op, fmt.Errorf("%s: destination %q is not an absolute path: %w", op.kind, errdefs.Clip(op.dest), errdefs.ErrInvalidArgument)
	}
	src := strings.TrimLeft(op.src, "/") // Docker: "/x" is x in the context
	if _, err := cleanRel(src); err != nil || src == "" && op.src == "" {
		return op, fmt.Errorf("%s %s: source outside the build context: %w", op.kind, errdefs.Clip(op.src), errdefs.ErrInvalidArgument)
	}
	op.src = path.Clean("/" + src)[1:]
	if op.src == "" {
		op.src = "."
	}
	if _, err := path.Match(op.src, ""); err != nil {
		return op, fmt.Errorf("%s %s: bad pattern: %w", op.kind, errdefs.Clip(op.src), errdefs.ErrInvalidArgument)
	}
	return op, nil
}

// copier carries one Copy: the sources are unpacked into a staging
// directory inside the layer dir (same filesystem), then moved into place
// with renames.
type copier struct {
	op        copyOp
	v         *view // the layers below
	top       *view // the new layer over them
	uid, gid  int
	layer     *tree
	stage     *tree
	stageName string
}

// untrustedXattr drops trusted.* attributes (overlayfs's own among them)
// from anything a user uploaded.
func untrustedXattr(k, _ string) bool { return !strings.HasPrefix(k, "trusted.") }

func (c *copier) makeStage(root *os.File) (*os.File, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	c.stageName = ".kiln-copy-" + hex.EncodeToString(b[:])
	if err := unix.Mkdirat(int(root.Fd()), c.stageName, 0o700); err != nil {
		return nil, fmt.Errorf("making staging dir: %w", err)
	}
	return openDir(root, c.stageName)
}

// fixSource gives a build-context entry the step's owner and mode.
func (c *copier) fixSource(h *tar.Header) bool {
	h.Uid, h.Gid = c.uid, c.gid
	if c.op.mode >= 0 && h.Typeflag != tar.TypeSymlink {
		h.Mode = c.op.mode
	}
	return true
}

// newDir describes a directory the copy makes: 0755 (or the step's
// mode), owned by the step's owner.
func (c *copier) newDir(rel string) (*tar.Header, error) {
	h, _ := rootParent(rel)
	h.Uid, h.Gid = c.uid, c.gid
	if c.op.mode >= 0 {
		h.Mode = c.op.mode
	}
	return h, nil
}

// layerParent describes a directory of the layer that is missing: the
// directory below if there is one (same attributes), else a new one.
func (c *copier) layerParent(rel string) (*tar.Header, error) {
	n, err := c.v.lookup("/"+rel, false)
	if err != nil {
		return nil, err
	}
	if !n.isDir() {
		if rel == "." {
			return rootParent(rel)
		}
		return c.newDir(rel)
	}
	return c.v.header(n, rel)
}

// run copies the staged sources to the destination.
func (c *copier) run(ctx context.Context) error {
	matches, err := c.match()
	if err != nil {
		return err
	}
	if len(matches) == 0 {
		return fmt.Errorf("%s %s: no such file in the build context: %w", c.op.kind, errdefs.Clip(c.op.src), errdefs.ErrInvalidArgument)
	}
	dest, err := c.v.lookup(c.op.dest, true)
	if err != nil {
		return fmt.Errorf("%s destination: %w", c.op.kind, err)
	}
	destDir := strings.HasSuffix(c.op.dest, "/") || len(matches) > 1 || dest.isDir()
	kinds := make([]srcKind, len(matches))
	var dirSrc string
	for i, m := range matches {
		if kinds[i], err = c.kindOf(ctx, m); err != nil {
			return err
		}
		if kinds[i] != srcFile {
			destDir = true
		}
		if kinds[i] == srcDir && dirSrc == "" {
			dirSrc = m
		}
	}
	if destDir && dest.exists && !dest.isDir() {
		return fmt.Errorf("%s: destination %s is not a directory: %w", c.op.kind, errdefs.Clip(c.op.dest), errdefs.ErrInvalidArgument)
	}
	destRel := strings.TrimPrefix(dest.real, "/")
	if destRel == "" {
		destRel = "."
	}
	if destDir && destRel != "." {
		if err := c.makeDest(destRel, dest.exists, dirSrc); err != nil {
			return err
		}
	}
	for i, m := range matches {
		if err := ctx.Err(); err != nil {
			return err
		}
		switch kinds[i] {
		case srcDir:
			names, err := c.stageNames(m)
			if err != nil {
				return err
			}
			for _, n := range names {
				if err := c.move(path.Join(m, n), path.Join(destRel, n)); err != nil {
					return err
				}
			}
		case srcArchive:
			if err := c.unpack(ctx, m, destRel); err != nil {
				return err
			}
		default:
			target := destRel
			if destDir {
				target = path.Join(destRel, path.Base(m))
			}
			if err := c.move(m, target); err != nil {
				return err
			}
		}
	}
	return nil
}

type srcKind int

const (
	srcFile srcKind = iota
	srcDir
	srcArchive // ADD of a local tar
)

func (c *copier) kindOf(ctx context.Context, m string) (srcKind, error) {
	st, err := c.stageStat(m)
	if err != nil {
		return 0, err
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return srcDir, nil
	case c.op.kind != api.StepAdd || st.Mode&unix.S_IFMT != unix.S_IFREG:
		return srcFile, nil
	}
	f, err := openBeneath(c.stage.root, m, unix.O_RDONLY)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	r, done, err := decompress(ctx, f)
	if errors.Is(err, errNoXZ) {
		return 0, fmt.Errorf("ADD %s: %w", errdefs.Clip(m), err)
	}
	if err != nil {
		return srcFile, nil // not a readable archive: copied as is
	}
	tarred := isTar(bufio.NewReader(r))
	_ = done()
	if tarred {
		return srcArchive, nil
	}
	return srcFile, nil
}

// makeDest makes the destination directory (and its parents) in the
// layer: the directory below if there is one, else a new one that takes
// the attributes of the source directory dirSrc when there is one.
func (c *copier) makeDest(destRel string, exists bool, dirSrc string) error {
	if exists {
		return c.layer.mkdirs(destRel)
	}
	dir, _ := splitRel(destRel)
	if err := c.layer.mkdirs(dir); err != nil {
		return err
	}
	h, _ := c.newDir(destRel)
	if dirSrc != "" {
		sh, err := c.stageHeader(dirSrc)
		if err != nil {
			return err
		}
		sh.Name = destRel
		h = sh
	}
	return c.layer.put(h, nil)
}

// match lists the staged sources the pattern names, sorted.
func (c *copier) match() ([]string, error) {
	pat := c.op.src
	if !strings.ContainsAny(pat, `*?[\`) {
		if _, err := c.stageStat(pat); errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		return []string{pat}, nil
	}
	segs := strings.Split(pat, "/")
	var out []string
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		names, err := c.stageNames(dir)
		if err != nil {
			return err
		}
		for _, n := range names {
			if ok, _ := path.Match(segs[depth], n); !ok {
				continue
			}
			rel := path.Join(dir, n)
			if depth == len(segs)-1 {
				out = append(out, rel)
				continue
			}
			if st, err := c.stageStat(rel); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if err := walk(rel, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(".", 0); err != nil {
		return nil, err
	}
	return out, nil
}

func (c *copier) stageStat(rel string) (unix.Stat_t, error) {
	dir, name := splitRel(rel)
	if rel == "." {
		dir, name = ".", "."
	}
	d, err := openDir(c.stage.root, dir)
	if err != nil {
		return unix.Stat_t{}, err
	}
	defer d.Close()
	return lstatAt(d, name)
}

func (c *copier) stageHeader(rel string) (*tar.Header, error) {
	st, err := c.stageStat(rel)
	if err != nil {
		return nil, err
	}
	dir, name := splitRel(rel)
	if rel == "." {
		dir, name = ".", ""
	}
	d, err := openDir(c.stage.root, dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return header(d, name, rel, &st)
}

func (c *copier) stageNames(dir string) ([]string, error) {
	d, err := openDir(c.stage.root, dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	sort.Strings(names)
	return names, err
}

// move renames the staged src to dst in the layer; a directory over a
// directory the copy already made merges into it.
func (c *copier) move(src, dst string) error {
	sh, err := c.stageHeader(src)
	if err != nil {
		return err
	}
	sh.Name = dst
	dd, dname, err := c.layer.openParent(dst)
	if err != nil {
		return err
	}
	defer dd.Close()
	st, err := lstatAt(dd, dname)
	if errors.Is(err, unix.ENOENT) && sh.Typeflag == tar.TypeDir {
		// A directory onto a symlink below that leads to a directory
		// (/bin -> usr/bin) goes into that directory, as in Docker.
		if real, ok := c.symlinkedDir(c.v, dst); ok {
			return c.mergeInto(src, real)
		}
	}
	if err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFDIR && sh.Typeflag == tar.TypeDir {
			if err := c.mergeInto(src, dst); err != nil {
				return err
			}
			return c.layer.put(sh, nil) // the later source's attributes win
		}
		if err := removeAt(dd, dname); err != nil {
			return err
		}
	}
	sdir, sname := splitRel(src)
	sd, err := openDir(c.stage.root, sdir)
	if err != nil {
		return err
	}
	defer sd.Close()
	if err := unix.Renameat(int(sd.Fd()), sname, int(dd.Fd()), dname); err != nil {
		return fmt.Errorf("moving %s into place: %w", errdefs.Clip(src), err)
	}
	if sh.Typeflag == tar.TypeDir {
		c.layer.dirs = append(c.layer.dirs, sh) // its mtime, once its parent is done
	}
	return nil
}

// mergeInto moves the contents of the staged directory src into the
// directory dst.
func (c *copier) mergeInto(src, dst string) error {
	if err := c.layer.mkdirs(dst); err != nil {
		return err
	}
	names, err := c.stageNames(src)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := c.move(path.Join(src, n), path.Join(dst, n)); err != nil {
			return err
		}
	}
	return nil
}

// symlinkedDir reports the directory that rel, a symlink in v, leads to.
func (c *copier) symlinkedDir(v *view, rel string) (string, bool) {
	n, err := v.lookup("/"+rel, true)
	if err != nil || !n.isDir() || n.real == "/"+rel {
		return "", false
	}
	if n.real == "/" {
		return ".", true
	}
	return n.real[1:], true
}

// resolveParent rewrites rel so that its directory is the one the view of
// the new layer over the layers below resolves it to (an entry bin/x of an
// archive lands in usr/bin/x when bin -> usr/bin).
func (c *copier) resolveParent(rel string) string {
	dir, name := splitRel(rel)
	if dir == "" || name == "" {
		return rel
	}
	if real, ok := c.symlinkedDir(c.top, dir); ok {
		return path.Join(real, name)
	}
	return rel
}

// unpack extracts the staged archive src into the directory destRel.
func (c *copier) unpack(ctx context.Context, src, destRel string) error {
	f, err := openBeneath(c.stage.root, src, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer f.Close()
	r, done, err := decompress(ctx, f)
	if err != nil {
		return fmt.Errorf("ADD %s: %w", errdefs.Clip(src), err)
	}
	err = untar(ctx, c.layer, r, func(h *tar.Header) bool {
		h.Name = c.resolveParent(path.Join(destRel, h.Name))
		if h.Typeflag == tar.TypeLink {
			h.Linkname = c.resolveParent(path.Join(destRel, h.Linkname))
		}
		if c.op.owner != "" {
			h.Uid, h.Gid = c.uid, c.gid
		}
		if c.op.mode >= 0 && h.Typeflag != tar.TypeSymlink {
			h.Mode = c.op.mode
		}
		return true
	})
	if derr := done(); err == nil {
		err = derr
	}
	if err != nil {
		return fmt.Errorf("ADD %s: unpacking: %w", errdefs.Clip(src), err)
	}
	return nil
}
