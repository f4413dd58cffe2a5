package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

const filesUsage = `Usage:
  kiln files ls ID [PATH] [--depth N]      list a directory (default: the home)
  kiln files stat ID PATH                  show one entry
  kiln files get ID REMOTE [LOCAL|-]       download a file (- : to stdout)
  kiln files put ID LOCAL|- REMOTE         upload a file, or a directory's files
  kiln files mkdir ID PATH                 create a directory and its parents
  kiln files mv ID FROM TO                 rename
  kiln files rm ID PATH...                 remove, recursively

Relative sandbox paths are relative to the user's home; every command takes
--user root to act as root.

Run 'kiln files COMMAND -h' for a command's flags and examples.
` + remoteHelp

func filesCmd(ctx context.Context, args []string) error { return newRemote().files(ctx, args) }

func (r *remote) files(ctx context.Context, args []string) error {
	cmds := map[string]func(context.Context, []string) error{
		"ls": r.filesList, "list": r.filesList, "stat": r.filesStat, "get": r.filesGet, "put": r.filesPut,
		"mkdir": r.filesMkdir, "mv": r.filesMove, "rm": r.filesRemove,
	}
	return r.dispatch(ctx, "files", filesUsage, cmds, args)
}

// fileCommand is a command with the --user flag every file command takes.
func (r *remote) fileCommand(name, usage string) (*command, *[]client.FileOption) {
	c := r.command(name, usage)
	opts := new([]client.FileOption)
	c.fs.Func("user", "act as `user` (default) or root", func(u string) error {
		*opts = append(*opts, client.AsUser(u))
		return nil
	})
	return c, opts
}

// fileRow prints one entry for ls and stat.
func fileRow(w io.Writer, fi api.FileInfo) {
	mode := fs.FileMode(fi.Mode).Perm()
	switch fi.Type {
	case api.FileDir:
		mode |= fs.ModeDir
	case api.FileSymlink:
		mode |= fs.ModeSymlink
	case api.FileOther:
		mode |= fs.ModeIrregular
	}
	name := fi.Path
	if fi.SymlinkTarget != "" {
		name += " -> " + fi.SymlinkTarget
	}
	fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", mode, fi.Owner, fi.Group, fi.Size, fi.ModTime.Local().Format(time.DateTime), name)
}

const filesHeader = "MODE\tOWNER\tGROUP\tSIZE\tMODIFIED\tPATH"

const filesListUsage = `Usage: kiln files ls ID [PATH] [--depth N] [--user U]

Lists a directory in a sandbox (default: the user's home); --depth N
descends N levels.

Examples:
  kiln files ls i8cx2kq0v7n3ma5wd1ef
  kiln files ls i8cx2kq0v7n3ma5wd1ef /etc --user root
  kiln files ls i8cx2kq0v7n3ma5wd1ef project --depth 3 --json
`

func (r *remote) filesList(ctx context.Context, args []string) error {
	c, opts := r.fileCommand("files ls", filesListUsage)
	depth := c.fs.Int("depth", 1, "levels to descend")
	pos, err := c.parse(args, 1, 2)
	if err != nil {
		return err
	}
	dir := "."
	if len(pos) == 2 {
		dir = pos[1]
	}
	fis, err := r.c.ListFiles(ctx, pos[0], dir, *depth, *opts...)
	if err != nil {
		return err
	}
	if *c.json {
		if fis == nil {
			fis = []api.FileInfo{}
		}
		return r.printJSON(fis)
	}
	tw := r.table()
	fmt.Fprintln(tw, filesHeader)
	for _, fi := range fis {
		fileRow(tw, fi)
	}
	return tw.Flush()
}

const filesStatUsage = `Usage: kiln files stat ID PATH [--user U]

Shows one entry (a symlink itself, not its target).

Examples:
  kiln files stat i8cx2kq0v7n3ma5wd1ef /etc/os-release
`

func (r *remote) filesStat(ctx context.Context, args []string) error {
	c, opts := r.fileCommand("files stat", filesStatUsage)
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return err
	}
	fi, err := r.c.Stat(ctx, pos[0], pos[1], *opts...)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(fi)
	}
	tw := r.table()
	fmt.Fprintln(tw, filesHeader)
	fileRow(tw, *fi)
	return tw.Flush()
}

const filesGetUsage = `Usage: kiln files get ID REMOTE [LOCAL|-] [--user U]

Downloads a file from a sandbox to LOCAL (default: its name, in the
current directory; a directory: into it), or to stdout with -. The local
file appears only once the download is complete.

Examples:
  kiln files get i8cx2kq0v7n3ma5wd1ef /tmp/report.csv
  kiln files get i8cx2kq0v7n3ma5wd1ef out.json - | jq .
`

func (r *remote) filesGet(ctx context.Context, args []string) error {
	c, opts := r.fileCommand("files get", filesGetUsage)
	pos, err := c.parse(args, 2, 3)
	if err != nil {
		return err
	}
	id, remotePath := pos[0], pos[1]
	local := path.Base(remotePath)
	if len(pos) == 3 {
		local = pos[2]
	}
	if local == "-" {
		if *c.json {
			return c.usageError("--json needs a LOCAL file, not -")
		}
		_, err := r.c.ReadFile(ctx, id, remotePath, r.stdout, *opts...)
		return err
	}
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		local = filepath.Join(local, path.Base(remotePath))
	}
	f, err := os.CreateTemp(filepath.Dir(local), ".kiln-get-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	n, err := r.c.ReadFile(ctx, id, remotePath, f, *opts...)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), local)
	}
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(map[string]any{"remote": remotePath, "local": local, "bytes": n})
	}
	fmt.Fprintf(r.stderr, "%s: %d bytes\n", local, n)
	return nil
}

const filesPutUsage = `Usage: kiln files put ID LOCAL|- REMOTE [--user U]

Uploads a local file (or stdin, with -) to REMOTE in a sandbox, keeping its
permission bits; a REMOTE ending in / is a directory to put it in. A local
directory uploads every regular file below it, in one request, to the
directory REMOTE. Missing remote directories are created.

Examples:
  kiln files put i8cx2kq0v7n3ma5wd1ef main.py /home/user/main.py
  kiln files put i8cx2kq0v7n3ma5wd1ef data.csv project/
  kiln files put i8cx2kq0v7n3ma5wd1ef ./src /home/user/src
  echo hello | kiln files put i8cx2kq0v7n3ma5wd1ef - greeting.txt
`

func (r *remote) filesPut(ctx context.Context, args []string) error {
	c, opts := r.fileCommand("files put", filesPutUsage)
	pos, err := c.parse(args, 3, 3)
	if err != nil {
		return err
	}
	id, local, remotePath := pos[0], pos[1], pos[2]
	var fis []api.FileInfo
	switch st, err := os.Stat(local); {
	case local == "-":
		if strings.HasSuffix(remotePath, "/") {
			return c.usageError("with -, REMOTE must name a file")
		}
		fi, err := r.c.WriteFile(ctx, id, remotePath, r.stdin, *opts...)
		if err != nil {
			return err
		}
		fis = append(fis, *fi)
	case err != nil:
		return err
	case st.IsDir():
		if fis, err = r.putDir(ctx, id, local, remotePath, *opts); err != nil {
			return err
		}
	default:
		if strings.HasSuffix(remotePath, "/") {
			remotePath += filepath.Base(local)
		}
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		fi, err := r.c.WriteFile(ctx, id, remotePath, f, append(*opts, client.WithMode(st.Mode().Perm()))...)
		if err != nil {
			return err
		}
		fis = append(fis, *fi)
	}
	if *c.json {
		return r.printJSON(fis)
	}
	for _, fi := range fis {
		fmt.Fprintf(r.stdout, "%s\t%d bytes\n", fi.Path, fi.Size)
	}
	return nil
}

// putDir uploads the regular files below dir to the remote directory to.
func (r *remote) putDir(ctx context.Context, id, dir, to string, opts []client.FileOption) ([]api.FileInfo, error) {
	var ups []client.Upload
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		ups = append(ups, client.Upload{Path: filepath.ToSlash(rel), Content: &lazyFile{path: p}})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(ups) == 0 {
		return nil, fmt.Errorf("%s: no regular files to upload", dir)
	}
	return r.c.UploadFiles(ctx, id, to, ups, opts...)
}

// lazyFile opens its file on the first Read and closes it at EOF, so an
// upload of many files holds one open at a time.
type lazyFile struct {
	path string
	f    *os.File
}

func (l *lazyFile) Read(p []byte) (int, error) {
	if l.f == nil {
		f, err := os.Open(l.path)
		if err != nil {
			return 0, err
		}
		l.f = f
	}
	n, err := l.f.Read(p)
	if err != nil {
		l.f.Close()
	}
	return n, err
}

const filesMkdirUsage = `Usage: kiln files mkdir ID PATH [--user U]

Creates a directory and any missing parents.

Examples:
  kiln files mkdir i8cx2kq0v7n3ma5wd1ef project/data
`

func (r *remote) filesMkdir(ctx context.Context, args []string) error {
	c, opts := r.fileCommand("files mkdir", filesMkdirUsage)
	pos, err := c.parse(args, 2, 2)
	if err != nil {
		return err
	}
	fi, err := r.c.Mkdir(ctx, pos[0], pos[1], *opts...)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(fi)
	}
	fmt.Fprintln(r.stdout, fi.Path)
	return nil
}

const filesMoveUsage = `Usage: kiln files mv ID FROM TO [--user U]

Renames FROM to TO inside a sandbox.

Examples:
  kiln files mv i8cx2kq0v7n3ma5wd1ef out.txt results/out.txt
`

func (r *remote) filesMove(ctx context.Context, args []string) error {
	c, opts := r.fileCommand("files mv", filesMoveUsage)
	pos, err := c.parse(args, 3, 3)
	if err != nil {
		return err
	}
	fi, err := r.c.Move(ctx, pos[0], pos[1], pos[2], *opts...)
	if err != nil {
		return err
	}
	if *c.json {
		return r.printJSON(fi)
	}
	fmt.Fprintln(r.stdout, fi.Path)
	return nil
}

const filesRemoveUsage = `Usage: kiln files rm ID PATH... [--user U]

Removes files, and directories with everything in them.

Examples:
  kiln files rm i8cx2kq0v7n3ma5wd1ef /tmp/scratch
  kiln files rm i8cx2kq0v7n3ma5wd1ef a.txt b.txt --user root
`

func (r *remote) filesRemove(ctx context.Context, args []string) error {
	c, opts := r.fileCommand("files rm", filesRemoveUsage)
	pos, err := c.parse(args, 2, -1)
	if err != nil {
		return err
	}
	removed := []string{}
	for _, p := range pos[1:] {
		if err := r.c.Remove(ctx, pos[0], p, *opts...); err != nil {
			return err
		}
		removed = append(removed, p)
	}
	if *c.json {
		return r.printJSON(map[string][]string{"removed": removed})
	}
	return nil
}
