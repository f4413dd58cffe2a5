package files

import (
	"context"
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
)

// readChunk is how much of a file one send carries.
const readChunk = 256 << 10

// Read opens path (following symlinks) as the user and passes its
// contents to send in chunks, in order. It returns the file's description
// as of opening.
func (s *Service) Read(ctx context.Context, u User, path string, send func([]byte) error) (api.FileInfo, error) {
	p, err := Resolve(u, path)
	if err != nil {
		return api.FileInfo{}, err
	}
	var f *os.File
	var info api.FileInfo
	err = asUser(u, func() error {
		var err error
		// Non-blocking, so that opening a FIFO without a writer does not
		// wait for one; only regular files are read.
		if f, err = os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0); err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		if !fi.Mode().IsRegular() {
			f.Close()
			return notRegular("reading", p, fi)
		}
		info = fileInfo(p, fi, loadNames())
		return nil
	})
	if err != nil {
		return api.FileInfo{}, classify("reading", p, err)
	}
	defer f.Close()
	buf := make([]byte, readChunk)
	for {
		if err := ctx.Err(); err != nil {
			return api.FileInfo{}, err
		}
		n, err := f.Read(buf)
		if n > 0 {
			if err := send(buf[:n]); err != nil {
				return api.FileInfo{}, err
			}
		}
		if errors.Is(err, io.EOF) {
			return info, nil
		}
		if err != nil {
			return api.FileInfo{}, classify("reading", p, err)
		}
	}
}
