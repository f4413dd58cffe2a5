package envd_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/filesystem"
	"github.com/kiln-sh/kiln/internal/e2b/envd/spec/process"
)

// sh runs a shell command in the sandbox as user and fails the test unless
// it exits 0.
func (e *env) sh(t *testing.T, user, cmd string) string {
	t.Helper()
	s, err := e.process(user, nil).Start(ctxTimeout(t, time.Minute), connect.NewRequest(&process.StartRequest{Process: bash(cmd), Stdin: ptr(false)}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(s, nil)
	if err != nil || r.end.GetExitCode() != 0 {
		t.Fatalf("%s: %v %+v", cmd, err, r)
	}
	return r.stdout
}

// entryView is the part of an EntryInfo the tests compare.
type entryView struct {
	name, path, perms, owner, group, target string
	typ                                     filesystem.FileType
	size                                    int64
	mode                                    uint32
}

func view(e *filesystem.EntryInfo) entryView {
	return entryView{e.GetName(), e.GetPath(), e.GetPermissions(), e.GetOwner(), e.GetGroup(), e.GetSymlinkTarget(),
		e.GetType(), e.GetSize(), e.GetMode()}
}

func TestFilesystem(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	e.sh(t, "", `cd ~ && mkdir -p tree/sub/deep && printf hello > tree/a.txt && printf 1234567 > tree/sub/b.txt &&
		touch tree/sub/deep/c && ln -s a.txt tree/link && ln -s /nowhere tree/broken && ln -s sub tree/dirlink && chmod 600 tree/a.txt`)
	file := entryView{"a.txt", "/home/user/tree/a.txt", "-rw-------", "user", "user", "", filesystem.FileType_FILE_TYPE_FILE, 5, 0o600}
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			fs := e.filesystem("", c.opts)
			ctx := ctxTimeout(t, time.Minute)
			stats := []struct {
				name string
				path string
				want entryView
			}{
				{"file", "/home/user/tree/a.txt", file},
				{"relative to home", "tree/a.txt", file},
				{"tilde", "~/tree/a.txt", file},
				{"directory", "/home/user/tree/sub", entryView{"sub", "/home/user/tree/sub", "drwxr-xr-x", "user", "user", "",
					filesystem.FileType_FILE_TYPE_DIRECTORY, -1, 0o755}},
				// A symlink: its own name and permissions, its target's type
				// and mode, and the target's absolute path.
				{"symlink", "tree/link", entryView{"link", "/home/user/tree/link", "Lrwxrwxrwx", "user", "user", "/home/user/tree/a.txt",
					filesystem.FileType_FILE_TYPE_FILE, 5, 0o600}},
				{"broken symlink", "tree/broken", entryView{"broken", "/home/user/tree/broken", "Lrwxrwxrwx", "user", "user", "/home/user/tree/broken",
					filesystem.FileType_FILE_TYPE_UNSPECIFIED, 8, 0}},
				{"root's file", "/etc/passwd", entryView{"passwd", "/etc/passwd", "-rw-r--r--", "root", "root", "", filesystem.FileType_FILE_TYPE_FILE, -1, 0o644}},
			}
			for _, tt := range stats {
				t.Run("Stat "+tt.name, func(t *testing.T) {
					res, err := fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: tt.path}))
					if err != nil {
						t.Fatal(err)
					}
					got := view(res.Msg.GetEntry())
					if tt.want.size < 0 { // not known in advance
						got.size = -1
					}
					if got != tt.want {
						t.Errorf("Stat(%s) = %+v\nwant %+v", tt.path, got, tt.want)
					}
					if res.Msg.GetEntry().GetModifiedTime().AsTime().Before(time.Now().Add(-24 * time.Hour)) {
						t.Errorf("modified time %v", res.Msg.GetEntry().GetModifiedTime())
					}
				})
			}

			t.Run("ListDir depths", func(t *testing.T) {
				for _, tt := range []struct {
					depth uint32
					want  []string
				}{
					{0, []string{"a.txt", "broken", "dirlink", "link", "sub"}},
					{1, []string{"a.txt", "broken", "dirlink", "link", "sub"}},
					{2, []string{"a.txt", "broken", "dirlink", "link", "sub", "sub/b.txt", "sub/deep"}},
					{3, []string{"a.txt", "broken", "dirlink", "link", "sub", "sub/b.txt", "sub/deep", "sub/deep/c"}},
				} {
					res, err := fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/home/user/tree", Depth: tt.depth}))
					if err != nil {
						t.Fatal(err)
					}
					var got []string
					for _, en := range res.Msg.GetEntries() {
						got = append(got, strings.TrimPrefix(en.GetPath(), "/home/user/tree/"))
						if en.GetName() == "dirlink" && (en.GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || en.GetSymlinkTarget() != "/home/user/tree/sub") {
							t.Errorf("dirlink = %v", en)
						}
					}
					slices.Sort(got)
					if !slices.Equal(got, tt.want) {
						t.Errorf("depth %d: %v, want %v", tt.depth, got, tt.want)
					}
				}
			})

			t.Run("MakeDir Move Remove", func(t *testing.T) {
				dir := "/home/user/made-" + c.name + "/x/y"
				res, err := fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: dir}))
				if err != nil {
					t.Fatal(err)
				}
				if v := view(res.Msg.GetEntry()); v.path != dir || v.typ != filesystem.FileType_FILE_TYPE_DIRECTORY || v.owner != "user" {
					t.Errorf("MakeDir = %+v", v)
				}
				mv, err := fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: dir, Destination: "/home/user/moved-" + c.name + "/new/y"}))
				if err != nil {
					t.Fatal(err)
				}
				if v := view(mv.Msg.GetEntry()); v.path != "/home/user/moved-"+c.name+"/new/y" || v.name != "y" || v.typ != filesystem.FileType_FILE_TYPE_DIRECTORY {
					t.Errorf("Move = %+v", v)
				}
				for _, p := range []string{"/home/user/moved-" + c.name, "/home/user/moved-" + c.name} { // the second time it is missing
					if _, err := fs.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: p})); err != nil {
						t.Fatalf("Remove(%s): %v", p, err)
					}
				}
				_, err = fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/home/user/moved-" + c.name}))
				wantCode(t, err, connect.CodeNotFound)
			})

			errs := []struct {
				name string
				call func(ctx context.Context) error
				code connect.Code
			}{
				{"Stat missing", func(ctx context.Context) error {
					_, err := fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/nope"}))
					return err
				}, connect.CodeNotFound},
				{"ListDir missing", func(ctx context.Context) error {
					_, err := fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/nope"}))
					return err
				}, connect.CodeNotFound},
				{"ListDir of a file", func(ctx context.Context) error {
					_, err := fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "tree/a.txt"}))
					return err
				}, connect.CodeInvalidArgument},
				{"MakeDir existing directory", func(ctx context.Context) error {
					_, err := fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "tree/sub"}))
					return err
				}, connect.CodeAlreadyExists},
				{"MakeDir over a file", func(ctx context.Context) error {
					_, err := fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "tree/a.txt"}))
					return err
				}, connect.CodeInvalidArgument},
				{"Move missing source", func(ctx context.Context) error {
					_, err := fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: "/nope", Destination: "/tmp/x"}))
					return err
				}, connect.CodeNotFound},
				{"MakeDir where the user may not", func(ctx context.Context) error {
					_, err := fs.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/etc/forbidden"}))
					return err
				}, connect.CodePermissionDenied},
				{"WatchDir missing", func(ctx context.Context) error {
					s, err := fs.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: "/nope"}))
					if err != nil {
						return err
					}
					for s.Receive() {
					}
					return s.Err()
				}, connect.CodeNotFound},
				{"WatchDir of a file", func(ctx context.Context) error {
					s, err := fs.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: "tree/a.txt"}))
					if err != nil {
						return err
					}
					for s.Receive() {
					}
					return s.Err()
				}, connect.CodeInvalidArgument},
				{"unknown watcher", func(ctx context.Context) error {
					_, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: "nope"}))
					return err
				}, connect.CodeNotFound},
			}
			for _, tt := range errs {
				t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.call(ctx), tt.code) })
			}
		})
	}
	t.Run("listing larger than an agent frame", func(t *testing.T) {
		e.sh(t, "", `mkdir -p ~/many && cd ~/many && for i in $(seq 1 2000); do : > "a-file-with-a-long-name-$i.txt"; done`)
		res, err := e.filesystem("", nil).ListDir(ctxTimeout(t, time.Minute), connect.NewRequest(&filesystem.ListDirRequest{Path: "many"}))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(res.Msg.GetEntries()); n != 2000 {
			t.Errorf("%d entries, want 2000", n)
		}
	})
	t.Run("root may", func(t *testing.T) {
		res, err := e.filesystem("root", nil).MakeDir(ctxTimeout(t, time.Minute), connect.NewRequest(&filesystem.MakeDirRequest{Path: "/etc/allowed"}))
		if err != nil {
			t.Fatal(err)
		}
		if v := view(res.Msg.GetEntry()); v.owner != "root" || v.path != "/etc/allowed" {
			t.Errorf("MakeDir as root = %+v", v)
		}
	})
}

// fsEvent is a file event as the tests compare it.
type fsEvent struct {
	name string
	typ  filesystem.EventType
}

func TestWatchDir(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			dir := "/home/user/watched-" + c.name
			e.sh(t, "", "mkdir -p "+dir+"/nested")
			fs := e.filesystem("", c.opts)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			req := connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, Recursive: true, IncludeEntry: true})
			req.Header().Set("Keepalive-Ping-Interval", "1")
			s, err := fs.WatchDir(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if !s.Receive() || s.Msg().GetStart() == nil {
				t.Fatalf("first event is not start: %v %v", s.Msg(), s.Err())
			}
			e.sh(t, "", "cd "+dir+" && printf x > nested/f.txt && chmod 600 nested/f.txt && mv nested/f.txt g.txt && rm g.txt && sleep 1.5 && touch done")
			var got []fsEvent
			keepalives := 0
			for s.Receive() {
				if s.Msg().GetKeepalive() != nil {
					keepalives++
				}
				ev := s.Msg().GetFilesystem()
				if ev == nil {
					continue
				}
				got = append(got, fsEvent{ev.GetName(), ev.GetType()})
				if ev.GetName() == "done" {
					// Created last, it is still there to describe.
					if ev.GetEntry().GetPath() != dir+"/done" || ev.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_FILE {
						t.Errorf("create event's entry = %v", ev.GetEntry())
					}
					break
				}
				if ev.GetType() == filesystem.EventType_EVENT_TYPE_REMOVE && ev.GetEntry() != nil {
					t.Errorf("remove event with an entry: %v", ev)
				}
			}
			cancel()
			want := []fsEvent{
				{"nested/f.txt", filesystem.EventType_EVENT_TYPE_CREATE},
				{"nested/f.txt", filesystem.EventType_EVENT_TYPE_WRITE},
				{"nested/f.txt", filesystem.EventType_EVENT_TYPE_CHMOD},
				{"nested/f.txt", filesystem.EventType_EVENT_TYPE_RENAME},
				{"g.txt", filesystem.EventType_EVENT_TYPE_CREATE},
				{"g.txt", filesystem.EventType_EVENT_TYPE_REMOVE},
				{"done", filesystem.EventType_EVENT_TYPE_CREATE},
			}
			if !slices.Equal(got, want) {
				t.Errorf("events %v\nwant %v", got, want)
			}
			if keepalives == 0 {
				t.Error("no keepalive during a quiet second and a half")
			}
		})
	}
}

// TestWatchUpload: a file written through /files shows up as envd's
// writes do, under its own name (no temporary file): create, then write.
func TestWatchUpload(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	e.sh(t, "", "mkdir -p ~/up")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := e.filesystem("", codecs[0].opts).WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: "up"}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetStart() == nil {
		t.Fatalf("first event is not start: %v", s.Err())
	}
	for i, content := range []string{"first", "second"} {
		res, b := e.do(t, "POST", "/files?path=up/new.txt", map[string]string{"X-Access-Token": e.token, "Content-Type": "application/octet-stream"}, strings.NewReader(content))
		if res.StatusCode != 200 {
			t.Fatalf("upload %d: %d %s", i, res.StatusCode, b)
		}
	}
	var got []fsEvent
	writes := 0
	for writes < 2 && s.Receive() {
		ev := s.Msg().GetFilesystem()
		if ev == nil {
			continue
		}
		got = append(got, fsEvent{ev.GetName(), ev.GetType()})
		if ev.GetName() != "new.txt" {
			t.Fatalf("event for %q: %v", ev.GetName(), got)
		}
		if ev.GetType() == filesystem.EventType_EVENT_TYPE_WRITE {
			writes++
		}
	}
	if len(got) == 0 || got[0] != (fsEvent{"new.txt", filesystem.EventType_EVENT_TYPE_CREATE}) {
		t.Errorf("events %v, want a create first, then writes", got)
	}
}

func TestWatcherPolling(t *testing.T) {
	e := newEnv(t, sandboxOpts())
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			dir := "/home/user/polled-" + c.name
			e.sh(t, "", "mkdir -p "+dir)
			fs := e.filesystem("", c.opts)
			ctx := ctxTimeout(t, time.Minute)
			cw, err := fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir}))
			if err != nil {
				t.Fatal(err)
			}
			id := cw.Msg.GetWatcherId()
			e.sh(t, "", "cd "+dir+" && mkdir a && rmdir a")
			var got []fsEvent
			for len(got) < 2 && ctx.Err() == nil {
				res, err := fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
				if err != nil {
					t.Fatal(err)
				}
				for _, ev := range res.Msg.GetEvents() {
					got = append(got, fsEvent{ev.GetName(), ev.GetType()})
				}
				time.Sleep(50 * time.Millisecond)
			}
			want := []fsEvent{{"a", filesystem.EventType_EVENT_TYPE_CREATE}, {"a", filesystem.EventType_EVENT_TYPE_REMOVE}}
			if !slices.Equal(got, want) {
				t.Errorf("events %v, want %v", got, want)
			}
			if _, err := fs.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: id})); err != nil {
				t.Fatal(err)
			}
			_, err = fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: id}))
			wantCode(t, err, connect.CodeNotFound)
			_, err = fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir + "/missing"}))
			wantCode(t, err, connect.CodeNotFound)
		})
	}
	t.Run("at most 64 per sandbox", func(t *testing.T) {
		fs := e.filesystem("", nil)
		ctx := ctxTimeout(t, time.Minute)
		var ids []string
		for range 64 {
			cw, err := fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/tmp"}))
			if err != nil {
				t.Fatalf("watcher %d: %v", len(ids)+1, err)
			}
			ids = append(ids, cw.Msg.GetWatcherId())
		}
		_, err := fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/tmp"}))
		wantCode(t, err, connect.CodeResourceExhausted)
		if _, err := fs.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: ids[0]})); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/tmp"})); err != nil {
			t.Fatalf("after removing one: %v", err)
		}
	})
}
