package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// upload writes data to path through MethodWrite.
func (h *harness) upload(p wire.WriteParams, data []byte) (api.FileInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodWrite, p)
	if err != nil {
		return api.FileInfo{}, err
	}
	defer st.Close()
	// If the agent fails the call early, SendData returns at once and
	// Wait reports the call's error.
	if err := st.SendData(ctx, data); err == nil {
		_ = st.CloseSend()
	}
	var info api.FileInfo
	err = st.Wait(ctx, &info)
	return info, err
}

// download reads path through MethodRead.
func (h *harness) download(p wire.PathParams) ([]byte, api.FileInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodRead, p)
	if err != nil {
		return nil, api.FileInfo{}, err
	}
	defer st.Close()
	var buf bytes.Buffer
	for {
		f, err := st.Recv(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, api.FileInfo{}, err
		}
		if f.Type == channel.FrameData {
			buf.Write(f.Payload)
		}
	}
	var info api.FileInfo
	err = st.Wait(ctx, &info)
	return buf.Bytes(), info, err
}

func TestFileRoundTrip(t *testing.T) {
	h := newHarness(t)
	dir := userDir(t)
	data := make([]byte, 5<<20+12345)
	rand.Read(data)
	path := filepath.Join(dir, "a/b/big.bin")

	info, err := h.upload(wire.WriteParams{Path: path, Mode: 0o600}, data)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(data)) || info.Mode != 0o600 || info.Type != api.FileRegular || info.Path != path {
		t.Errorf("written info = %+v", info)
	}
	if os.Geteuid() == 0 {
		st, _ := os.Stat(filepath.Join(dir, "a"))
		if uid := st.Sys().(*syscall.Stat_t).Uid; uid != 1000 {
			t.Errorf("created parent is owned by %d, want the user", uid)
		}
	}
	got, rinfo, err := h.download(wire.PathParams{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) || rinfo.Size != int64(len(data)) {
		t.Errorf("read back %d bytes (info %+v), want %d", len(got), rinfo, len(data))
	}

	// Replace keeps the mode; append appends.
	if _, err := h.upload(wire.WriteParams{Path: path}, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if info, err := h.upload(wire.WriteParams{Path: path, Append: true}, []byte("two\n")); err != nil || info.Mode != 0o600 {
		t.Fatalf("append: %+v, %v", info, err)
	}
	if got, _, _ := h.download(wire.PathParams{Path: path}); string(got) != "one\ntwo\n" {
		t.Errorf("after replace+append: %q", got)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestFileOps(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	dir := userDir(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var info api.FileInfo
	must(h.conn.Invoke(ctx, wire.MethodMkdir, wire.PathParams{Path: filepath.Join(dir, "x/y/z")}, &info))
	if info.Type != api.FileDir || info.Name != "z" {
		t.Errorf("mkdir info = %+v", info)
	}
	must(h.conn.Invoke(ctx, wire.MethodMkdir, wire.PathParams{Path: filepath.Join(dir, "x/y/z")}, nil)) // -p
	_, err := h.upload(wire.WriteParams{Path: filepath.Join(dir, "x/f.txt")}, []byte("hi"))
	must(err)
	must(os.Symlink("f.txt", filepath.Join(dir, "x/link")))

	var list []api.FileInfo
	list, err = h.list(wire.ListParams{Path: filepath.Join(dir, "x")})
	must(err)
	if names := infoNames(list); names != "f.txt link y" {
		t.Errorf("list depth 1 = %s", names)
	}
	list, err = h.list(wire.ListParams{Path: filepath.Join(dir, "x"), Depth: 3})
	must(err)
	if names := infoNames(list); names != "f.txt link y z" {
		t.Errorf("list depth 3 = %s", names)
	}
	must(h.conn.Invoke(ctx, wire.MethodStat, wire.PathParams{Path: filepath.Join(dir, "x/link")}, &info))
	if info.Type != api.FileSymlink || info.SymlinkTarget != "f.txt" {
		t.Errorf("stat symlink = %+v", info)
	}

	must(h.conn.Invoke(ctx, wire.MethodMove, wire.MoveParams{From: filepath.Join(dir, "x/f.txt"), To: filepath.Join(dir, "new/dir/g.txt")}, &info))
	if info.Name != "g.txt" || info.Size != 2 {
		t.Errorf("move info = %+v", info)
	}
	must(h.conn.Invoke(ctx, wire.MethodRemove, wire.PathParams{Path: filepath.Join(dir, "x")}, nil))
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Errorf("x still exists: %v", err)
	}

	errs := []struct {
		name   string
		method string
		params any
		code   api.ErrorCode
	}{
		{"stat missing", wire.MethodStat, wire.PathParams{Path: filepath.Join(dir, "nope")}, api.CodeNotFound},
		{"remove missing", wire.MethodRemove, wire.PathParams{Path: filepath.Join(dir, "nope")}, api.CodeNotFound},
		{"empty path", wire.MethodStat, wire.PathParams{Path: ""}, api.CodeInvalidArgument},
		{"NUL byte", wire.MethodStat, wire.PathParams{Path: "a\x00b"}, api.CodeInvalidArgument},
		{"list a file", wire.MethodList, wire.ListParams{Path: filepath.Join(dir, "new/dir/g.txt")}, api.CodeInvalidArgument},
		{"mkdir over a file", wire.MethodMkdir, wire.PathParams{Path: filepath.Join(dir, "new/dir/g.txt/sub")}, api.CodeInvalidArgument},
		{"read a directory", wire.MethodRead, wire.PathParams{Path: dir}, api.CodeInvalidArgument},
		{"remove /", wire.MethodRemove, wire.PathParams{Path: "/", User: "root"}, api.CodeInvalidArgument},
		{"bad user", wire.MethodStat, wire.PathParams{Path: "/", User: "bob"}, api.CodeInvalidArgument},
	}
	for _, tc := range errs {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.conn.Invoke(ctx, tc.method, tc.params, nil); errCode(err) != tc.code {
				t.Errorf("error = %v, want %s", err, tc.code)
			}
		})
	}
}

func infoNames(list []api.FileInfo) string {
	var names []string
	for _, fi := range list {
		names = append(names, fi.Name)
	}
	return strings.Join(names, " ")
}

// Operations for "user" have the user's permissions, not root's.
func TestFilePermissions(t *testing.T) {
	requireRoot(t)
	h := newHarness(t)
	ctx := context.Background()
	private := t.TempDir() // 0700 root
	tests := []struct {
		name   string
		method string
		params any
		code   api.ErrorCode
	}{
		{"user stat in root's dir", wire.MethodStat, wire.PathParams{Path: filepath.Join(private, "f")}, api.CodePermissionDenied},
		{"user mkdir in /root", wire.MethodMkdir, wire.PathParams{Path: "/root/kiln-test-dir"}, api.CodePermissionDenied},
		{"user list root's dir", wire.MethodList, wire.ListParams{Path: private}, api.CodePermissionDenied},
		{"root mkdir", wire.MethodMkdir, wire.PathParams{Path: filepath.Join(private, "d"), User: "root"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.conn.Invoke(ctx, tc.method, tc.params, nil); errCode(err) != tc.code {
				t.Errorf("error = %v, want %q", err, tc.code)
			}
		})
	}
	if _, err := h.upload(wire.WriteParams{Path: "/root/kiln-test-file"}, []byte("x")); errCode(err) != api.CodePermissionDenied {
		t.Errorf("user write into /root: %v", err)
	}
	if _, err := os.Stat("/root/kiln-test-file"); err == nil {
		os.Remove("/root/kiln-test-file")
		t.Error("the file was created")
	}
	if _, err := h.upload(wire.WriteParams{Path: filepath.Join(private, "rootfile"), User: "root"}, []byte("x")); err != nil {
		t.Errorf("root write: %v", err)
	}
}

// A full disk is resource_exhausted with a clear message, and leaves
// nothing behind.
func TestWriteDiskFull(t *testing.T) {
	requireRoot(t)
	dir := userDir(t)
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
		t.Skipf("mounting tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	h := newHarness(t)
	_, err := h.upload(wire.WriteParams{Path: filepath.Join(dir, "big")}, make([]byte, 3<<20))
	var e *api.Error
	if !errors.As(err, &e) || e.Code != api.CodeResourceExhausted || !strings.Contains(e.Message, "disk full") {
		t.Fatalf("error = %v, want resource_exhausted disk full", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

func TestWatch(t *testing.T) {
	h := newHarness(t)
	dir := userDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodWatch, wire.WatchParams{Path: dir, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if ev := nextEvent(t, ctx, st); ev.Type != api.EventStart || ev.Seq != 1 {
		t.Fatalf("first event = %+v, want start", ev)
	}
	want := []api.FileEvent{
		{Op: api.FileCreate, Path: filepath.Join(dir, "sub")},
		{Op: api.FileCreate, Path: filepath.Join(dir, "sub/f")},
		{Op: api.FileWrite, Path: filepath.Join(dir, "sub/f")},
		{Op: api.FileRename, Path: filepath.Join(dir, "sub/f")},
		{Op: api.FileCreate, Path: filepath.Join(dir, "g")},
		{Op: api.FileRemove, Path: filepath.Join(dir, "g")},
	}
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	if ev := nextEvent(t, ctx, st); ev.File == nil || *ev.File != want[0] {
		t.Fatalf("event = %+v, want %+v", ev, want[0])
	}
	os.WriteFile(filepath.Join(dir, "sub/f"), []byte("x"), 0o644)
	os.Rename(filepath.Join(dir, "sub/f"), filepath.Join(dir, "g"))
	os.Remove(filepath.Join(dir, "g"))
	for i, w := range want[1:] {
		ev := nextEvent(t, ctx, st)
		if ev.File == nil || *ev.File != w || ev.Seq != uint64(i+3) {
			t.Errorf("event %d = %+v %+v, want %+v", i+1, ev, ev.File, w)
		}
	}
}
