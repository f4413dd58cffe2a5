package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kiln-sh/kiln/api"
)

// TestEndToEnd walks one sandbox through create, commands, files and
// kill over real HTTP.
func TestEndToEnd(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{Metadata: map[string]string{"suite": "e2e"}})
	if sb.State != "running" || sb.ID == "" {
		t.Fatalf("created %+v", sb)
	}
	base := "/v1/sandboxes/" + sb.ID

	t.Run("get and list", func(t *testing.T) {
		h := h.with(t)
		var got api.Sandbox
		h.do("GET", base, h.a, nil, 200, &got)
		if got.ID != sb.ID || got.Metadata["suite"] != "e2e" {
			t.Errorf("got %+v", got)
		}
		var list api.SandboxList
		h.do("GET", "/v1/sandboxes?state=running&metadata.suite=e2e", h.a, nil, 200, &list)
		if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
			t.Errorf("list %+v", list)
		}
		var u api.Usage
		h.do("GET", base+"/usage", h.a, nil, 200, &u)
		if u.MemoryLimit != sb.Limits.MemoryBytes {
			t.Errorf("usage %+v", u)
		}
	})

	t.Run("streamed command", func(t *testing.T) {
		h := h.with(t)
		// Output must arrive as it is made, not when the command ends.
		body := `{"cmd":"echo a; sleep 1; echo b >&2; exit 3"}`
		resp := h.request("POST", base+"/commands", h.a, strings.NewReader(body))
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var firstOut, exitAt time.Time
		var stdout, stderr string
		var exit *api.ExitStatus
		readEvents(t, resp.Body, func(ev api.Event) bool {
			switch ev.Type {
			case api.EventStdout:
				if firstOut.IsZero() {
					firstOut = time.Now()
				}
				stdout += string(ev.Data)
			case api.EventStderr:
				stderr += string(ev.Data)
			case api.EventExit:
				exitAt, exit = time.Now(), ev.Exit
			}
			return true
		})
		if stdout != "a\n" || stderr != "b\n" || exit == nil || exit.Code != 3 {
			t.Fatalf("stdout %q stderr %q exit %+v", stdout, stderr, exit)
		}
		if gap := exitAt.Sub(firstOut); gap < 700*time.Millisecond {
			t.Errorf("first output arrived only %v before the exit: not streamed", gap)
		}
	})

	t.Run("aggregated command", func(t *testing.T) {
		h := h.with(t)
		resp := h.request("POST", base+"/commands", h.a, strings.NewReader(`{"args":["sh","-c","echo hi; echo err >&2"],"user":"root"}`), "Accept", "application/json")
		defer resp.Body.Close()
		var res api.CommandResult
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		if res.Stdout != "hi\n" || res.Stderr != "err\n" || res.Exit.Code != 0 || res.PID <= 0 {
			t.Errorf("result %+v", res)
		}
	})

	t.Run("command timeout and background", func(t *testing.T) {
		h := h.with(t)
		var res api.CommandResult
		resp := h.request("POST", base+"/commands", h.a, strings.NewReader(`{"cmd":"sleep 30","timeout":0.5}`), "Accept", "application/json")
		json.NewDecoder(resp.Body).Decode(&res)
		resp.Body.Close()
		if res.Exit.Reason != api.ExitTimeout {
			t.Errorf("exit %+v, want timeout", res.Exit)
		}
		var started api.CommandStarted
		h.do("POST", base+"/commands", h.a, api.CommandRequest{Cmd: "cat", Stdin: true, Background: true}, 202, &started)
		pid := "/commands/" + itoa(started.PID)
		resp = h.request("POST", base+pid+"/stdin?close=true", h.a, strings.NewReader("via stdin"))
		if resp.StatusCode != 204 {
			t.Fatalf("stdin: %d", resp.StatusCode)
		}
		resp.Body.Close()
		out := attachAll(t, h, base+pid+"/events", h.a)
		if !strings.Contains(out, "via stdin") {
			t.Errorf("cat echoed %q", out)
		}
		var ps []api.ProcessInfo
		h.do("GET", base+"/commands", h.a, nil, 200, &ps)
		if len(ps) == 0 {
			t.Errorf("no processes listed")
		}
		h.do("POST", base+"/commands", h.a, api.CommandRequest{Cmd: "sleep 30", Background: true}, 202, &started)
		h.do("POST", base+"/commands/"+itoa(started.PID)+"/signal", h.a, api.SignalRequest{Signal: "term"}, 204, nil)
	})

	t.Run("files", func(t *testing.T) {
		h := h.with(t)
		testFiles(t, h, base)
	})

	t.Run("kill", func(t *testing.T) {
		h := h.with(t)
		h.do("DELETE", base, h.a, nil, 204, nil)
		var got api.Sandbox
		h.do("GET", base, h.a, nil, 200, &got)
		if got.State != "stopped" || got.Reason == "" {
			t.Errorf("after kill: %+v", got)
		}
		h.do("DELETE", base, h.a, nil, 204, nil) // idempotent
		e := apiErr(t, h.request("POST", base+"/commands", h.a, strings.NewReader(`{"cmd":"true"}`)))
		if e.Code != api.CodeFailedPrecondition {
			t.Errorf("command on a stopped sandbox: %+v", e)
		}
	})
}

func testFiles(t *testing.T, h *harness, base string) {
	// Raw upload and download.
	resp := h.request("PUT", base+"/files?path=/tmp/raw.txt&mode=0600", h.a, strings.NewReader("raw contents"))
	var fi api.FileInfo
	json.NewDecoder(resp.Body).Decode(&fi)
	resp.Body.Close()
	if resp.StatusCode != 200 || fi.Size != 12 || fi.Mode != 0o600 {
		t.Fatalf("put: %d %+v", resp.StatusCode, fi)
	}
	if got := download(t, h, base, "/tmp/raw.txt"); got != "raw contents" {
		t.Errorf("downloaded %q", got)
	}

	// Multipart: several files, their names relative to dir.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for name, data := range map[string]string{"one.txt": "1", "sub/two.txt": "22"} {
		w, _ := mw.CreateFormFile("file", name)
		io.WriteString(w, data)
	}
	mw.WriteField("note", "ignored")
	mw.Close()
	resp = h.request("POST", base+"/files?dir=/tmp/up", h.a, &buf, "Content-Type", mw.FormDataContentType())
	var infos []api.FileInfo
	json.NewDecoder(resp.Body).Decode(&infos)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(infos) != 2 {
		t.Fatalf("multipart: %d %+v", resp.StatusCode, infos)
	}
	if got := download(t, h, base, "/tmp/up/sub/two.txt"); got != "22" {
		t.Errorf("multipart file: %q", got)
	}

	var list []api.FileInfo
	h.do("GET", base+"/files/list?path=/tmp/up&depth=2", h.a, nil, 200, &list)
	if len(list) != 3 { // one.txt, sub, sub/two.txt
		t.Errorf("list: %+v", list)
	}
	h.do("GET", base+"/files/stat?path=/tmp/up/one.txt", h.a, nil, 200, &fi)
	if fi.Type != api.FileRegular || fi.Size != 1 || fi.Owner != "user" {
		t.Errorf("stat: %+v", fi)
	}
	h.do("POST", base+"/files/mkdir", h.a, api.PathRequest{Path: "/tmp/made/deep"}, 200, &fi)
	if fi.Type != api.FileDir {
		t.Errorf("mkdir: %+v", fi)
	}
	h.do("POST", base+"/files/move", h.a, api.MoveRequest{From: "/tmp/up/one.txt", To: "/tmp/made/1.txt"}, 200, &fi)
	if fi.Path != "/tmp/made/1.txt" {
		t.Errorf("move: %+v", fi)
	}
	h.do("DELETE", base+"/files?path=/tmp/made", h.a, nil, 204, nil)
	if e := apiErr(t, h.request("GET", base+"/files/stat?path=/tmp/made", h.a, nil)); e.Code != api.CodeNotFound {
		t.Errorf("stat after remove: %+v", e)
	}
	if e := apiErr(t, h.request("GET", base+"/files?path=/nonexistent", h.a, nil)); e.Code != api.CodeNotFound {
		t.Errorf("download of a missing file: %+v", e)
	}

	// Paths that look like escapes stay inside the sandbox.
	// (relative paths start at the user's home, /home/user).
	if _, err := os.Stat("/tmp/raw.txt"); err == nil {
		t.Fatal("the host has a /tmp/raw.txt: cannot tell it from the sandbox's")
	}
	if got := download(t, h, base, "../../../../../tmp/raw.txt"); got != "raw contents" {
		t.Errorf("../../tmp/raw.txt read %q, want the sandbox's file", got)
	}
	resp = h.request("PUT", base+"/files?path=../../../../etc/passwd", h.a, strings.NewReader("x"))
	if resp.StatusCode < 400 || resp.StatusCode >= 500 {
		t.Errorf("user overwriting /etc/passwd: status %d", resp.StatusCode)
	}
	resp.Body.Close()

	testWatch(t, h, base)
}

func testWatch(t *testing.T, h *harness, base string) {
	h.do("POST", base+"/files/mkdir", h.a, api.PathRequest{Path: "/tmp/watched"}, 200, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h.ts.URL+base+"/files/watch?path=/tmp/watched&recursive=true", nil)
	req.Header.Set("X-API-Key", h.a)
	resp, err := h.ts.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("watch: %v %v", err, resp)
	}
	defer resp.Body.Close()
	seen := false
	readEvents(t, resp.Body, func(ev api.Event) bool {
		switch ev.Type {
		case api.EventStart:
			h.do("PUT", base+"/files?path=/tmp/watched/new.txt", h.a, nil, 200, nil)
		case api.EventFile:
			if strings.HasSuffix(ev.File.Path, "new.txt") {
				seen = true
				return false
			}
		}
		return true
	})
	if !seen {
		t.Error("watch reported no event for new.txt")
	}
}

func download(t *testing.T, h *harness, base, path string) string {
	t.Helper()
	resp := h.request("GET", base+"/files?path="+url.QueryEscape(path), h.a, nil)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("download %s: %d %s", path, resp.StatusCode, b)
	}
	return string(b)
}

// attachAll re-attaches to a command and returns its stdout until exit.
func attachAll(t *testing.T, h *harness, path, key string) string {
	t.Helper()
	resp := h.request("GET", path, key, nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("attach: %d", resp.StatusCode)
	}
	var out string
	readEvents(t, resp.Body, func(ev api.Event) bool {
		if ev.Type == api.EventStdout {
			out += string(ev.Data)
		}
		return ev.Type != api.EventExit
	})
	return out
}

// TestReattach drops a stream mid-command and picks it up with after_seq.
func TestReattach(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	base := "/v1/sandboxes/" + sb.ID
	resp := h.request("POST", base+"/commands", h.a, strings.NewReader(`{"cmd":"for i in 1 2 3 4 5; do echo $i; sleep 0.3; done"}`))
	var pid int
	var seq uint64
	readEvents(t, resp.Body, func(ev api.Event) bool {
		if ev.Type == api.EventStart {
			pid = ev.PID
		}
		seq = ev.Seq
		return ev.Type != api.EventStdout // stop after the first line
	})
	resp.Body.Close() // the client goes away; the command runs on
	if pid == 0 {
		t.Fatal("no start event")
	}
	time.Sleep(200 * time.Millisecond)
	got := attachAll(t, h, base+"/commands/"+itoa(pid)+"/events?after_seq="+itoa(int(seq)), h.a)
	if got != "2\n3\n4\n5\n" {
		t.Errorf("after re-attaching at seq %d: %q, want the rest", seq, got)
	}
}

// TestWebSocket follows a command over a WebSocket.
func TestWebSocket(t *testing.T) {
	h := newHarness(t, true, harnessOpts{ping: 200 * time.Millisecond})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	base := "/v1/sandboxes/" + sb.ID
	var started api.CommandStarted
	h.do("POST", base+"/commands", h.a, api.CommandRequest{Cmd: "echo one; sleep 0.6; echo two", Background: true}, 202, &started)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(h.ts.URL, "http") + base + "/commands/" + itoa(started.PID) + "/events"
	c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"X-API-Key": {h.a}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	var out string
	pings := 0
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("reading after %q: %v", out, err)
		}
		var ev api.Event
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case api.EventStdout:
			out += string(ev.Data)
		case api.EventPing:
			pings++
		}
		if ev.Type == api.EventExit {
			break
		}
	}
	if out != "one\ntwo\n" || pings == 0 {
		t.Errorf("websocket: output %q, %d pings", out, pings)
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Errorf("after exit: %v, want a normal close", err)
	}
}

// TestTenants checks that keys see only their own sandboxes, quotas and
// revocation.
func TestTenants(t *testing.T) {
	h := newHarness(t, true, harnessOpts{quotaA: 1})
	sb := h.create(h.a, api.CreateSandboxRequest{})
	base := "/v1/sandboxes/" + sb.ID

	for _, r := range []struct{ method, path, body string }{
		{"GET", base, ""}, {"DELETE", base, ""}, {"GET", base + "/usage", ""},
		{"POST", base + "/commands", `{"cmd":"true"}`}, {"GET", base + "/files?path=/etc/hostname", ""},
		{"POST", base + "/timeout", `{"timeout":60}`},
	} {
		e := apiErr(t, h.request(r.method, r.path, h.b, strings.NewReader(r.body)))
		if e.Code != api.CodeNotFound {
			t.Errorf("key B: %s %s: %+v, want not_found", r.method, r.path, e)
		}
	}
	var list api.SandboxList
	h.do("GET", "/v1/sandboxes", h.b, nil, 200, &list)
	if len(list.Sandboxes) != 0 {
		t.Errorf("key B lists %+v", list.Sandboxes)
	}

	// Key A's quota is one sandbox.
	e := apiErr(t, h.request("POST", "/v1/sandboxes", h.a, strings.NewReader(`{"runtime":"`+testRuntime()+`"}`)))
	if e.Code != api.CodeResourceExhausted || !strings.Contains(e.Message, "quota") {
		t.Errorf("over quota: %+v", e)
	}

	// Revoking a key locks it out within the cache's TTL.
	var keys []api.APIKey
	h.do("GET", "/v1/keys", h.admin, nil, 200, &keys)
	var idA string
	for _, k := range keys {
		if k.Name == "a" {
			idA = k.ID
		}
		if k.Secret != "" {
			t.Errorf("listed key with its secret")
		}
	}
	h.do("DELETE", "/v1/keys/"+idA, h.admin, nil, 204, nil)
	time.Sleep(1100 * time.Millisecond)
	if e := apiErr(t, h.request("GET", base, h.a, nil)); e.Code != api.CodeUnauthenticated {
		t.Errorf("revoked key: %+v", e)
	}
}

// TestExpiry lets the reaper stop a sandbox whose timeout passed.
func TestExpiry(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	sb := h.create(h.a, api.CreateSandboxRequest{Timeout: 1})
	deadline := time.Now().Add(15 * time.Second)
	for {
		var got api.Sandbox
		h.do("GET", "/v1/sandboxes/"+sb.ID, h.a, nil, 200, &got)
		if got.State == "stopped" {
			if !strings.Contains(got.Reason, "timeout") {
				t.Errorf("expired with reason %q", got.Reason)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s after its timeout", got.State)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
