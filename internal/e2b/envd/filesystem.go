package envd

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem/filesystemconnect"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// filesystemService is filesystem.Filesystem on top of the agent's file
// operations.
type filesystemService struct{ h *Handler }

var _ filesystemconnect.FilesystemHandler = filesystemService{}

// Stat describes a path (a symlink as envd does, see entry).
func (s filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	t := targetOf(ctx)
	user, err := rpcUser(req.Header(), t.sb)
	if err != nil {
		return nil, err
	}
	e, err := t.stat(ctx, user, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (t *target) stat(ctx context.Context, user, p string) (*filesystem.EntryInfo, error) {
	fi, err := t.agent.Stat(ctx, wire.PathParams{Path: expandPath(p, t.sb), User: user, XattrPrefix: metadataXattrs, ResolveLinks: true})
	if err != nil {
		return nil, rpcError(err)
	}
	e, err := t.entry(ctx, user, fi)
	return e, rpcError(err)
}

// MakeDir creates a directory and its parents; an existing directory is
// already_exists (the SDK's makeDir then returns false), anything else
// there invalid_argument.
func (s filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	t := targetOf(ctx)
	user, err := rpcUser(req.Header(), t.sb)
	if err != nil {
		return nil, err
	}
	p := wire.PathParams{Path: expandPath(req.Msg.GetPath(), t.sb), User: user}
	switch fi, err := t.agent.Stat(ctx, p); {
	case err == nil && fi.Type == api.FileDir:
		return nil, rpcErrorf(connect.CodeAlreadyExists, "directory already exists: %s", errdefs.Clip(fi.Path))
	case err == nil:
		return nil, rpcErrorf(connect.CodeInvalidArgument, "path already exists but it is not a directory: %s", errdefs.Clip(fi.Path))
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, rpcError(err)
	}
	fi, err := t.agent.Mkdir(ctx, wire.PathParams{Path: p.Path, User: user})
	if err != nil {
		return nil, rpcError(err)
	}
	e, err := t.entry(ctx, user, fi)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating destination's parents,
// and answers the destination's entry as Stat does (with its metadata),
// as envd does.
func (s filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	t := targetOf(ctx)
	user, err := rpcUser(req.Header(), t.sb)
	if err != nil {
		return nil, err
	}
	fi, err := t.agent.Move(ctx, wire.MoveParams{From: expandPath(req.Msg.GetSource(), t.sb),
		To: expandPath(req.Msg.GetDestination(), t.sb), User: user})
	if err != nil {
		return nil, rpcError(err)
	}
	e, err := t.stat(ctx, user, fi.Path)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// ListDir lists a directory to the given depth (0 means 1).
func (s filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	t := targetOf(ctx)
	user, err := rpcUser(req.Header(), t.sb)
	if err != nil {
		return nil, err
	}
	fis, err := t.agent.List(ctx, wire.ListParams{Path: expandPath(req.Msg.GetPath(), t.sb),
		Depth: int(min(max(req.Msg.GetDepth(), 1), 1<<16)), User: user, XattrPrefix: metadataXattrs, ResolveLinks: true})
	if err != nil {
		return nil, rpcError(err)
	}
	entries, err := t.entries(ctx, user, fis)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}

// Remove removes a file or directory tree; a missing path is no error.
func (s filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	t := targetOf(ctx)
	user, err := rpcUser(req.Header(), t.sb)
	if err != nil {
		return nil, err
	}
	err = t.agent.Remove(ctx, wire.PathParams{Path: expandPath(req.Msg.GetPath(), t.sb), User: user})
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
