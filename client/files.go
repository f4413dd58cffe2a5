package client

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"

	"github.com/kiln-sh/kiln/api"
)

// FileOption adjusts a file operation.
type FileOption func(*fileOptions)

type fileOptions struct {
	user string
	mode fs.FileMode // 0: the server's default
}

// AsUser performs the operation as user ("user", the default, or "root");
// relative paths are relative to that user's home.
func AsUser(user string) FileOption { return func(o *fileOptions) { o.user = user } }

// WithMode sets the permission bits of a file [Client.WriteFile] creates
// (default 0644).
func WithMode(mode fs.FileMode) FileOption { return func(o *fileOptions) { o.mode = mode } }

func fileQuery(key, path string, opts []FileOption) (url.Values, fileOptions) {
	var o fileOptions
	for _, f := range opts {
		f(&o)
	}
	q := url.Values{}
	if path != "" {
		q.Set(key, path)
	}
	if o.user != "" {
		q.Set("user", o.user)
	}
	return q, o
}

// ReadFile streams the file at path in the sandbox to w and returns the
// number of bytes copied.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer, opts ...FileOption) (int64, error) {
	q, _ := fileQuery("path", path, opts)
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "files"), query: q, accept: "application/octet-stream"})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("reading %s: %w", path, err)
	}
	return n, nil
}

// WriteFile creates or replaces the file at path with what r yields,
// streaming it (nothing is buffered in memory), creating missing parent
// directories. r is not closed.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, opts ...FileOption) (*api.FileInfo, error) {
	q, o := fileQuery("path", path, opts)
	if o.mode != 0 {
		q.Set("mode", "0"+strconv.FormatUint(uint64(o.mode.Perm()), 8))
	}
	if _, ok := r.(io.Closer); ok {
		r = struct{ io.Reader }{r} // the transport would close it
	}
	var fi api.FileInfo
	resp, err := c.send(ctx, request{method: http.MethodPut, path: sandboxPath(id, "files"), query: q, body: r, ctype: "application/octet-stream"})
	if err != nil {
		return nil, err
	}
	defer drain(resp.Body)
	if err := decodeJSON(resp, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Upload is one file for [Client.UploadFiles].
type Upload struct {
	Path    string    // relative to the upload directory, or absolute
	Content io.Reader // read until EOF; not closed
}

// UploadFiles writes several files in one multipart request, streaming each
// one's Content in turn. Relative paths are relative to dir (default: the
// user's home).
func (c *Client) UploadFiles(ctx context.Context, id, dir string, files []Upload, opts ...FileOption) ([]api.FileInfo, error) {
	q, _ := fileQuery("dir", dir, opts)
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		for _, f := range files {
			part, err := mw.CreateFormFile("file", f.Path)
			if err == nil {
				_, err = io.Copy(part, f.Content)
			}
			if err != nil {
				pw.CloseWithError(fmt.Errorf("uploading %s: %w", f.Path, err))
				return
			}
		}
		pw.CloseWithError(mw.Close())
	}()
	// Whatever happens, unblock the writer goroutine.
	defer pr.CloseWithError(io.ErrClosedPipe)
	resp, err := c.send(ctx, request{method: http.MethodPost, path: sandboxPath(id, "files"), query: q, body: pr, ctype: mw.FormDataContentType()})
	if err != nil {
		return nil, err
	}
	defer drain(resp.Body)
	var fis []api.FileInfo
	if err := decodeJSON(resp, &fis); err != nil {
		return nil, err
	}
	return fis, nil
}

// ListFiles lists the directory at path, descending depth levels (0 or 1:
// only its entries).
func (c *Client) ListFiles(ctx context.Context, id, path string, depth int, opts ...FileOption) ([]api.FileInfo, error) {
	q, _ := fileQuery("path", path, opts)
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	var fis []api.FileInfo
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "files", "list"), q, nil, &fis); err != nil {
		return nil, err
	}
	return fis, nil
}

// Stat describes the entry at path (a symlink itself, not its target).
func (c *Client) Stat(ctx context.Context, id, path string, opts ...FileOption) (*api.FileInfo, error) {
	q, _ := fileQuery("path", path, opts)
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodGet, sandboxPath(id, "files", "stat"), q, nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Mkdir creates the directory path and any missing parents.
func (c *Client) Mkdir(ctx context.Context, id, path string, opts ...FileOption) (*api.FileInfo, error) {
	_, o := fileQuery("", "", opts)
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "files", "mkdir"), nil, api.PathRequest{Path: path, User: o.user}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Move renames from to to.
func (c *Client) Move(ctx context.Context, id, from, to string, opts ...FileOption) (*api.FileInfo, error) {
	_, o := fileQuery("", "", opts)
	var fi api.FileInfo
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "files", "move"), nil, api.MoveRequest{From: from, To: to, User: o.user}, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Remove deletes path, recursively if it is a directory.
func (c *Client) Remove(ctx context.Context, id, path string, opts ...FileOption) error {
	q, _ := fileQuery("path", path, opts)
	return c.call(ctx, http.MethodDelete, sandboxPath(id, "files"), q, nil, nil)
}

// Watch calls fn with each change under the directory path (only events
// of type file, with File set; the stream's other events are skipped), and everything below it if recursive, until ctx
// is done (it returns ctx.Err()), fn returns an error (it returns that), or
// the stream ends (an error saying so).
func (c *Client) Watch(ctx context.Context, id, path string, recursive bool, fn func(api.Event) error, opts ...FileOption) error {
	q, _ := fileQuery("path", path, opts)
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "files", "watch"), query: q, accept: ndjson})
	if err != nil {
		return err
	}
	defer drain(resp.Body)
	var streamErr error
	last, err := readEvents(ctx, resp.Body, func(ev api.Event) error {
		if ev.Type == api.EventError {
			streamErr = streamError(ev, "watch ended with an error")
			return errStop
		}
		if ev.Type != api.EventFile || ev.File == nil {
			return nil // e.g. the start event that says the watch is set up
		}
		return fn(ev)
	})
	switch {
	case streamErr != nil:
		return streamErr
	case err == io.EOF:
		return fmt.Errorf("watching %s: stream ended after seq %d: %w", path, last, io.ErrUnexpectedEOF)
	}
	return err
}
