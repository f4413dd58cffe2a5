package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// readFile streams a file's contents.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "path", "user"); err != nil {
		return err
	}
	p, err := pathParams(q)
	if err != nil {
		return err
	}
	a, _, err := s.agentFor(r)
	if err != nil {
		return err
	}
	out := &lazyWriter{w: w}
	if _, err := a.ReadFile(r.Context(), p, out); err != nil {
		if out.started {
			// The status is sent: cut the body short so the client sees
			// an incomplete response, not a truncated file.
			s.log.Warn("reading file failed mid-stream", "request_id", edge.RequestID(r.Context()), "err", err)
			panic(http.ErrAbortHandler)
		}
		return fmt.Errorf("reading file: %w", err)
	}
	out.begin()
	return nil
}

// lazyWriter sends the 200 header with the first byte, so an error before
// any (a missing file) can still be answered with its status.
type lazyWriter struct {
	w       http.ResponseWriter
	started bool
}

func (lw *lazyWriter) begin() {
	if !lw.started {
		lw.started = true
		lw.w.Header().Set("Content-Type", "application/octet-stream")
		lw.w.WriteHeader(http.StatusOK)
	}
}

func (lw *lazyWriter) Write(b []byte) (int, error) {
	lw.begin()
	return lw.w.Write(b)
}

// writeFile streams the body into one file.
func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "path", "user", "mode"); err != nil {
		return err
	}
	pp, err := pathParams(q)
	if err != nil {
		return err
	}
	mode, err := modeParam(q.Get("mode"))
	if err != nil {
		return err
	}
	a, sb, err := s.agentFor(r)
	if err != nil {
		return err
	}
	body := http.MaxBytesReader(w, r.Body, sb.Limits.DiskBytes)
	fi, err := a.WriteFile(r.Context(), wire.WriteParams{Path: pp.Path, User: pp.User, Mode: mode}, body)
	if err != nil {
		return fmt.Errorf("writing file: %w", err)
	}
	return writeJSON(w, http.StatusOK, fi)
}

// modeParam parses permission bits in octal ("644", "0644", "0o644").
func modeParam(v string) (uint32, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(v, "0o"), "0"), 8, 32)
	if v == "0" {
		n, err = 0, nil
	}
	if err != nil || n > 0o7777 {
		return 0, invalid("mode %q: want octal permission bits such as 0644", errdefs.ClipN(v, 16))
	}
	return uint32(n), nil
}

// uploadFiles writes each file part of a multipart body, streamed, to its
// filename relative to ?dir.
func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "dir", "user"); err != nil {
		return err
	}
	dir := q.Get("dir")
	if dir != "" {
		if err := checkPath("dir", dir); err != nil {
			return err
		}
	}
	user, err := checkUser(q.Get("user"))
	if err != nil {
		return err
	}
	a, sb, err := s.agentFor(r)
	if err != nil {
		return err
	}
	r.Body = http.MaxBytesReader(w, r.Body, sb.Limits.DiskBytes)
	mr, err := r.MultipartReader()
	if err != nil {
		return invalid("want a multipart/form-data body: %v", err)
	}
	infos, err := uploadParts(r.Context(), a, mr, dir, user)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, infos)
}

func uploadParts(ctx context.Context, a *sandbox.Agent, mr *multipart.Reader, dir, user string) ([]api.FileInfo, error) {
	infos := []api.FileInfo{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return infos, nil
		}
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				return nil, err
			}
			return nil, invalid("reading multipart body: %v", err)
		}
		name, err := partPath(part.Header.Get("Content-Disposition"), dir)
		if err != nil || name == "" {
			part.Close()
			if err != nil {
				return nil, err
			}
			continue // a form field, not a file
		}
		if len(infos) == sandbox.MaxUploadFiles {
			return nil, invalid("more than %d files in one upload", sandbox.MaxUploadFiles)
		}
		fi, err := a.WriteFile(ctx, wire.WriteParams{Path: name, User: user}, part)
		part.Close()
		if err != nil {
			return nil, fmt.Errorf("uploading %q: %w", errdefs.ClipN(name, 256), err)
		}
		infos = append(infos, fi)
	}
}

// partPath is where a part goes: its raw filename (multipart.Part's
// FileName keeps only the base name) joined to dir. "" means the part is
// not a file. A filename may name subdirectories but not "..": the part
// stays under dir (or, without dir, where its name says).
func partPath(disposition, dir string) (string, error) {
	_, params, err := mime.ParseMediaType(disposition)
	if err != nil {
		return "", invalid("part content-disposition %q: %v", errdefs.ClipN(disposition, 64), err)
	}
	name, ok := params["filename"]
	if !ok {
		return "", nil
	}
	if err := checkPath("part filename", name); err != nil {
		return "", err
	}
	if slices.Contains(strings.Split(name, "/"), "..") {
		return "", invalid("part filename %q: must not contain '..'", errdefs.ClipN(name, 64))
	}
	if dir != "" {
		name = path.Join(dir, name)
	}
	return name, nil
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathQuery(r.URL.Query(), "path", "user")
	if err != nil {
		return err
	}
	return s.withAgent(w, r, http.StatusNoContent, func(ctx context.Context, a *sandbox.Agent) (any, error) {
		return nil, a.Remove(ctx, p)
	})
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p, err := pathQuery(q, "path", "user", "depth")
	if err != nil {
		return err
	}
	depth, err := intParam(q, "depth", 1, 1, 64)
	if err != nil {
		return err
	}
	return s.withAgent(w, r, http.StatusOK, func(ctx context.Context, a *sandbox.Agent) (any, error) {
		fis, err := a.List(ctx, wire.ListParams{Path: p.Path, User: p.User, Depth: int(depth)})
		if fis == nil {
			fis = []api.FileInfo{}
		}
		return fis, err
	})
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) error {
	p, err := pathQuery(r.URL.Query(), "path", "user")
	if err != nil {
		return err
	}
	return s.withAgent(w, r, http.StatusOK, func(ctx context.Context, a *sandbox.Agent) (any, error) {
		return a.Stat(ctx, p)
	})
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) error {
	var req api.PathRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	p, err := pathParams(url.Values{"path": {req.Path}, "user": {req.User}})
	if err != nil {
		return err
	}
	return s.withAgent(w, r, http.StatusOK, func(ctx context.Context, a *sandbox.Agent) (any, error) {
		return a.Mkdir(ctx, p)
	})
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request) error {
	var req api.MoveRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := errors.Join(checkPath("from", req.From), checkPath("to", req.To)); err != nil {
		return err
	}
	user, err := checkUser(req.User)
	if err != nil {
		return err
	}
	return s.withAgent(w, r, http.StatusOK, func(ctx context.Context, a *sandbox.Agent) (any, error) {
		return a.Move(ctx, wire.MoveParams{From: req.From, To: req.To, User: user})
	})
}

// pathQuery checks q against allowed and reads ?path=P&user=U.
func pathQuery(q url.Values, allowed ...string) (wire.PathParams, error) {
	if err := checkQuery(q, allowed...); err != nil {
		return wire.PathParams{}, err
	}
	return pathParams(q)
}

// withAgent runs a unary call against the agent of the caller's running
// sandbox {id} and answers its result with status.
func (s *Server) withAgent(w http.ResponseWriter, r *http.Request, status int, call func(context.Context, *sandbox.Agent) (any, error)) error {
	a, _, err := s.agentFor(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), agentCallTimeout)
	defer cancel()
	v, err := call(ctx, a)
	if err != nil {
		return fmt.Errorf("%s: %w", path.Base(r.Pattern), err)
	}
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return nil
	}
	return writeJSON(w, status, v)
}

func (s *Server) watchFiles(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	if err := checkQuery(q, "path", "user", "recursive"); err != nil {
		return err
	}
	p, err := pathParams(q)
	if err != nil {
		return err
	}
	recursive, err := boolParam(q, "recursive")
	if err != nil {
		return err
	}
	a, _, err := s.agentFor(r)
	if err != nil {
		return err
	}
	st := s.newStream(w, r)
	err = a.Watch(st.ctx, wire.WatchParams{Path: p.Path, User: p.User, Recursive: recursive}, st.send)
	return st.finish(err)
}
