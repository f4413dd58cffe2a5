package sandbox_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
	"github.com/kiln-sh/kiln/internal/errdefs"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

func TestFiles(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		m := newManager(t, testConfig(t))
		e := create(t, m, sandbox.CreateOptions{Runtime: rt})
		ctx := context.Background()
		a := e.Agent

		big := make([]byte, 9<<20+123)
		rand.Read(big)
		fi, err := a.WriteFile(ctx, wire.WriteParams{Path: "deep/dir/big.bin"}, bytes.NewReader(big))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size != int64(len(big)) || fi.Path != "/home/user/deep/dir/big.bin" {
			t.Errorf("write: %+v", fi)
		}
		var got bytes.Buffer
		if _, err := a.ReadFile(ctx, wire.PathParams{Path: "/home/user/deep/dir/big.bin"}, &got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), big) {
			t.Fatalf("read back %d bytes, differ from the %d written", got.Len(), len(big))
		}
		if r := e.Sh(`python3 -c 'import os,pwd; s=os.stat("deep/dir/big.bin"); print(pwd.getpwuid(s.st_uid).pw_name, s.st_size)'`); r.Stdout != "user 9437307\n" {
			t.Errorf("owner/size inside: %q", r.Stdout)
		}

		if _, err := a.Mkdir(ctx, wire.PathParams{Path: "/tmp/a/b/c"}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.WriteFile(ctx, wire.WriteParams{Path: "/tmp/a/b/c/f.txt"}, strings.NewReader("hi")); err != nil {
			t.Fatal(err)
		}
		list, err := a.List(ctx, wire.ListParams{Path: "/tmp/a", Depth: 3})
		if err != nil {
			t.Fatal(err)
		}
		var paths []string
		for _, f := range list {
			paths = append(paths, f.Path)
		}
		if strings.Join(paths, ",") != "/tmp/a/b,/tmp/a/b/c,/tmp/a/b/c/f.txt" {
			t.Errorf("list depth 3: %v", paths)
		}
		if _, err := a.Move(ctx, wire.MoveParams{From: "/tmp/a/b/c/f.txt", To: "/tmp/z/g.txt"}); err != nil {
			t.Fatal(err)
		}
		if st, err := a.Stat(ctx, wire.PathParams{Path: "/tmp/z/g.txt"}); err != nil || st.Size != 2 || st.Type != api.FileRegular {
			t.Errorf("stat moved file: %+v %v", st, err)
		}
		if err := a.Remove(ctx, wire.PathParams{Path: "/tmp/a"}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Stat(ctx, wire.PathParams{Path: "/tmp/a"}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("stat removed dir: %v, want not found", err)
		}

		// Paths resolve inside the sandbox: escapes land on the sandbox's
		// own files, never the host's.
		marker := "/tmp/kiln-host-marker-" + string(e.SB.ID)
		os.WriteFile(marker, []byte("host secret"), 0o644)
		defer os.Remove(marker)
		for _, p := range []string{marker, "/../../../../" + marker, "../../.." + marker} {
			if _, err := a.Stat(ctx, wire.PathParams{Path: p, User: wire.UserRoot}); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("host file visible as %s: %v", p, err)
			}
		}
		e.Exec(wire.ExecParams{Cmd: "ln -s " + marker + " /tmp/link; ln -s /etc/hostname /tmp/hn"})
		if _, err := a.ReadFile(ctx, wire.PathParams{Path: "/tmp/link"}, &bytes.Buffer{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("symlink to a host path: %v, want not found", err)
		}
		var hn bytes.Buffer
		a.ReadFile(ctx, wire.PathParams{Path: "/tmp/hn"}, &hn)
		if strings.TrimSpace(hn.String()) == "" || strings.Contains(hn.String(), "host secret") {
			t.Errorf("symlink read: %q", hn.String())
		}

		// Permissions apply to the user.
		if _, err := a.WriteFile(ctx, wire.WriteParams{Path: "/root/x"}, strings.NewReader("x")); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("user write into /root: %v, want permission denied", err)
		}
		if _, err := a.WriteFile(ctx, wire.WriteParams{Path: "/root/x", User: wire.UserRoot}, strings.NewReader("x")); err != nil {
			t.Errorf("root write into /root: %v", err)
		}
		for _, p := range []string{"", "a\x00b"} {
			if _, err := a.Stat(ctx, wire.PathParams{Path: p}); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("stat %q: %v, want invalid argument", p, err)
			}
		}
	})
}

func TestWatch(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, rt string) {
		m := newManager(t, testConfig(t))
		e := create(t, m, sandbox.CreateOptions{Runtime: rt})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := e.Agent.Mkdir(ctx, wire.PathParams{Path: "/home/user/w"}); err != nil {
			t.Fatal(err)
		}
		events := make(chan api.FileEvent, 100)
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		go e.Agent.Watch(wctx, wire.WatchParams{Path: "/home/user/w", Recursive: true}, func(ev api.Event) error {
			if ev.File != nil {
				events <- *ev.File
			}
			return nil
		})
		time.Sleep(300 * time.Millisecond) // let the watch start
		e.Sh("cd ~/w && mkdir sub && sleep 0.3 && echo x > sub/f && rm sub/f")
		want := map[string]bool{"create /home/user/w/sub": false, "create /home/user/w/sub/f": false, "remove /home/user/w/sub/f": false}
		deadline := time.After(10 * time.Second)
		for missing := len(want); missing > 0; {
			select {
			case ev := <-events:
				k := string(ev.Op) + " " + ev.Path
				if seen, ok := want[k]; ok && !seen {
					want[k] = true
					missing--
				}
			case <-deadline:
				t.Fatalf("watch events missing: %v", want)
			}
		}
	})
}
