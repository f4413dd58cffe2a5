package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

const (
	// maxWatchers bounds the polling watchers of one sandbox.
	maxWatchers = 64
	// maxPending bounds the events a polling watcher holds between polls;
	// beyond it the oldest are dropped.
	maxPending = 10000
	// watcherIdle removes a polling watcher nobody polled for this long.
	watcherIdle = 10 * time.Minute
)

// watchSpec is a watch request, streaming or polling.
type watchSpec struct {
	path         string
	recursive    bool
	includeEntry bool
}

// WatchDir streams changes under a directory: a start event once the
// watch is established, then file events named relative to it.
func (s filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	t := targetOf(ctx)
	user, err := rpcUser(req.Header(), t.sb)
	if err != nil {
		return err
	}
	var mu sync.Mutex // Send is not safe for concurrent use
	send := func(r *filesystem.WatchDirResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	reset := make(chan struct{}, 1)
	stop := keepalive(keepaliveInterval(req.Header()), reset, func() error {
		return send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}})
	})
	defer stop()
	m := req.Msg
	spec := watchSpec{path: m.GetPath(), recursive: m.GetRecursive(), includeEntry: m.GetIncludeEntry()}
	err = t.watch(ctx, user, spec, func(ev *filesystem.FilesystemEvent) error {
		r := &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}
		if ev != nil {
			r.Event = &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}
		}
		if err := send(r); err != nil {
			return err
		}
		select {
		case reset <- struct{}{}:
		default:
		}
		return nil
	})
	if err != nil {
		abortIfGone(err)
		if cerr := ctx.Err(); cerr != nil {
			return rpcError(cerr)
		}
	}
	return rpcError(err)
}

// watch watches spec.path, calling emit with nil once established and
// then with each change, until ctx is done, emit fails or the directory
// goes away.
func (t *target) watch(ctx context.Context, user string, spec watchSpec, emit func(*filesystem.FilesystemEvent) error) error {
	p := wire.PathParams{Path: expandPath(spec.path, t.sb), User: user}
	fi, err := t.agent.Stat(ctx, p)
	if err != nil {
		return err
	}
	root := fi.Path
	return t.agent.Watch(ctx, wire.WatchParams{Path: root, Recursive: spec.recursive, User: user}, func(ev api.Event) error {
		switch {
		case ev.Type == api.EventStart:
			return emit(nil)
		case ev.Type != api.EventFile || ev.File == nil:
			return nil // the kernel dropped events: nothing to tell envd's clients
		}
		fe := &filesystem.FilesystemEvent{Name: relativeTo(root, ev.File.Path), Type: eventType(ev.File.Op)}
		if spec.includeEntry && (ev.File.Op == api.FileCreate || ev.File.Op == api.FileWrite || ev.File.Op == api.FileChmod) {
			if fi, err := t.agent.Stat(ctx, wire.PathParams{Path: ev.File.Path, User: user, XattrPrefix: metadataXattrs, ResolveLinks: true}); err == nil {
				fe.Entry, _ = t.entry(ctx, user, fi)
			}
		}
		return emit(fe)
	})
}

func relativeTo(root, p string) string {
	if root == "/" {
		return strings.TrimPrefix(p, "/")
	}
	if rel, ok := strings.CutPrefix(p, root+"/"); ok {
		return rel
	}
	return p
}

func eventType(op api.FileOp) filesystem.EventType {
	switch op {
	case api.FileCreate:
		return filesystem.EventType_EVENT_TYPE_CREATE
	case api.FileWrite:
		return filesystem.EventType_EVENT_TYPE_WRITE
	case api.FileRemove:
		return filesystem.EventType_EVENT_TYPE_REMOVE
	case api.FileRename:
		return filesystem.EventType_EVENT_TYPE_RENAME
	case api.FileChmod:
		return filesystem.EventType_EVENT_TYPE_CHMOD
	}
	return filesystem.EventType_EVENT_TYPE_UNSPECIFIED
}

// watchers are the polling watchers (CreateWatcher), which outlive the
// request that made them.
type watchers struct {
	mu sync.Mutex
	m  map[string]*pollWatcher
}

// pollWatcher collects one watch's events until they are polled.
type pollWatcher struct {
	sandbox sandbox.ID
	cancel  context.CancelFunc

	mu       sync.Mutex
	events   []*filesystem.FilesystemEvent
	err      error // why the watch ended, once it did
	ended    bool
	lastPoll time.Time
}

func newWatchers() *watchers { return &watchers{m: map[string]*pollWatcher{}} }

// CreateWatcher starts a polling watcher and returns its id once the
// watch is established.
func (s filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	t := targetOf(ctx)
	user, err := rpcUser(req.Header(), t.sb)
	if err != nil {
		return nil, err
	}
	ws := s.h.watchers
	if ws.sweep(t.sb.ID) >= maxWatchers {
		return nil, rpcErrorf(connect.CodeResourceExhausted, "too many watchers: remove some (at most %d per sandbox)", maxWatchers)
	}
	m := req.Msg
	spec := watchSpec{path: m.GetPath(), recursive: m.GetRecursive(), includeEntry: m.GetIncludeEntry()}
	// The watch runs past this request, until removed, idle or the
	// sandbox's agent goes away.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w := &pollWatcher{sandbox: t.sb.ID, cancel: cancel, lastPoll: time.Now()}
	ready := make(chan struct{})
	failed := make(chan error, 1)
	go func() {
		started := false
		err := t.watch(wctx, user, spec, func(ev *filesystem.FilesystemEvent) error {
			if ev == nil {
				started = true
				close(ready)
				return nil
			}
			w.add(ev)
			return nil
		})
		if !started {
			failed <- err
		}
		w.end(err)
	}()
	select {
	case <-ready:
	case err := <-failed:
		cancel()
		return nil, rpcError(err)
	case <-ctx.Done():
		cancel()
		return nil, rpcError(ctx.Err())
	}
	id := newWatcherID()
	ws.mu.Lock()
	ws.m[id] = w
	ws.mu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents drains a watcher's events.
func (s filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	t := targetOf(ctx)
	id := req.Msg.GetWatcherId()
	w, err := s.h.watchers.get(t.sb.ID, id)
	if err != nil {
		return nil, err
	}
	events, ended, werr := w.drain()
	if ended && len(events) == 0 {
		s.h.watchers.remove(t.sb.ID, id)
		switch {
		case werr == nil:
			return nil, rpcErrorf(connect.CodeNotFound, "watcher %s ended: the watched directory is gone", id)
		case sandboxGone(werr): // paused or restored since: the watch died with the agent's session
			return nil, rpcErrorf(connect.CodeNotFound, "watcher %s ended: the sandbox was paused or its agent restarted", id)
		}
		return nil, rpcError(werr)
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: events}), nil
}

// RemoveWatcher stops a watcher.
func (s filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	t := targetOf(ctx)
	if _, err := s.h.watchers.get(t.sb.ID, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	s.h.watchers.remove(t.sb.ID, req.Msg.GetWatcherId())
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

func (ws *watchers) get(sb sandbox.ID, id string) (*pollWatcher, error) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[id]
	if w == nil || w.sandbox != sb {
		return nil, rpcErrorf(connect.CodeNotFound, "watcher with id %s not found", errdefs.Clip(id))
	}
	return w, nil
}

func (ws *watchers) remove(sb sandbox.ID, id string) {
	ws.mu.Lock()
	w := ws.m[id]
	if w != nil && w.sandbox == sb {
		delete(ws.m, id)
	}
	ws.mu.Unlock()
	if w != nil {
		w.cancel()
	}
}

// sweep removes watchers nobody polled for watcherIdle and counts those
// of sandbox sb that remain.
func (ws *watchers) sweep(sb sandbox.ID) int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	n := 0
	for id, w := range ws.m {
		w.mu.Lock()
		idle := time.Since(w.lastPoll) > watcherIdle
		w.mu.Unlock()
		switch {
		case idle:
			delete(ws.m, id)
			w.cancel()
		case w.sandbox == sb:
			n++
		}
	}
	return n
}

func (w *pollWatcher) add(ev *filesystem.FilesystemEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.events) >= maxPending {
		w.events = w.events[1:]
	}
	w.events = append(w.events, ev)
}

func (w *pollWatcher) end(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended, w.err = true, err
}

func (w *pollWatcher) drain() ([]*filesystem.FilesystemEvent, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	events := w.events
	w.events = nil
	w.lastPoll = time.Now()
	if events == nil {
		events = []*filesystem.FilesystemEvent{}
	}
	return events, w.ended, w.err
}

func newWatcherID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
