package dockerfile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// file is one entry of a test build context: a regular file (data), a
// directory (dir) or a symbolic link (link).
type file struct {
	path, data, link string
	dir              bool
	mode             os.FileMode
}

// writeContext makes a build context of files in a new directory, with
// exactly the modes given (0644 and 0755 by default, whatever the umask).
func writeContext(t *testing.T, files []file) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case f.link != "":
			err = os.Symlink(f.link, p)
		case f.dir:
			if err = os.Mkdir(p, 0o755); err == nil && f.mode != 0 {
				err = os.Chmod(p, f.mode)
			}
		default:
			mode := f.mode
			if mode == 0 {
				mode = 0o644
			}
			if err = os.WriteFile(p, []byte(f.data), mode); err == nil {
				err = os.Chmod(p, mode)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func openContext(t *testing.T, dir string) *Context {
	t.Helper()
	c, err := OpenContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sample is a build context with a .dockerignore that uses Docker's
// rules: patterns anchored at the root, a directory excluded with all it
// holds, an ! exception inside an excluded directory.
var sample = []file{
	{path: ".dockerignore", data: "# comment\n*.log\nsecret.txt\nbuild\n!build/keep.txt\nnode_modules\n**/*.tmp\n"},
	{path: "a.txt", data: "hello\n"},
	{path: "run.sh", data: "#!/bin/sh\necho hi\n", mode: 0o755},
	{path: ".hidden", data: "dot\n"},
	{path: "app.log", data: "ignored\n"},
	{path: "secret.txt", data: "ignored\n"},
	{path: "sub/b.py", data: "print(1)\n"},
	{path: "sub/c.txt", data: "c\n"},
	{path: "sub/x.log", data: "kept: *.log is anchored at the root\n"},
	{path: "sub/y.tmp", data: "ignored by **/*.tmp\n"},
	{path: "sub/deep/d.py", data: "print(2)\n"},
	{path: "sub/empty", dir: true},
	{path: "build/out.o", data: "ignored\n"},
	{path: "build/keep.txt", data: "kept by the exception\n"},
	{path: "node_modules/m/index.js", data: "ignored\n"},
	{path: "link", link: "a.txt"},
	{path: "dirlink", link: "sub"},
	{path: "outside", link: "../../etc/passwd"},
}

func TestContextFiles(t *testing.T) {
	c := openContext(t, writeContext(t, sample))
	for _, tc := range []struct {
		src  string
		want []string
		err  string
	}{
		{src: "a.txt", want: []string{"a.txt"}},
		{src: "./sub/../a.txt", want: []string{"a.txt"}},
		{src: ".", want: []string{".", ".dockerignore", ".hidden", "a.txt", "build/keep.txt", "dirlink", "link", "outside", "run.sh",
			"sub", "sub/b.py", "sub/c.txt", "sub/deep", "sub/deep/d.py", "sub/empty", "sub/x.log"}},
		{src: "sub", want: []string{"sub", "sub/b.py", "sub/c.txt", "sub/deep", "sub/deep/d.py", "sub/empty", "sub/x.log"}},
		{src: "sub/", want: []string{"sub", "sub/b.py", "sub/c.txt", "sub/deep", "sub/deep/d.py", "sub/empty", "sub/x.log"}},
		{src: "*.txt", want: []string{"a.txt"}},
		{src: "sub/*.py", want: []string{"sub/b.py"}},
		{src: "*/*.py", want: []string{"sub/b.py"}},
		{src: "s?b", want: []string{"sub", "sub/b.py", "sub/c.txt", "sub/deep", "sub/deep/d.py", "sub/empty", "sub/x.log"}},
		{src: "sub/[cx].*", want: []string{"sub/c.txt", "sub/x.log"}},
		{src: "build", want: []string{"build/keep.txt"}},
		{src: "build/keep.txt", want: []string{"build/keep.txt"}},
		{src: "dirlink", want: []string{"dirlink"}},
		{src: "outside", want: []string{"outside"}},
		{src: "app.log", err: `no file in the build context matches "app.log"`},
		{src: "build/out.o", err: "no file in the build context matches"},
		{src: "node_modules/m/index.js", err: "no file in the build context matches"},
		{src: "sub/y.tmp", err: "no file in the build context matches"},
		{src: "missing", err: "no file in the build context matches"},
		{src: "*.none", err: "no file in the build context matches"},
		{src: "nodir/*.py", err: "no file in the build context matches"},
		{src: "../a.txt", err: `source "../a.txt" is not a path inside the build context`},
		{src: "/a.txt", err: "is not a path inside the build context"},
		{src: "sub/[", err: "source pattern"},
	} {
		t.Run(tc.src, func(t *testing.T) {
			files, err := c.match(tc.src)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("error %v, want an invalid argument containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range files {
				got = append(got, f.rel)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("files (-want +got):\n%s", diff)
			}
		})
	}
}

// golden is a context whose files' hashes do not depend on the file
// system (directory sizes do): regular files and links only.
var golden = append(pick(sample, "a.txt", "run.sh", "link"), []file{
	{path: "b.txt", data: ""},
	{path: "ü.txt", data: "unicode\n"},
	// JavaScript orders these two the other way round from Go's bytes.
	{path: "\uff5e.txt", data: "wave\n"},
	{path: "\U0001F600.txt", data: "smile\n"},
}...)

// pick returns the files of fs with the given paths.
func pick(fs []file, paths ...string) []file {
	var out []file
	for _, f := range fs {
		for _, p := range paths {
			if f.path == p {
				out = append(out, f)
			}
		}
	}
	return out
}

// TestFilesHashGolden checks FilesHash against values E2B's SDK (npm e2b
// 2.51.0, Template().copy(src, dest) then Template.toJSON) computed for
// the golden context.
func TestFilesHashGolden(t *testing.T) {
	c := openContext(t, writeContext(t, golden))
	for _, tc := range []struct{ src, dest, want string }{
		{"a.txt", "/home/user/a.txt", "29801304afee1fbe446dccae19cd06ed33e70f9ef1aecb9d0f2aec8d06fb4039"},
		{"*.txt", "/data/", "170ff315386d1116ac81544a6e6b4f0fbcdc1d8eb4191710f98fa1f0d1302276"},
		{"run.sh", "/usr/local/bin/run", "b92972578c83e240037c756eec2387a069af8cd7225413c89e18aeffb6380fda"},
		{"link", "/l", "c2484e86f6846207e51054f548983ef9033f0f0327cc6355510b8beaf14b74e9"},
	} {
		got, err := c.FilesHash(tc.src, tc.dest)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("FilesHash(%q, %q) = %s, want %s", tc.src, tc.dest, got, tc.want)
		}
	}
}

// TestFilesHashChanges checks what the hash covers: contents, mode, names
// and the destination, but not times.
func TestFilesHashChanges(t *testing.T) {
	dir := writeContext(t, golden)
	hash := func() string {
		t.Helper()
		h, err := openContext(t, dir).FilesHash(".", "/app/")
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	first := hash()
	past := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(dir, "a.txt"), past, past); err != nil {
		t.Fatal(err)
	}
	if got := hash(); got != first {
		t.Errorf("a new mtime changed the hash")
	}
	for _, change := range []struct {
		name string
		do   func() error
	}{
		{"contents", func() error { return os.WriteFile(filepath.Join(dir, "a.txt"), []byte("hellO\n"), 0o644) }},
		{"mode", func() error { return os.Chmod(filepath.Join(dir, "a.txt"), 0o600) }},
		{"name", func() error { return os.Rename(filepath.Join(dir, "b.txt"), filepath.Join(dir, "c.txt")) }},
		{"link target", func() error {
			os.Remove(filepath.Join(dir, "link"))
			return os.Symlink("b.txt", filepath.Join(dir, "link"))
		}},
	} {
		before := hash()
		if err := change.do(); err != nil {
			t.Fatal(err)
		}
		if hash() == before {
			t.Errorf("changing the %s kept the hash", change.name)
		}
	}
	c := openContext(t, dir)
	h1, _ := c.FilesHash("a.txt", "/x")
	h2, _ := c.FilesHash("a.txt", "/y")
	if h1 == h2 {
		t.Errorf("the destination is not in the hash")
	}
}

// tarEntry is what a test reads back of one tar entry.
type tarEntry struct {
	Name, Link, Data string
	Type             byte
	Mode             int64
}

func readTar(t *testing.T, b []byte) []tarEntry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var out []tarEntry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: owner %d:%d (%q:%q), time %v; want 0:0 and the epoch", h.Name, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
		}
		out = append(out, tarEntry{Name: h.Name, Link: h.Linkname, Data: string(data), Type: h.Typeflag, Mode: h.Mode})
	}
}

func TestWriteTar(t *testing.T) {
	subTar := []tarEntry{
		{Name: "sub/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "sub/b.py", Type: tar.TypeReg, Mode: 0o644, Data: "print(1)\n"},
		{Name: "sub/c.txt", Type: tar.TypeReg, Mode: 0o644, Data: "c\n"},
		{Name: "sub/deep/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "sub/deep/d.py", Type: tar.TypeReg, Mode: 0o644, Data: "print(2)\n"},
		{Name: "sub/empty/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "sub/x.log", Type: tar.TypeReg, Mode: 0o644, Data: "kept: *.log is anchored at the root\n"},
	}
	dir := writeContext(t, sample)
	if err := os.Chmod(filepath.Join(dir, "sub/empty"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	c := openContext(t, dir)
	for _, tc := range []struct {
		src  string
		want []tarEntry
	}{
		{"sub", subTar},
		{"*", append([]tarEntry{
			{Name: ".dockerignore", Type: tar.TypeReg, Mode: 0o644, Data: sample[0].data},
			{Name: ".hidden", Type: tar.TypeReg, Mode: 0o644, Data: "dot\n"},
			{Name: "a.txt", Type: tar.TypeReg, Mode: 0o644, Data: "hello\n"},
			{Name: "build/keep.txt", Type: tar.TypeReg, Mode: 0o644, Data: "kept by the exception\n"},
			{Name: "dirlink", Type: tar.TypeSymlink, Mode: 0o777, Link: "sub"},
			{Name: "link", Type: tar.TypeSymlink, Mode: 0o777, Link: "a.txt"},
			{Name: "outside", Type: tar.TypeSymlink, Mode: 0o777, Link: "../../etc/passwd"},
			{Name: "run.sh", Type: tar.TypeReg, Mode: 0o755, Data: "#!/bin/sh\necho hi\n"},
		}, subTar...)},
	} {
		var b bytes.Buffer
		if err := c.WriteTar(&b, tc.src); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, readTar(t, b.Bytes())); diff != "" {
			t.Errorf("tar of %q (-want +got):\n%s", tc.src, diff)
		}
	}

	// The same files give the same bytes, whatever their times.
	var first, again bytes.Buffer
	if err := c.WriteTar(&first, "."); err != nil {
		t.Fatal(err)
	}
	past := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	for _, p := range []string{"a.txt", "sub", "sub/b.py"} {
		if err := os.Chtimes(filepath.Join(dir, p), past, past); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.WriteTar(&again, "."); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Bytes(), again.Bytes()) {
		t.Errorf("the tar changed with the files' times")
	}
	if err := c.WriteTar(io.Discard, "missing"); err == nil || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("WriteTar of a missing source: %v, want an invalid argument", err)
	}
}

func TestHashSteps(t *testing.T) {
	c := openContext(t, writeContext(t, golden))
	spec, _, err := Compile([]byte("FROM base\nCOPY *.txt run.sh /app/\nRUN ls\nADD link /l\n"), Options{IsTemplate: isTemplate})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.HashSteps(spec.Steps); err != nil {
		t.Fatal(err)
	}
	for _, s := range spec.Steps {
		want := ""
		if s.Type != api.StepRun {
			want, _ = c.FilesHash(s.Args[0], s.Args[1])
		}
		if s.FilesHash != want || s.Type != api.StepRun && len(want) != 64 {
			t.Errorf("step %v: FilesHash %q, want %q", s.Args, s.FilesHash, want)
		}
	}

	spec, _, err = Compile([]byte("FROM base\nCOPY a.txt /a\n\nCOPY missing.txt /m\n"), Options{IsTemplate: isTemplate})
	if err != nil {
		t.Fatal(err)
	}
	err = c.HashSteps(spec.Steps)
	const want = `Dockerfile:4: COPY missing.txt: no file in the build context matches "missing.txt"`
	if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("HashSteps with a missing file: %v, want an invalid argument beginning %q", err, want)
	}
}

func TestOpenContext(t *testing.T) {
	if _, err := OpenContext(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Errorf("OpenContext of a missing directory succeeded")
	}
	dir := writeContext(t, []file{{path: ".dockerignore", data: "[\n"}})
	if _, err := OpenContext(dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a bad .dockerignore: %v, want an invalid argument", err)
	}
}
