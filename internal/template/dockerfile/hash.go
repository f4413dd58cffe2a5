package dockerfile

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"syscall"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// FilesHash is the FilesHash of a COPY/ADD step copying src to dest,
// computed exactly as E2B's SDK computes it (calculateFilesHash in
// e2b-dev/E2B packages/js-sdk/src/template/utils.ts): SHA-256 over
// "COPY <src> <dest>", then for each file src takes, in order, its path
// relative to the context ("" for the root), its st_mode and st_size in
// decimal, and its contents (a link: its target). Owners and times are
// left out, so the hash is the same on any machine.
func (c *Context) FilesHash(src, dest string) (string, error) {
	files, err := c.match(src)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	io.WriteString(h, "COPY "+src+" "+dest)
	for _, e := range files {
		if e.rel != "." {
			io.WriteString(h, e.rel)
		}
		st, ok := e.info.Sys().(*syscall.Stat_t)
		if !ok {
			return "", fmt.Errorf("build context: no stat for %s", e.rel)
		}
		io.WriteString(h, strconv.FormatUint(uint64(st.Mode), 10))
		io.WriteString(h, strconv.FormatInt(st.Size, 10))
		switch {
		case e.info.Mode()&fs.ModeSymlink != 0:
			target, err := c.root.Readlink(e.rel)
			if err != nil {
				return "", fmt.Errorf("build context: %w", err)
			}
			io.WriteString(h, target)
		case e.info.Mode().IsRegular():
			if err := c.copyFile(h, e); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// match is files, with an error when src takes nothing.
func (c *Context) match(src string) ([]entry, error) {
	files, err := c.files(src)
	if err == nil && len(files) == 0 {
		err = fmt.Errorf("no file in the build context matches %q (or .dockerignore excludes it): %w", errdefs.Clip(src), errdefs.ErrInvalidArgument)
	}
	return files, err
}

// copyFile writes the contents of the regular file e to w: exactly the
// size it had when listed, or an error.
func (c *Context) copyFile(w io.Writer, e entry) error {
	f, err := c.root.Open(e.rel)
	if err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	defer f.Close()
	if _, err := io.CopyN(w, f, e.info.Size()); err != nil {
		return fmt.Errorf("build context: reading %s (changed while copied?): %w", errdefs.Clip(e.rel), err)
	}
	return nil
}

// HashSteps sets the FilesHash of every COPY and ADD step from the
// context. Errors name the step's Dockerfile line.
func (c *Context) HashSteps(steps []api.TemplateStep) error {
	for i := range steps {
		s := &steps[i]
		if s.Type != api.StepCopy && s.Type != api.StepAdd {
			continue
		}
		if len(s.Args) < 2 {
			return fmt.Errorf("step %d: %s needs a source and a destination: %w", i+1, s.Type, errdefs.ErrInvalidArgument)
		}
		h, err := c.FilesHash(s.Args[0], s.Args[1])
		if err != nil {
			if s.Line > 0 {
				return fmt.Errorf("Dockerfile:%d: %s %s: %w", s.Line, s.Type, errdefs.Clip(s.Args[0]), err)
			}
			return fmt.Errorf("step %d: %s %s: %w", i+1, s.Type, errdefs.Clip(s.Args[0]), err)
		}
		s.FilesHash = h
	}
	return nil
}
