package dockerfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"unicode/utf16"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Context is a build context: the directory COPY and ADD sources are
// relative to, minus what its .dockerignore excludes (Docker's rules,
// with ! exceptions). Symbolic links are never followed: a link is
// copied as a link. Sockets, FIFOs and devices are left out.
type Context struct {
	root   *os.Root
	ignore *patternmatcher.PatternMatcher // nil: nothing is ignored
}

// OpenContext opens dir as a build context, reading its .dockerignore.
func OpenContext(dir string) (*Context, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("opening build context: %w", err)
	}
	c := &Context{root: root}
	f, err := root.Open(".dockerignore")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return c, nil
	case err != nil:
		root.Close()
		return nil, fmt.Errorf("reading .dockerignore: %w", err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err == nil {
		c.ignore, err = patternmatcher.New(patterns)
	}
	if err != nil {
		root.Close()
		return nil, fmt.Errorf(".dockerignore: %s: %w", errdefs.Clip(err.Error()), errdefs.ErrInvalidArgument)
	}
	return c, nil
}

// Close releases the context directory.
func (c *Context) Close() error { return c.root.Close() }

// entry is one file, directory or link a COPY source takes.
type entry struct {
	rel  string // slash path relative to the context root; "." is the root
	info fs.FileInfo
}

// files returns what the source pattern src takes (a matched directory
// with everything in it), in E2B's order: sorted by path, compared as
// JavaScript compares strings.
func (c *Context) files(src string) ([]entry, error) {
	src, err := cleanSource(src)
	if err != nil {
		return nil, err
	}
	comps := strings.Split(src, "/")
	static := 0
	for static < len(comps) && !hasMeta(comps[static]) {
		static++
	}
	// The directory to search from, and whether .dockerignore excludes it.
	base, info, ignored := ".", patternmatcher.MatchInfo{}, false
	if src != "." {
		for i := range static {
			base = path.Join(comps[:i+1]...)
			if ignored, info, err = c.ignored(base, info); err != nil {
				return nil, err
			}
		}
	}
	var out []entry
	add := func(e entry, ignored bool) error {
		if !ignored {
			out = append(out, e)
		}
		return nil
	}
	if static == len(comps) {
		// A literal path: it and, if a directory, all it holds.
		fi, err := c.root.Lstat(base)
		if errors.Is(err, fs.ErrNotExist) || err == nil && !copyable(fi) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("build context: %w", err)
		}
		if !ignored {
			out = append(out, entry{rel: base, info: fi})
		}
		// An excluded directory still holds what an ! exception keeps.
		if fi.IsDir() && (!ignored || c.mayKeepBelow(base)) {
			err = c.walk(base, info, func(string) bool { return true }, add)
		}
		return sortEntries(out), err
	}
	if _, err := path.Match(src, ""); err != nil {
		return nil, fmt.Errorf("source pattern %q: %w: %w", errdefs.Clip(src), err, errdefs.ErrInvalidArgument)
	}
	if fi, err := c.root.Lstat(base); err != nil || !fi.IsDir() {
		return nil, nil
	}
	// A glob: every path it matches (path.Match, as Docker's COPY), with
	// the contents of matched directories. Below the pattern's depth only
	// those contents can match, so only they are searched.
	in := map[string]bool{}
	err = c.walk(base, info, func(dir string) bool {
		return in[dir] || strings.Count(dir, "/")+1 < len(comps)
	}, func(e entry, ignored bool) error {
		if ok, _ := path.Match(src, e.rel); ok || in[path.Dir(e.rel)] {
			in[e.rel] = true
			return add(e, ignored)
		}
		return nil
	})
	return sortEntries(out), err
}

// walk calls fn for each entry below dir that .dockerignore keeps, and
// descends into the subdirectories descend accepts. An excluded directory
// that an ! exception may take something back from is passed to fn as
// ignored and always descended into. info is dir's own match state.
func (c *Context) walk(dir string, info patternmatcher.MatchInfo, descend func(string) bool, fn func(e entry, ignored bool) error) error {
	f, err := c.root.Open(dir)
	if err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	list, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	slices.SortFunc(list, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, d := range list {
		rel := path.Join(dir, d.Name())
		ignored, mi, err := c.ignored(rel, info)
		if err != nil {
			return err
		}
		fi, err := d.Info() // Lstat
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return fmt.Errorf("build context: %w", err)
		}
		if !copyable(fi) {
			continue
		}
		keepBelow := ignored && fi.IsDir() && c.mayKeepBelow(rel)
		if ignored && !keepBelow {
			continue
		}
		if err := fn(entry{rel: rel, info: fi}, ignored); err != nil {
			return err
		}
		if fi.IsDir() && (keepBelow || descend(rel)) {
			if err := c.walk(rel, mi, descend, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// ignored reports whether .dockerignore excludes rel, given its parent's
// match state.
func (c *Context) ignored(rel string, parent patternmatcher.MatchInfo) (bool, patternmatcher.MatchInfo, error) {
	if c.ignore == nil {
		return false, parent, nil
	}
	ok, mi, err := c.ignore.MatchesUsingParentResults(rel, parent)
	if err != nil {
		return false, mi, fmt.Errorf(".dockerignore: %s: %w", errdefs.Clip(err.Error()), errdefs.ErrInvalidArgument)
	}
	return ok, mi, nil
}

// mayKeepBelow reports whether an ! exception could take back something
// inside the excluded directory rel (Docker's test).
func (c *Context) mayKeepBelow(rel string) bool {
	if !c.ignore.Exclusions() {
		return false
	}
	for _, p := range c.ignore.Patterns() {
		if p.Exclusion() && strings.HasPrefix(p.String()+"/", rel+"/") {
			return true
		}
	}
	return false
}

// copyable: regular files, directories and symbolic links.
func copyable(fi fs.FileInfo) bool {
	return fi.Mode()&(fs.ModeSocket|fs.ModeNamedPipe|fs.ModeDevice|fs.ModeCharDevice|fs.ModeIrregular) == 0
}

func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// cleanSource checks that src is a path inside the context and cleans it.
func cleanSource(src string) (string, error) {
	p := path.Clean(src)
	if src == "" || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") {
		return "", fmt.Errorf("source %q is not a path inside the build context: %w", errdefs.Clip(src), errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// sortEntries sorts as E2B's SDK does: by full path, compared in UTF-16
// code units as JavaScript compares strings. The root's full path is a
// prefix of every other, so it comes first.
func sortEntries(es []entry) []entry {
	key := func(e entry) []uint16 {
		if e.rel == "." {
			return nil
		}
		return utf16.Encode([]rune("/" + e.rel))
	}
	slices.SortFunc(es, func(a, b entry) int { return slices.Compare(key(a), key(b)) })
	return slices.CompactFunc(es, func(a, b entry) bool { return a.rel == b.rel })
}
