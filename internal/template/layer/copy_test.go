package layer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
)

// want is what a path must look like in the merged view (-1: unchecked).
type want struct {
	kind     string
	content  string
	mode     int64
	uid, gid int
}

func file(content string, mode int64, uid, gid int) want {
	return want{"file", content, mode, uid, gid}
}

func dir(mode int64, uid, gid int) want { return want{"dir", "", mode, uid, gid} }

var etcIDs = []fsEntry{
	{path: "etc/passwd", content: "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\napp:x:1500:1600::/srv:/bin/sh\n"},
	{path: "etc/group", content: "root:x:0:\nuser:x:1000:\nstaff:x:50:user\n"},
	{path: "home/user", kind: "dir", uid: 1000, gid: 1000},
}

// mergedUsr is Debian's merged /usr: /bin is a symlink to usr/bin.
var mergedUsr = []fsEntry{{path: "usr/bin/ls", content: "ls", mode: 0o755}, {path: "bin", kind: "symlink", content: "usr/bin"}}

func TestCopy(t *testing.T) {
	requireRoot(t)
	archive := tarOf(t, false, []fsEntry{{path: "a/", kind: "dir"}, {path: "a/b.txt", content: "in tar", uid: 7, gid: 8}})
	for _, tc := range []struct {
		name    string
		lower   [][]fsEntry // top first
		context []fsEntry
		gz      bool
		step    api.TemplateStep
		limit   int64
		want    map[string]want
		absent  []string
		err     error
		msg     string
	}{{
		name:    "file to a new path, parents made 0755 root",
		context: []fsEntry{{path: "data.csv", content: "1,2", mode: 0o640, uid: 42}},
		gz:      true,
		step:    api.TemplateStep{Type: "COPY", Args: []string{"data.csv", "/data/x.csv"}},
		want:    map[string]want{"/data": dir(0o755, 0, 0), "/data/x.csv": file("1,2", 0o640, 0, 0)},
	}, {
		name:    "file into an existing directory without a slash",
		lower:   [][]fsEntry{{{path: "opt", kind: "dir", mode: 0o750, uid: 3, gid: 4}, {path: "opt/old"}}},
		context: []fsEntry{{path: "a.txt", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"a.txt", "/opt"}},
		want:    map[string]want{"/opt": dir(0o750, 3, 4), "/opt/a.txt": file("A", 0o644, 0, 0), "/opt/old": file("", -1, -1, -1)},
	}, {
		name:    "dest ending in a slash is a directory",
		context: []fsEntry{{path: "a.txt", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"a.txt", "/new/"}},
		want:    map[string]want{"/new": dir(0o755, 0, 0), "/new/a.txt": file("A", -1, 0, 0)},
	}, {
		name:    "a source directory copies its contents, merging into an existing one",
		lower:   [][]fsEntry{{{path: "app/old", content: "old"}, {path: "app/sub/keep", content: "k"}}},
		context: []fsEntry{{path: "src/", kind: "dir"}, {path: "src/x", content: "X"}, {path: "src/sub/", kind: "dir", mode: 0o700}, {path: "src/sub/y", content: "Y"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"src", "/app"}},
		want: map[string]want{"/app/x": file("X", -1, 0, 0), "/app/sub/y": file("Y", -1, 0, 0), "/app/sub": dir(0o700, 0, 0),
			"/app/old": file("old", -1, -1, -1), "/app/sub/keep": file("k", -1, -1, -1)},
		absent: []string{"/app/src"},
	}, {
		name:    "a source directory to a new destination",
		context: []fsEntry{{path: "src/", kind: "dir", mode: 0o711}, {path: "src/x", content: "X"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"src/", "/srv/app"}},
		want:    map[string]want{"/srv": dir(0o755, 0, 0), "/srv/app": dir(0o711, 0, 0), "/srv/app/x": file("X", -1, 0, 0)},
	}, {
		name:    "the whole context",
		context: []fsEntry{{path: "./a", content: "A"}, {path: "./d/b", content: "B"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{".", "/w/"}},
		want:    map[string]want{"/w/a": file("A", -1, 0, 0), "/w/d/b": file("B", -1, 0, 0)},
	}, {
		name:    "several matches make the destination a directory",
		context: []fsEntry{{path: "a.txt", content: "A"}, {path: "b.txt", content: "B"}, {path: "c.md", content: "C"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"*.txt", "/out"}},
		want:    map[string]want{"/out": dir(0o755, 0, 0), "/out/a.txt": file("A", -1, 0, 0), "/out/b.txt": file("B", -1, 0, 0)},
		absent:  []string{"/out/c.md", "/c.md"},
	}, {
		name:    "owner by name, group from /etc/passwd; made directories get it too",
		lower:   [][]fsEntry{etcIDs},
		context: []fsEntry{{path: "a.txt", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"a.txt", "/home/user/proj/", "user"}},
		want: map[string]want{"/home/user": dir(0o755, 1000, 1000), "/home/user/proj": dir(0o755, 1000, 1000),
			"/home/user/proj/a.txt": file("A", 0o644, 1000, 1000)},
	}, {
		name:    "owner user:group by names, and mode",
		lower:   [][]fsEntry{etcIDs},
		context: []fsEntry{{path: "bin/", kind: "dir"}, {path: "bin/tool", content: "#!"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"bin", "/usr/local/bin", "user:staff", "0750"}},
		want:    map[string]want{"/usr/local/bin/tool": file("#!", 0o750, 1000, 50), "/usr/local/bin": dir(0o750, 1000, 50)},
	}, {
		name:    "numeric owner not in passwd: gid is the uid",
		context: []fsEntry{{path: "a.txt", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"a.txt", "/a.txt", "1234"}},
		want:    map[string]want{"/a.txt": file("A", -1, 1234, 1234)},
	}, {
		name: "the topmost /etc/passwd wins",
		lower: [][]fsEntry{
			{{path: "etc/passwd", content: "user:x:2000:2001::/home/user:/bin/sh\n"}},
			etcIDs,
		},
		context: []fsEntry{{path: "a.txt", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"a.txt", "/a.txt", "user"}},
		want:    map[string]want{"/a.txt": file("A", -1, 2000, 2001)},
	}, {
		name:    "unknown owner",
		lower:   [][]fsEntry{etcIDs},
		context: []fsEntry{{path: "a.txt", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"a.txt", "/a.txt", "nobody"}},
		err:     errdefs.ErrInvalidArgument, msg: `unknown user "nobody"`,
	}, {
		name:    "missing source",
		context: []fsEntry{{path: "other.csv", content: "x"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"data.csv", "/data.csv"}},
		err:     errdefs.ErrInvalidArgument, msg: "COPY data.csv: no such file in the build context",
	}, {
		name:    "pattern outside the context",
		context: []fsEntry{{path: "a", content: "x"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"../../etc/shadow", "/x"}},
		err:     errdefs.ErrInvalidArgument, msg: "outside the build context",
	}, {
		name:    "context entry climbing out",
		context: []fsEntry{{path: "../../../escaped-by-copy-test", content: "x"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{".", "/x/"}},
		err:     errdefs.ErrInvalidArgument, msg: "leaves its tree",
	}, {
		name:    "context entry written through its own symlink",
		context: []fsEntry{{path: "lnk", kind: "symlink", content: "/etc"}, {path: "lnk/pwned-by-copy-test", content: "x"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{".", "/x/"}},
		err:     errdefs.ErrInvalidArgument, msg: "parent is not a directory",
	}, {
		name:    "relative destination",
		context: []fsEntry{{path: "a", content: "x"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"a", "x"}},
		err:     errdefs.ErrInvalidArgument, msg: "not an absolute path",
	}, {
		name:    "absolute symlink in a lower layer resolves inside the view",
		lower:   [][]fsEntry{{{path: "app", kind: "symlink", content: "/srv/app"}, {path: "srv/app", kind: "dir", mode: 0o700, uid: 9}}},
		context: []fsEntry{{path: "a.txt", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"a.txt", "/app/"}},
		want:    map[string]want{"/app": {kind: "symlink", content: "/srv/app", mode: -1, uid: -1, gid: -1}, "/srv/app": dir(0o700, 9, 0), "/srv/app/a.txt": file("A", -1, 0, 0)},
	}, {
		name:    "relative symlink climbing above / stays in the view",
		lower:   [][]fsEntry{{{path: "etc", kind: "dir"}, {path: "conf", kind: "symlink", content: "../../../../../etc"}}},
		context: []fsEntry{{path: "pwned-by-copy-test", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"pwned-by-copy-test", "/conf/"}},
		want:    map[string]want{"/etc/pwned-by-copy-test": file("A", -1, 0, 0)},
	}, {
		name:    "a directory onto a symlinked directory below goes through it (merged /usr)",
		lower:   [][]fsEntry{mergedUsr},
		context: []fsEntry{{path: "rootfs/bin/foo", content: "F"}, {path: "rootfs/etc/foo.conf", content: "C"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"rootfs/", "/"}},
		want: map[string]want{"/bin": {kind: "symlink", content: "usr/bin", mode: -1, uid: -1, gid: -1},
			"/usr/bin/foo": file("F", -1, 0, 0), "/usr/bin/ls": file("ls", -1, -1, -1), "/etc/foo.conf": file("C", -1, 0, 0)},
	}, {
		name:    "ADD unpacks through a symlinked directory below",
		lower:   [][]fsEntry{mergedUsr},
		context: []fsEntry{{path: "t.tar", content: string(tarOf(t, false, []fsEntry{{path: "bin/bar", content: "B"}, {path: "opt/x/y", content: "Y"}}))}},
		step:    api.TemplateStep{Type: "ADD", Args: []string{"t.tar", "/"}},
		want: map[string]want{"/bin": {kind: "symlink", content: "usr/bin", mode: -1, uid: -1, gid: -1},
			"/usr/bin/bar": file("B", -1, 0, 0), "/usr/bin/ls": file("ls", -1, -1, -1), "/opt/x/y": file("Y", -1, 0, 0)},
	}, {
		name:    "destination is a file where a directory is needed",
		lower:   [][]fsEntry{{{path: "f", content: "x"}}},
		context: []fsEntry{{path: "d/", kind: "dir"}, {path: "d/a", content: "A"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"d", "/f"}},
		err:     errdefs.ErrInvalidArgument, msg: "not a directory",
	}, {
		name:    "hard links and symlinks are kept",
		context: []fsEntry{{path: "a", content: "A"}, {path: "b", kind: "link", content: "a"}, {path: "s", kind: "symlink", content: "a"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{".", "/l/"}},
		want:    map[string]want{"/l/b": file("A", -1, 0, 0), "/l/s": {kind: "symlink", content: "a", mode: -1, uid: -1, gid: -1}},
	}, {
		name:    "a whiteout in the context deletes nothing",
		lower:   [][]fsEntry{{{path: "w/keep", content: "k"}}},
		context: []fsEntry{{path: "keep", kind: "whiteout"}, {path: "n", content: "N"}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{".", "/w/"}},
		want:    map[string]want{"/w/keep": file("k", -1, -1, -1), "/w/n": file("N", -1, 0, 0)},
	}, {
		name:    "over the limit",
		context: []fsEntry{{path: "big", content: strings.Repeat("x", 5000)}},
		step:    api.TemplateStep{Type: "COPY", Args: []string{"big", "/big"}},
		limit:   4096,
		err:     errdefs.ErrResourceExhausted,
	}, {
		name:    "ADD unpacks a tar, keeping its owners",
		context: []fsEntry{{path: "app.tar", content: string(archive)}},
		step:    api.TemplateStep{Type: "ADD", Args: []string{"app.tar", "/opt/"}},
		want:    map[string]want{"/opt/a/b.txt": file("in tar", -1, 7, 8)},
		absent:  []string{"/opt/app.tar"},
	}, {
		name:    "ADD unpacks a tar.gz with an owner",
		lower:   [][]fsEntry{etcIDs},
		context: []fsEntry{{path: "app.tgz", content: string(gzipOf(t, archive))}},
		step:    api.TemplateStep{Type: "ADD", Args: []string{"app.tgz", "/opt", "app"}},
		want:    map[string]want{"/opt/a/b.txt": file("in tar", -1, 1500, 1600)},
	}, {
		name:    "ADD of a file that is not an archive copies it",
		context: []fsEntry{{path: "notes.gz", content: "\x1f\x8bnot really"}},
		step:    api.TemplateStep{Type: "ADD", Args: []string{"notes.gz", "/n.gz"}},
		want:    map[string]want{"/n.gz": file("\x1f\x8bnot really", -1, 0, 0)},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var lowers []string
			for _, l := range tc.lower {
				d := tempDir(t)
				makeTree(t, d, l)
				lowers = append(lowers, d)
			}
			if len(lowers) == 0 {
				lowers = []string{tempDir(t)}
			}
			parent := tempDir(t)
			out := filepath.Join(parent, "layer")
			if err := os.Mkdir(out, 0o755); err != nil {
				t.Fatal(err)
			}
			err := Copy(context.Background(), out, CopyParams{Step: tc.step, Files: bytes.NewReader(tarOf(t, tc.gz, tc.context)), Lower: lowers, Limit: tc.limit})
			for _, p := range []string{"/etc/pwned-by-copy-test", filepath.Join(parent, "escaped-by-copy-test"), "/escaped-by-copy-test"} {
				if _, serr := os.Lstat(p); serr == nil {
					t.Errorf("%s written outside the layer", p)
				}
			}
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("Copy = %v, want %v containing %q", err, tc.err, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Copy: %v", err)
			}
			if ents, _ := os.ReadDir(out); len(ents) > 0 && strings.HasPrefix(ents[0].Name(), ".kiln-copy") {
				t.Errorf("staging dir left in the layer")
			}
			merged := snapshot(t, mountOverlay(t, append([]string{out}, lowers...)...), false)
			for p, w := range tc.want {
				checkSeen(t, merged, p, w)
			}
			for _, p := range tc.absent {
				if _, ok := merged[p]; ok {
					t.Errorf("%s exists", p)
				}
			}
			below := snapshot(t, mountOverlay(t, lowers...), false)
			if _, ok := below["/"]; !ok || merged["/"] != below["/"] {
				t.Errorf("root changed: %+v, below %+v", merged["/"], below["/"])
			}
		})
	}
}

func checkSeen(t *testing.T, tree map[string]seen, p string, w want) {
	t.Helper()
	got, ok := tree[p]
	switch {
	case !ok:
		t.Errorf("%s missing", p)
	case got.Kind != w.kind:
		t.Errorf("%s is a %s, want a %s", p, got.Kind, w.kind)
	case (w.kind != "dir") && w.content != got.Content && !(w.kind == "file" && w.content == "" && got.Content == ""):
		t.Errorf("%s = %q, want %q", p, got.Content, w.content)
	case w.mode >= 0 && int64(got.Mode) != w.mode:
		t.Errorf("%s mode %o, want %o", p, got.Mode, w.mode)
	case w.uid >= 0 && got.UID != w.uid, w.gid >= 0 && got.GID != w.gid:
		t.Errorf("%s owned by %d:%d, want %d:%d", p, got.UID, got.GID, w.uid, w.gid)
	}
}

func gzipOf(t *testing.T, b []byte) []byte {
	t.Helper()
	return compressWith(t, "gzip", b)
}

func compressWith(t *testing.T, tool string, b []byte) []byte {
	t.Helper()
	cmd := exec.Command(tool, "-c")
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return out
}

// TestAddCompressed covers bzip2 and xz archives (xz through the host's
// xz tool, refused clearly without it).
func TestAddCompressed(t *testing.T) {
	requireRoot(t)
	archive := tarOf(t, false, []fsEntry{{path: "z.txt", content: "zz"}})
	for _, tool := range []string{"bzip2", "xz"} {
		t.Run(tool, func(t *testing.T) {
			_, err := exec.LookPath(tool)
			ocitest.Require(t, err == nil, "no "+tool+" on this host to make the archive")
			out := tempDir(t)
			ctx := tarOf(t, false, []fsEntry{{path: "a." + tool, content: string(compressWith(t, tool, archive))}})
			step := api.TemplateStep{Type: "ADD", Args: []string{"a." + tool, "/x/"}}
			if err := Copy(context.Background(), out, CopyParams{Step: step, Files: bytes.NewReader(ctx)}); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(out, "x/z.txt")); err != nil || string(b) != "zz" {
				t.Fatalf("x/z.txt = %q, %v", b, err)
			}
			if tool != "xz" {
				return
			}
			t.Setenv("PATH", t.TempDir())
			err = Copy(context.Background(), tempDir(t), CopyParams{Step: step, Files: bytes.NewReader(ctx)})
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "xz tool") {
				t.Fatalf("ADD .xz without xz: %v", err)
			}
		})
	}
}
