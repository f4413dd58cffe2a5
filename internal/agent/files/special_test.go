package files

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
)

// TestSpecialFiles: reads and writes of what is not a regular file are
// refused at once with invalid_argument (a FIFO without a writer used to
// hang the read, a device may never end), and a path ending in "/" is
// not written as a file. Through the API on real sandboxes: server's
// TestHostileInput and envd's TestHostileInput.
func TestSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	s := New(nil)
	root := User{Name: "root", Home: dir}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		op   func() error
		code api.ErrorCode
	}{
		{"read fifo", func() error {
			_, err := s.Read(ctx, root, fifo, func([]byte) error { return nil })
			return err
		}, api.CodeInvalidArgument},
		{"read device", func() error {
			_, err := s.Read(ctx, root, "/dev/zero", func([]byte) error { return nil })
			return err
		}, api.CodeInvalidArgument},
		{"read directory", func() error {
			_, err := s.Read(ctx, root, dir, func([]byte) error { return nil })
			return err
		}, api.CodeInvalidArgument},
		{"write fifo in place", func() error {
			_, err := s.Write(ctx, root, fifo, WriteOptions{InPlace: true}, bytes.NewReader([]byte("x")))
			return err
		}, api.CodeInvalidArgument},
		{"replace fifo", func() error {
			_, err := s.Write(ctx, root, fifo, WriteOptions{}, bytes.NewReader([]byte("x")))
			return err
		}, api.CodeInvalidArgument},
		{"write trailing slash", func() error {
			_, err := s.Write(ctx, root, filepath.Join(dir, "newdir")+"/", WriteOptions{}, bytes.NewReader([]byte("x")))
			return err
		}, api.CodeInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- tc.op() }()
			select {
			case err := <-done:
				var e *api.Error
				if !errors.As(err, &e) || e.Code != tc.code {
					t.Errorf("got %v, want %s", err, tc.code)
				}
			case <-ctx.Done():
				t.Fatal("still blocked after 20 s")
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(dir, "newdir")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write to newdir/ left newdir: %v", err)
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the FIFO was replaced: %v, %v", fi, err)
	}
}

// TestClassifyDeviceErrors: the errors of special files (/proc/self/mem's
// EIO, /dev/tty's ENXIO) are the file's fault, not the agent's.
func TestClassifyDeviceErrors(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EIO, syscall.ENXIO, syscall.ENODEV, syscall.EROFS} {
		var e *api.Error
		if err := classify("reading", "/p", &os.PathError{Op: "read", Path: "/p", Err: errno}); !errors.As(err, &e) || e.Code != api.CodeFailedPrecondition {
			t.Errorf("classify(%v) = %v, want failed_precondition", errno, err)
		}
	}
}
