package agent

import (
	"context"
	"io"
	"os"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agent/files"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

func (s *Server) stat(ctx context.Context, p wire.PathParams) (any, error) {
	a, err := lookupAccount(p.User)
	if err != nil {
		return nil, err
	}
	return s.files.Stat(ctx, a.filesUser(), p.Path, files.Detail{XattrPrefix: p.XattrPrefix, Links: p.ResolveLinks})
}

// list sends a listing as events of wire.ListBatch entries.
func (s *Server) list(ctx context.Context, st *channel.Stream, p wire.ListParams) error {
	a, err := lookupAccount(p.User)
	if err != nil {
		return err
	}
	infos, err := s.files.List(ctx, a.filesUser(), p.Path, p.Depth, files.Detail{XattrPrefix: p.XattrPrefix, Links: p.ResolveLinks})
	for err == nil && len(infos) > 0 {
		n := min(len(infos), wire.ListBatch)
		err = st.SendEvent(ctx, infos[:n])
		infos = infos[n:]
	}
	return err
}

func (s *Server) mkdir(ctx context.Context, p wire.PathParams) (any, error) {
	a, err := lookupAccount(p.User)
	if err != nil {
		return nil, err
	}
	return s.files.Mkdir(ctx, a.filesUser(), p.Path)
}

func (s *Server) move(ctx context.Context, p wire.MoveParams) (any, error) {
	a, err := lookupAccount(p.User)
	if err != nil {
		return nil, err
	}
	return s.files.Move(ctx, a.filesUser(), p.From, p.To)
}

func (s *Server) remove(ctx context.Context, p wire.PathParams) error {
	a, err := lookupAccount(p.User)
	if err != nil {
		return err
	}
	return s.files.Remove(ctx, a.filesUser(), p.Path)
}

// read streams a file as data frames; the result is its FileInfo.
func (s *Server) read(ctx context.Context, st *channel.Stream, p wire.PathParams) (any, error) {
	a, err := lookupAccount(p.User)
	if err != nil {
		return nil, err
	}
	return s.files.Read(ctx, a.filesUser(), p.Path, func(b []byte) error { return st.SendData(ctx, b) })
}

// write stores the data frames that follow until the host's end.
func (s *Server) write(ctx context.Context, st *channel.Stream, p wire.WriteParams) (any, error) {
	a, err := lookupAccount(p.User)
	if err != nil {
		return nil, err
	}
	if p.Mode > 0o7777 {
		return nil, &api.Error{Code: api.CodeInvalidArgument, Message: "mode has bits beyond 07777"}
	}
	r := &streamReader{ctx: ctx, st: st}
	return s.files.Write(ctx, a.filesUser(), p.Path, files.WriteOptions{
		Mode: p.Mode, Append: p.Append, InPlace: p.InPlace, XattrPrefix: p.XattrPrefix, Xattrs: p.Xattrs}, r)
}

func (s *Server) watch(ctx context.Context, st *channel.Stream, p wire.WatchParams) error {
	a, err := lookupAccount(p.User)
	if err != nil {
		return err
	}
	return s.files.Watch(ctx, a.filesUser(), p.Path, p.Recursive, func(ev api.Event) error { return st.SendEvent(ctx, ev) })
}

// streamReader reads the data frames of a stream until the peer's end
// (io.EOF); event frames are skipped.
type streamReader struct {
	ctx context.Context
	st  *channel.Stream
	buf []byte
}

func (r *streamReader) Read(b []byte) (int, error) {
	for len(r.buf) == 0 {
		f, err := r.st.Recv(r.ctx)
		if err != nil {
			return 0, err
		}
		if f.Type == channel.FrameData {
			r.buf = f.Payload
		}
	}
	n := copy(b, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

var _ io.Reader = (*streamReader)(nil)

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}
