package files

import (
	"context"
	"errors"
	"io"
	"os"

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
		if f, err = os.Open(p); err != nil {
			return err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return err
		}
		if fi.IsDir() {
			f.Close()
			return apiErrorf(api.CodeInvalidArgument, "reading %s: is a directory", p)
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
