package envd

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// download answers GET /files: the file's contents, streamed from the
// agent, gzip-compressed when the client accepts it.
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	q := r.URL.Query()
	user, ok := fileUser(q.Get("username"), t.sb)
	if !ok {
		writeError(w, http.StatusUnauthorized, fmt.Sprintf("error looking up user '%s': unknown user", errdefs.Clip(q.Get("username"))))
		return
	}
	fi, status, msg := t.downloadable(r.Context(), user, expandPath(q.Get("path"), t.sb))
	if status != http.StatusOK {
		writeError(w, status, msg)
		return
	}
	if err := t.send(w, r, user, fi); err != nil {
		// Part of the file was sent: only a broken connection tells the
		// client it is incomplete.
		h.log.Warn("download broke off", "sandbox_id", t.sb.ID, "path", fi.Path, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// downloadable describes the file at p (following symlinks), or says why
// it cannot be downloaded, in envd's words.
func (t *target) downloadable(ctx context.Context, user, p string) (api.FileInfo, int, string) {
	fi, err := t.agent.Stat(ctx, wire.PathParams{Path: p, User: user, ResolveLinks: true})
	switch {
	case err == nil && fi.Target != nil:
		fi = *fi.Target
	case err == nil && fi.Type == api.FileSymlink:
		err = fmt.Errorf("%s is a broken symlink: %w", fi.Path, errdefs.ErrNotFound)
	}
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return fi, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", errdefs.Clip(p))
	case err != nil:
		status, msg := t.httpError(ctx, err)
		return fi, status, msg
	case fi.Type == api.FileDir:
		return fi, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", errdefs.Clip(fi.Path))
	}
	return fi, http.StatusOK, ""
}

// send streams the file fi. An error before its first byte is answered;
// one after is returned.
func (t *target) send(w http.ResponseWriter, r *http.Request, user string, fi api.FileInfo) error {
	hd := w.Header()
	hd.Set("Vary", "Accept-Encoding")
	ctype := mime.TypeByExtension(path.Ext(fi.Path))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	hd.Set("Content-Type", ctype)
	hd.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": fi.Name}))
	// A signed URL is a link a browser may open on kiln serve's own origin,
	// the web console's: a sandbox's HTML must not run script there (it
	// could read the signed-in key). "sandbox" gives it an opaque origin
	// and no scripts; nosniff keeps other types from being read as HTML.
	hd.Set("Content-Security-Policy", "sandbox")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Last-Modified", fi.ModTime.UTC().Format(http.TimeFormat))
	if r.Method == http.MethodHead { // the description only
		w.WriteHeader(http.StatusOK)
		return nil
	}
	out := &lazyWriter{w: w}
	var dst io.Writer = out
	var gz *gzip.Writer
	if acceptsGzip(r.Header.Get("Accept-Encoding")) {
		gz = gzip.NewWriter(out)
		dst = gz
		hd.Set("Content-Encoding", "gzip")
	} else if fi.Size == 0 {
		hd.Set("Content-Length", "0") // the SDK special-cases empty files by it
	}
	_, err := t.agent.ReadFile(r.Context(), wire.PathParams{Path: fi.Path, User: user}, dst)
	if err == nil && gz != nil {
		err = gz.Close()
	}
	switch {
	case err == nil:
		out.commit()
	case !out.written:
		for _, k := range []string{"Content-Length", "Content-Encoding", "Content-Disposition", "Last-Modified"} {
			hd.Del(k)
		}
		status, msg := t.httpError(r.Context(), err)
		writeError(w, status, msg)
		return nil
	}
	return err
}

// lazyWriter sends the success status only with the first byte, so that
// an error before any content can still be an error response.
type lazyWriter struct {
	w       http.ResponseWriter
	written bool
}

func (l *lazyWriter) Write(b []byte) (int, error) {
	l.commit()
	return l.w.Write(b)
}

func (l *lazyWriter) commit() {
	if !l.written {
		l.written = true
		l.w.WriteHeader(http.StatusOK)
	}
}

// acceptsGzip reports whether an Accept-Encoding header allows gzip.
func acceptsGzip(header string) bool {
	for _, part := range strings.Split(header, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(name), "gzip") && strings.TrimSpace(name) != "*" {
			continue
		}
		q := strings.ReplaceAll(params, " ", "")
		return q != "q=0" && !strings.HasPrefix(q, "q=0.0") && q != "q=0."
	}
	return false
}

// fileEntry is one written file in POST /files' answer.
type fileEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// upload answers POST /files: a multipart form whose "file" parts are
// written to the path query parameter or to their file names (which keep
// their directories), or a raw application/octet-stream body written to
// path; either may be gzip-encoded.
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r.Context())
	q := r.URL.Query()
	user, ok := fileUser(q.Get("username"), t.sb)
	if !ok {
		writeError(w, http.StatusUnauthorized, fmt.Sprintf("error looking up user '%s': unknown user", errdefs.Clip(q.Get("username"))))
		return
	}
	if err := decodeBody(r); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("error decompressing request body: %v", err))
		return
	}
	md, err := uploadMetadata(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	up := &uploader{t: t, user: user, path: q.Get("path"), hasPath: q.Get("path") != "", metadata: md}
	ctype := r.Header.Get("Content-Type")
	media, _, _ := mime.ParseMediaType(ctype)
	var status int
	var msg string
	switch {
	case media == "application/octet-stream":
		status, msg = up.raw(r)
	case strings.HasPrefix(media, "multipart/"):
		status, msg = up.multipart(r)
	default:
		status, msg = http.StatusBadRequest, fmt.Sprintf("unsupported content type: %s, expected multipart/form-data or application/octet-stream", errdefs.Clip(ctype))
	}
	if status != http.StatusOK {
		writeError(w, status, msg)
		return
	}
	writeJSON(w, http.StatusOK, up.written)
}

// decodeBody undoes a gzip Content-Encoding of r's body.
func decodeBody(r *http.Request) error {
	switch enc := r.Header.Get("Content-Encoding"); {
	case strings.EqualFold(enc, "gzip"):
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return err
		}
		r.Body = zr
	case enc != "" && !strings.EqualFold(enc, "identity"):
		return fmt.Errorf("unsupported Content-Encoding: %s", errdefs.Clip(enc))
	}
	return nil
}

// uploader writes the files of one upload.
type uploader struct {
	t        *target
	user     string
	path     string
	hasPath  bool
	metadata map[string]string
	written  []fileEntry
}

func (u *uploader) raw(r *http.Request) (int, string) {
	if !u.hasPath {
		return http.StatusBadRequest, "path query parameter is required for raw body upload"
	}
	return u.write(r, u.path, r.Body)
}

func (u *uploader) multipart(r *http.Request) (int, string) {
	mr, err := r.MultipartReader()
	if err != nil {
		return http.StatusBadRequest, fmt.Sprintf("error parsing multipart form: %v", err)
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return http.StatusBadRequest, fmt.Sprintf("error reading form: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		if len(u.written) == sandbox.MaxUploadFiles {
			part.Close()
			return http.StatusBadRequest, fmt.Sprintf("more than %d files in one upload", sandbox.MaxUploadFiles)
		}
		target := u.path
		if !u.hasPath {
			target = fileNameWithPath(part.Header.Get("Content-Disposition"))
		}
		status, msg := u.write(r, target, part)
		part.Close()
		if status != http.StatusOK {
			return status, msg
		}
	}
	return http.StatusOK, ""
}

// write streams one file to the agent.
func (u *uploader) write(r *http.Request, target string, body io.Reader) (int, string) {
	if target == "" {
		return http.StatusBadRequest, "no path given: set the path query parameter or the part's file name"
	}
	p := expandPath(target, u.t.sb)
	for _, e := range u.written {
		if e.Path == p || e.Path == target {
			return http.StatusBadRequest, fmt.Sprintf("you cannot upload multiple files to the same path '%s' in one upload request, only the first specified file was uploaded", errdefs.Clip(e.Path))
		}
	}
	// In place, as envd writes, so watchers see the file's own events;
	// the metadata replaces what the file had.
	in := &bodyReader{r: body}
	fi, err := u.t.agent.WriteFile(r.Context(), wire.WriteParams{Path: p, User: u.user, InPlace: true,
		XattrPrefix: metadataXattrs, Xattrs: u.metadata}, in)
	switch {
	case in.err != nil:
		return http.StatusBadRequest, fmt.Sprintf("error reading the upload: %v", in.err)
	case err != nil:
		return u.t.httpError(r.Context(), err)
	}
	for _, e := range u.written {
		if e.Path == fi.Path {
			return http.StatusBadRequest, fmt.Sprintf("you cannot upload multiple files to the same path '%s' in one upload request", errdefs.Clip(fi.Path))
		}
	}
	u.written = append(u.written, fileEntry{Path: fi.Path, Name: path.Base(fi.Path), Type: "file", Metadata: fi.Xattrs})
	return http.StatusOK, ""
}

// bodyReader remembers why reading an upload failed (a broken
// connection, bad gzip), which is the client's fault, not the sandbox's.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		b.err = err
	}
	return n, err
}

// Limits of a file's metadata, as envd's: what fits the extended
// attribute names and values it is stored in.
const (
	maxMetadataKey   = 255 - len(metadataXattrs)
	maxMetadataBytes = 4096
)

// uploadMetadata reads an upload's X-Metadata-<key>: <value> headers
// (keys lower-cased), which become the file's metadata.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var md map[string]string
	total := 0
	for name, vals := range h {
		key, ok := strings.CutPrefix(strings.ToLower(name), "x-metadata-")
		if !ok {
			continue
		}
		val := strings.Join(vals, ", ")
		switch {
		case key == "" || !printable(key) || !printable(val):
			return nil, fmt.Errorf("invalid metadata %q: keys and values must be printable ASCII", errdefs.Clip(key))
		case len(key) > maxMetadataKey:
			return nil, fmt.Errorf("metadata key %q is longer than %d bytes", errdefs.Clip(key), maxMetadataKey)
		}
		if total += len(key) + len(val); total > maxMetadataBytes {
			return nil, fmt.Errorf("metadata is larger than %d bytes", maxMetadataBytes)
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = val
	}
	return md, nil
}

func printable(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// fileNameWithPath is a form part's file name with its directories, which
// the SDKs use to name the sandbox path (mime/multipart's FileName drops
// them).
func fileNameWithPath(disposition string) string {
	_, params, err := mime.ParseMediaType(disposition)
	if err != nil {
		return ""
	}
	return params["filename"]
}
