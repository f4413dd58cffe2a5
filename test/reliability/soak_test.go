package reliability

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
	"github.com/kiln-sh/kiln/internal/server"
	"github.com/kiln-sh/kiln/internal/store/sqlite"
)

var soak = flag.Duration("soak", 30*time.Second, "how long TestSoak runs (make soak: 10m under -race)")

// TestSoak drives a real API server (in-process, on loopback) with
// concurrent clients on both runtimes for -soak: each creates sandboxes,
// uploads files, checks them from inside with a command, and kills some.
// Nothing acknowledged may be lost (every sandbox created and not killed
// is running, every file uploaded reads back the same), no sandbox may
// leak, and every failure must come as an API error with a code and a
// message.
func TestSoak(t *testing.T) {
	d := *soak
	if testing.Short() {
		d = min(d, 10*time.Second)
	}
	cfg := sandboxtest.Config(t, agentPath)
	m := sandboxtest.NewManager(t, cfg)
	st := cfg.Store.(*sqlite.Store)
	k, secret := apikey.New("soak", false)
	k.MaxSandboxes = 64
	if err := st.CreateKey(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Options{Manager: m, Keys: st, Config: cfg.Config,
		Log: slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	c := client.New(ts.URL, secret)

	type file struct{ id, path, sum string }
	var (
		mu       sync.Mutex
		created  = map[string]bool{} // acknowledged creates; false once killed
		files    []file              // acknowledged uploads
		failures = map[string]int{}  // by code and message prefix
		ops      int
	)
	fail := func(what string, err error) {
		var ae *api.Error
		mu.Lock()
		defer mu.Unlock()
		if !errors.As(err, &ae) || ae.Code == "" || ae.Message == "" {
			t.Errorf("%s failed without an API error: %v", what, err)
			return
		}
		failures[fmt.Sprintf("%s: %s", what, ae.Code)]++
	}
	ctx := context.Background()
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rt := []string{"runc", "runsc"}[w%2]
			var mine []string
			for i := 0; time.Now().Before(deadline); i++ {
				if len(mine) < 3 {
					sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: rt, Timeout: 3600})
					if err != nil {
						fail("create", err)
						continue
					}
					mu.Lock()
					created[sb.ID] = true
					mu.Unlock()
					mine = append(mine, sb.ID)
				}
				id := mine[i%len(mine)]
				data := make([]byte, 1+i%5*50_000)
				rand.Read(data)
				sum := sha256.Sum256(data)
				path := fmt.Sprintf("f%d.bin", i)
				if _, err := c.WriteFile(ctx, id, path, bytes.NewReader(data)); err != nil {
					fail("upload", err)
				} else {
					mu.Lock()
					files = append(files, file{id, path, hex.EncodeToString(sum[:])})
					mu.Unlock()
				}
				r, err := c.Output(ctx, id, api.CommandRequest{Cmd: "sha256sum " + path})
				switch {
				case err != nil:
					fail("command", err)
				case !strings.HasPrefix(r.Stdout, hex.EncodeToString(sum[:])):
					t.Errorf("sandbox %s: %s inside is %q, uploaded %x", id, path, r.Stdout, sum)
				}
				mu.Lock()
				ops += 2
				mu.Unlock()
				if i%7 == 6 { // kill the oldest
					if err := c.KillSandbox(ctx, mine[0]); err != nil {
						fail("kill", err)
						continue
					}
					mu.Lock()
					created[mine[0]] = false
					mu.Unlock()
					mine = mine[1:]
				}
			}
		})
	}
	wg.Wait()

	var ids []string
	for id, live := range created {
		ids = append(ids, id)
		if !live {
			continue
		}
		sb, err := c.GetSandbox(ctx, id)
		if err != nil || sb.State != "running" {
			t.Errorf("acknowledged sandbox %s: %+v, %v", id, sb, err)
		}
	}
	lost := 0
	for _, f := range files {
		if !created[f.id] {
			continue
		}
		var got bytes.Buffer
		if _, err := c.ReadFile(ctx, f.id, f.path, &got); err != nil {
			t.Errorf("acknowledged upload %s in %s: %v", f.path, f.id, err)
			lost++
			continue
		}
		if sum := sha256.Sum256(got.Bytes()); hex.EncodeToString(sum[:]) != f.sum {
			t.Errorf("acknowledged upload %s in %s changed", f.path, f.id)
			lost++
		}
	}
	for id, live := range created {
		if live {
			if err := c.KillSandbox(ctx, id); err != nil {
				t.Errorf("killing %s: %v", id, err)
			}
		}
	}
	assertGoneIDs(t, cfg, ids)
	if l := m.Live(); len(l) != 0 {
		t.Errorf("%d sandboxes still live", len(l))
	}
	t.Logf("soak %s: %d sandboxes, %d uploads and commands, %d acknowledged uploads lost, failures by kind: %v",
		d, len(created), ops, lost, failures)
}

type testLog struct{ t *testing.T }

func (w testLog) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
