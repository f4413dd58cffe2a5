package files

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"golang.org/x/sys/unix"
)

// TestWriteXattrsInPlace writes files in place and with extended
// attributes, which later writes replace, and reads them back by Stat
// and List, which also resolves symlinks.
func TestWriteXattrsInPlace(t *testing.T) {
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe")
	os.WriteFile(probe, nil, 0o644)
	if err := unix.Setxattr(probe, "user.probe", []byte("1"), 0); err != nil {
		t.Skipf("no user extended attributes on %s: %v", dir, err)
	}
	s := New(nil)
	ctx := context.Background()
	u := User{Name: "user", UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Home: dir}
	inode := func(p string) uint64 {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	p := filepath.Join(dir, "f")
	steps := []struct {
		name    string
		opts    WriteOptions
		content string
		want    map[string]string
		code    api.ErrorCode
	}{
		{"create with attributes", WriteOptions{InPlace: true, XattrPrefix: "user.app.", Xattrs: map[string]string{"a": "1", "b": "2"}}, "one", map[string]string{"a": "1", "b": "2"}, ""},
		{"replace them", WriteOptions{InPlace: true, XattrPrefix: "user.app.", Xattrs: map[string]string{"c": "3"}}, "two", map[string]string{"c": "3"}, ""},
		{"keep them without a prefix", WriteOptions{InPlace: true}, "three", map[string]string{"c": "3"}, ""},
		{"clear them", WriteOptions{XattrPrefix: "user.app."}, "four", nil, ""},
		{"only the user namespace", WriteOptions{XattrPrefix: "trusted."}, "x", nil, api.CodeInvalidArgument},
	}
	for _, st := range steps {
		before := uint64(0)
		if _, err := os.Stat(p); err == nil {
			before = inode(p)
		}
		_, err := s.Write(ctx, u, "f", st.opts, strings.NewReader(st.content))
		if st.code != "" {
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != st.code {
				t.Errorf("%s: error %v, want %s", st.name, err, st.code)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if b, _ := os.ReadFile(p); string(b) != st.content {
			t.Errorf("%s: content %q", st.name, b)
		}
		if st.opts.InPlace && before != 0 && inode(p) != before {
			t.Errorf("%s: in-place write replaced the file", st.name)
		}
		if fi, err := s.Stat(ctx, u, "f", Detail{XattrPrefix: "user.app."}); err != nil || !maps.Equal(fi.Xattrs, st.want) {
			t.Errorf("%s: Stat = %+v, %v; want xattrs %v", st.name, fi, err, st.want)
		}
	}
	os.Symlink("f", filepath.Join(dir, "link"))
	os.Symlink("nowhere", filepath.Join(dir, "broken"))
	unix.Setxattr(p, "user.app.listed", []byte("yes"), 0)
	list, err := s.List(ctx, u, ".", 1, Detail{XattrPrefix: "user.app.", Links: true})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, fi := range list {
		switch fi.Name {
		case "f":
			seen++
			if fi.Xattrs["listed"] != "yes" || fi.Target != nil {
				t.Errorf("List entry %+v", fi)
			}
		case "link": // described with what it points to
			seen++
			if fi.Type != api.FileSymlink || fi.Target == nil || fi.Target.Path != p || fi.Target.Type != api.FileRegular {
				t.Errorf("List entry %+v (target %+v)", fi, fi.Target)
			}
		case "broken":
			seen++
			if fi.Type != api.FileSymlink || fi.Target != nil {
				t.Errorf("List entry %+v", fi)
			}
		}
	}
	if seen != 3 {
		t.Errorf("List = %+v", list)
	}
}
