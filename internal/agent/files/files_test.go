package files

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kiln-sh/kiln/api"
)

func TestResolve(t *testing.T) {
	u := User{Name: "user", Home: "/home/user"}
	tests := []struct {
		in, want string
		code     api.ErrorCode
	}{
		{in: "a/b", want: "/home/user/a/b"},
		{in: "./a/../b/", want: "/home/user/b"},
		{in: "/etc//passwd", want: "/etc/passwd"},
		{in: "/../../etc", want: "/etc"},
		{in: "../..", want: "/"},
		{in: "", code: api.CodeInvalidArgument},
		{in: "a\x00b", code: api.CodeInvalidArgument},
	}
	for _, tc := range tests {
		got, err := Resolve(u, tc.in)
		if tc.code != "" {
			var e *api.Error
			if !errors.As(err, &e) || e.Code != tc.code {
				t.Errorf("Resolve(%q) error = %v, want %s", tc.in, err, tc.code)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		err  error
		code api.ErrorCode
	}{
		{&os.PathError{Op: "open", Path: "x", Err: syscall.ENOENT}, api.CodeNotFound},
		{&os.PathError{Op: "open", Path: "x", Err: syscall.EACCES}, api.CodePermissionDenied},
		{&os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}, api.CodeResourceExhausted},
		{&os.LinkError{Op: "rename", Err: syscall.EXDEV}, api.CodeFailedPrecondition},
		{&os.PathError{Op: "mkdir", Path: "x", Err: syscall.ENOTDIR}, api.CodeInvalidArgument},
		{&os.PathError{Op: "rmdir", Path: "x", Err: syscall.ENOTEMPTY}, api.CodeFailedPrecondition},
		{&api.Error{Code: api.CodeAlreadyExists}, api.CodeAlreadyExists},
	}
	for _, tc := range tests {
		var e *api.Error
		if err := classify("doing", "/p", tc.err); !errors.As(err, &e) || e.Code != tc.code {
			t.Errorf("classify(%v) = %v, want %s", tc.err, err, tc.code)
		}
	}
}

// Files a non-root user creates are theirs; root's thread is unaffected.
func TestAsUserOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch users")
	}
	dir := t.TempDir()
	os.Chmod(filepath.Dir(dir), 0o777)
	os.Chmod(dir, 0o777)
	s := New(nil)
	u := User{Name: "user", UID: 1000, GID: 1000, Groups: []uint32{1000}, Home: dir}
	if _, err := s.Mkdir(context.Background(), u, "a/b"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "a/b"} {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s owned by %d:%d, want 1000:1000", p, st.Uid, st.Gid)
		}
	}
	if os.Geteuid() != 0 || os.Getegid() != 0 {
		t.Error("the calling thread's credentials changed")
	}
	info, err := s.Stat(context.Background(), u, "a", Detail{})
	if err != nil || info.Owner == "" || info.Type != api.FileDir || info.Mode != 0o755 {
		t.Errorf("stat = %+v, %v", info, err)
	}
}
