package files

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kiln-sh/kiln/api"
)

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// Watch reports changes under the directory path by calling emit with
// events numbered from 1, until ctx is done, emit fails or the directory
// itself is removed or moved. The first event has type start: it says the
// watch is established, so changes made after it are seen. If recursive,
// subdirectories (including ones created later) are watched too.
//
// The user must be able to read the directory; subdirectories are then
// watched with the agent's own permissions. If the kernel's event queue
// overflows, an error event (resource_exhausted) says some were lost and
// watching goes on.
func (s *Service) Watch(ctx context.Context, u User, path string, recursive bool, emit func(api.Event) error) error {
	root, err := Resolve(u, path)
	if err != nil {
		return err
	}
	err = asUser(u, func() error {
		d, err := os.Open(root)
		if err != nil {
			return err
		}
		defer d.Close()
		fi, err := d.Stat()
		if err == nil && !fi.IsDir() {
			return apiErrorf(api.CodeInvalidArgument, "watching %s: not a directory", root)
		}
		return err
	})
	if err != nil {
		return classify("watching", root, err)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return classify("watching", root, err)
	}
	w := &watcher{fd: fd, f: os.NewFile(uintptr(fd), "inotify"), dirs: map[int]string{}, recursive: recursive}
	defer w.f.Close()
	if err := w.add(root); err != nil {
		return classify("watching", root, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = w.f.SetReadDeadline(time.Now()) })
	defer stop()

	seq := uint64(0)
	send := func(ev api.Event) error {
		seq++
		ev.Seq, ev.Time = seq, time.Now()
		return emit(ev)
	}
	if err := send(api.Event{Type: api.EventStart}); err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("reading file events: %w", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(raw.Len)]
			off += unix.SizeofInotifyEvent + int(raw.Len)
			if i := indexNUL(name); i >= 0 {
				name = name[:i]
			}
			evs, done := w.handle(int(raw.Wd), raw.Mask, string(name), root)
			for _, ev := range evs {
				if err := send(ev); err != nil {
					return err
				}
			}
			if done {
				return nil
			}
		}
	}
}

type watcher struct {
	fd        int
	f         *os.File
	dirs      map[int]string // watch descriptor → directory
	recursive bool
}

// add watches dir, and its subdirectories if recursive.
func (w *watcher) add(dir string) error {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return err
	}
	w.dirs[wd] = dir
	if !w.recursive {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil // it vanished or is unreadable; keep what we have
	}
	for _, e := range entries {
		if e.IsDir() {
			_ = w.add(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// handle turns one inotify event into file events; done says the watched
// root is gone.
func (w *watcher) handle(wd int, mask uint32, name, root string) (evs []api.Event, done bool) {
	if mask&unix.IN_Q_OVERFLOW != 0 {
		return []api.Event{{Type: api.EventError, Error: &api.Error{Code: api.CodeResourceExhausted,
			Message: "too many file events at once: some were lost"}}}, false
	}
	dir, ok := w.dirs[wd]
	if !ok {
		return nil, false
	}
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd)
		return nil, dir == root
	}
	path := dir
	if name != "" {
		path = filepath.Join(dir, name)
	}
	if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
		if dir != root {
			return nil, false // the parent's watch reports it
		}
		op := api.FileRemove
		if mask&unix.IN_MOVE_SELF != 0 {
			op = api.FileRename
		}
		return []api.Event{fileEvent(op, path)}, true
	}
	var op api.FileOp
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		op = api.FileCreate
		if w.recursive && mask&unix.IN_ISDIR != 0 {
			if err := w.add(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return []api.Event{fileEvent(op, path), {Type: api.EventError, Error: &api.Error{
					Code: api.CodeResourceExhausted, Message: fmt.Sprintf("watching %s: %v", path, err)}}}, false
			}
		}
	case mask&unix.IN_MODIFY != 0:
		op = api.FileWrite
	case mask&unix.IN_DELETE != 0:
		op = api.FileRemove
	case mask&unix.IN_MOVED_FROM != 0:
		op = api.FileRename
	case mask&unix.IN_ATTRIB != 0:
		op = api.FileChmod
	default:
		return nil, false
	}
	return []api.Event{fileEvent(op, path)}, false
}

func fileEvent(op api.FileOp, path string) api.Event {
	return api.Event{Type: api.EventFile, File: &api.FileEvent{Op: op, Path: path}}
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}
