package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/servetest"
)

// desktopSandbox makes a sandbox of the desktop template on a real kiln
// serve (its default runtime, runsc) and brings its desktop up as E2B's
// desktop SDK does (Xvfb on :0 at 1024x768, then startxfce4), unless it
// is up already.
func desktopSandbox(t testing.TB, ctx context.Context, c *client.Client) string {
	t.Helper()
	start := time.Now()
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "desktop", Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("desktop sandbox %s created in %v", sb.ID, time.Since(start).Round(time.Millisecond))
	up := func(cmd string) bool {
		res, err := c.Output(ctx, sb.ID, api.CommandRequest{Cmd: cmd, Timeout: 10})
		return err == nil && res.Exit.Code == 0
	}
	if !up("xdpyinfo -display :0 >/dev/null 2>&1") {
		background(t, ctx, c, sb.ID, "Xvfb", ":0", "-ac", "-screen", "0", "1024x768x24", "-retro", "-dpi", "96", "-nolisten", "tcp", "-nolisten", "unix")
		waitFor(t, "Xvfb", func() bool { return up("xdpyinfo -display :0 >/dev/null 2>&1") })
	}
	if !up("pgrep -x xfdesktop >/dev/null") {
		background(t, ctx, c, sb.ID, "startxfce4")
		waitFor(t, "XFCE", func() bool {
			return up("pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null")
		})
	}
	// The processes run before XFCE has drawn its backdrop and panel.
	waitFor(t, "a drawn desktop", func() bool {
		b, err := c.Screenshot(ctx, sb.ID, "")
		img, derr := png.Decode(bytes.NewReader(b))
		return err == nil && derr == nil && colours(img) >= minColours
	})
	t.Logf("desktop drawn %v after the create began", time.Since(start).Round(time.Millisecond))
	return sb.ID
}

// minColours is how many colours a screen that is not blank has, at the
// least: XFCE's backdrop, panel and icons have hundreds.
const minColours = 16

// colours counts the colours of every 4th pixel of every 4th row.
func colours(img image.Image) int {
	seen := map[[3]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y += 4 {
		for x := r.Min.X; x < r.Max.X; x += 4 {
			r, g, b, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	return len(seen)
}

func background(t testing.TB, ctx context.Context, c *client.Client, id string, args ...string) int {
	t.Helper()
	pid, err := c.Start(ctx, id, api.CommandRequest{Args: args, Timeout: 3600})
	if err != nil {
		t.Fatalf("starting %s: %v", args[0], err)
	}
	return pid
}

func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); !ok(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not up after 90s", what)
		}
	}
}

// checkScreen decodes a screenshot and checks it is a w×h screen that is
// not blank: many colours (XFCE's backdrop, panel and icons).
func checkScreen(t testing.TB, b []byte, w, h int) image.Image {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot of %d bytes: %v", len(b), err)
	}
	if got := img.Bounds().Size(); got.X != w || got.Y != h {
		t.Fatalf("screenshot of %v, want %dx%d", got, w, h)
	}
	n := colours(img)
	if n < minColours {
		t.Errorf("screenshot has %d colours: blank?", n)
	}
	t.Logf("screenshot %dx%d, %d bytes, %d colours (every 4th pixel)", w, h, len(b), n)
	return img
}

// tkApp is a small window whose widgets record what reaches them: an
// entry that saves its text on Return, a button that writes a file, and a
// canvas that logs presses, releases and the wheel. It writes the screen
// coordinates of the widgets' centres to layout.json once it is mapped.
const tkApp = `import json, os, tkinter as tk
d = "/home/user/tk"
root = tk.Tk()
root.title("kiln-test")
root.geometry("420x330+200+150")
entry = tk.Entry(root, width=30)
entry.pack(pady=6)
def save(_):
    open(d + "/typed.txt", "w").write(entry.get())
entry.bind("<Return>", save)
button = tk.Button(root, text="Click me", command=lambda: open(d + "/clicked.txt", "w").write("clicked"))
button.pack(pady=6)
canvas = tk.Canvas(root, width=300, height=180, bg="white")
canvas.pack()
def log(kind):
    def f(e):
        with open(d + "/events.txt", "a") as fh:
            fh.write("%s %d %d\n" % (kind, e.x_root, e.y_root))
    return f
for ev, kind in (("<ButtonPress-1>", "press"), ("<ButtonRelease-1>", "release"), ("<ButtonPress-3>", "right"),
                 ("<Button-4>", "wheelup"), ("<Button-5>", "wheeldown")):
    canvas.bind(ev, log(kind))
def layout():
    root.update_idletasks()
    g = {n: [w.winfo_rootx() + w.winfo_width() // 2, w.winfo_rooty() + w.winfo_height() // 2]
         for n, w in (("entry", entry), ("button", button), ("canvas", canvas))}
    json.dump(g, open(d + "/layout.tmp", "w"))
    os.rename(d + "/layout.tmp", d + "/layout.json")
root.wait_visibility(root)
root.after(700, layout)
root.mainloop()
`

// startTkApp starts tkApp and returns its widgets' centres.
func startTkApp(t testing.TB, ctx context.Context, c *client.Client, id string) map[string][2]int {
	t.Helper()
	if _, err := c.WriteFile(ctx, id, "/home/user/tk/app.py", strings.NewReader(tkApp)); err != nil {
		t.Fatal(err)
	}
	background(t, ctx, c, id, "python3", "/home/user/tk/app.py")
	var layout map[string][2]int
	waitFor(t, "the Tk window", func() bool {
		var b bytes.Buffer
		if _, err := c.ReadFile(ctx, id, "/home/user/tk/layout.json", &b); err != nil {
			return false
		}
		return json.Unmarshal(b.Bytes(), &layout) == nil
	})
	t.Logf("Tk window's widgets at %v", layout)
	return layout
}

func readSandboxFile(ctx context.Context, c *client.Client, id, path string) string {
	var b bytes.Buffer
	if _, err := c.ReadFile(ctx, id, path, &b); err != nil {
		return ""
	}
	return b.String()
}

// TestDesktopNative drives a desktop sandbox through Kiln's own APIs on a
// real kiln serve: GET /v1/sandboxes/{id}/screenshot (a non-blank PNG of
// the screen's size; another key's sandbox 404), kiln sandbox screenshot,
// and the computer tool through MCP (the real kiln mcp over stdio; /mcp,
// whose session switches to a desktop sandbox with create_sandbox) and
// through POST /v1/sandboxes/{id}/tools/computer: a screenshot is an
// image, typing into a focused entry and Return reach the window, a click
// on a button has its effect, a drag and the wheel reach a canvas, and
// bad arguments are clear tool errors; the agent loop of docs/desktop.md
// runs with a stand-in for the model. Round trips are logged.
func TestDesktopNative(t *testing.T) {
	ocitest.RequireRoot(t)
	kiln := buildKiln(t)
	servetest.Builtin(t, kiln, "desktop")
	srv := servetest.Start(t, kiln)
	c := srv.Client
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	id := desktopSandbox(t, ctx, c)

	t.Run("screenshot endpoint", func(t *testing.T) {
		start := time.Now()
		b, err := c.Screenshot(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("first screenshot in %v", time.Since(start).Round(time.Millisecond))
		checkScreen(t, b, 1024, 768)
		if _, err := c.Screenshot(ctx, id, ":7"); !client.IsCode(err, api.CodeFailedPrecondition) || !strings.Contains(err.Error(), "no X server on display :7") {
			t.Errorf("display :7: %v", err)
		}
		other, err := c.CreateKey(ctx, api.CreateKeyRequest{Name: "other"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.New(srv.URL, other.Secret).Screenshot(ctx, id, ""); !client.IsCode(err, api.CodeNotFound) {
			t.Errorf("another key's screenshot: %v", err)
		}
		var times []time.Duration
		for range 10 {
			start := time.Now()
			if _, err := c.Screenshot(ctx, id, ""); err != nil {
				t.Fatal(err)
			}
			times = append(times, time.Since(start))
		}
		slices.Sort(times)
		t.Logf("screenshot round trip over 10: min %v, median %v, max %v", times[0].Round(time.Millisecond),
			times[5].Round(time.Millisecond), times[9].Round(time.Millisecond))
	})

	t.Run("cli", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "screen.png")
		cmd := exec.CommandContext(ctx, kiln, "sandbox", "screenshot", id, "-o", out)
		cmd.Env = append(os.Environ(), "KILN_URL="+srv.URL, "KILN_API_KEY="+srv.Key)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kiln sandbox screenshot: %v\n%s", err, b)
		}
		b, _ := os.ReadFile(out)
		checkScreen(t, b, 1024, 768)
	})

	layout := startTkApp(t, ctx, c, id)

	// Its own desktop sandbox, made and killed by the loop.
	t.Run("docs agent loop", func(t *testing.T) { runDocsLoop(t, ctx, srv.URL, srv.Key) })

	t.Run("mcp", func(t *testing.T) {
		cmd := exec.Command(kiln, "mcp", "--sandbox", id)
		cmd.Env = append(os.Environ(), "KILN_URL="+srv.URL, "KILN_API_KEY="+srv.Key)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
			Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		list, err := cs.ListTools(ctx, nil)
		if err != nil || !slices.ContainsFunc(list.Tools, func(tl *mcp.Tool) bool { return tl.Name == "computer" }) {
			t.Fatalf("tools/list: %v", err)
		}
		call := func(args map[string]any) *mcp.CallToolResult {
			t.Helper()
			start := time.Now()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "computer", Arguments: args})
			if err != nil {
				t.Fatalf("computer %v: %v", args, err)
			}
			t.Logf("computer %v: %v", args["action"], time.Since(start).Round(time.Millisecond))
			return res
		}
		textOf := func(res *mcp.CallToolResult) string {
			if len(res.Content) == 0 {
				return ""
			}
			if tc, ok := res.Content[0].(*mcp.TextContent); ok {
				return tc.Text
			}
			return ""
		}
		ok := func(args map[string]any) string {
			t.Helper()
			res := call(args)
			if res.IsError {
				t.Fatalf("computer %v: %s", args, textOf(res))
			}
			return textOf(res)
		}

		res := call(map[string]any{"action": "screenshot"})
		if res.IsError || len(res.Content) != 2 || !strings.Contains(textOf(res), "display_width_px: 1024, display_height_px: 768") {
			t.Fatalf("screenshot: %+v", res)
		}
		img, isImage := res.Content[1].(*mcp.ImageContent)
		if !isImage || img.MIMEType != "image/png" {
			t.Fatalf("screenshot content %T", res.Content[1])
		}
		checkScreen(t, img.Data, 1024, 768)

		// Click into the entry, type, press Return: the window saves
		// what reached it.
		e := layout["entry"]
		ok(map[string]any{"action": "left_click", "coordinate": []int{e[0], e[1]}})
		ok(map[string]any{"action": "type", "text": "hello from kiln"})
		ok(map[string]any{"action": "key", "text": "Return"})
		waitFor(t, "typed.txt", func() bool { return readSandboxFile(ctx, c, id, "/home/user/tk/typed.txt") == "hello from kiln" })

		b := layout["button"]
		ok(map[string]any{"action": "mouse_move", "coordinate": []int{b[0], b[1]}})
		if got := ok(map[string]any{"action": "cursor_position"}); got != fmt.Sprintf("X=%d,Y=%d", b[0], b[1]) {
			t.Errorf("cursor_position after mouse_move to %v: %q", b, got)
		}
		// At the pointer's own position (a mousemove --sync there would
		// wait forever).
		ok(map[string]any{"action": "left_click", "coordinate": []int{b[0], b[1]}})
		waitFor(t, "clicked.txt", func() bool { return readSandboxFile(ctx, c, id, "/home/user/tk/clicked.txt") == "clicked" })

		cv := layout["canvas"]
		ok(map[string]any{"action": "left_click_drag", "start_coordinate": []int{cv[0] - 60, cv[1]}, "coordinate": []int{cv[0] + 60, cv[1] + 20}})
		ok(map[string]any{"action": "scroll", "coordinate": []int{cv[0], cv[1]}, "scroll_direction": "down", "scroll_amount": 2})
		ok(map[string]any{"action": "right_click", "coordinate": []int{cv[0] + 10, cv[1] + 10}})
		want := fmt.Sprintf("press %d %d\nrelease %d %d\nwheeldown %d %d\nwheeldown %d %d\nright %d %d\n",
			cv[0]-60, cv[1], cv[0]+60, cv[1]+20, cv[0], cv[1], cv[0], cv[1], cv[0]+10, cv[1]+10)
		waitFor(t, "the canvas's events", func() bool {
			return strings.HasSuffix(readSandboxFile(ctx, c, id, "/home/user/tk/events.txt"), want)
		})

		for _, tc := range []struct {
			args map[string]any
			want string
		}{
			{map[string]any{"action": "left_click", "coordinate": []int{1024, 10}}, "off the 1024x768 screen"},
			{map[string]any{"action": "key", "text": "ctrl+$(reboot)"}, `key "$(reboot)"`},
			{map[string]any{"action": "type", "text": strings.Repeat("x", 5000)}, "at most 4096"},
			{map[string]any{"action": "scroll", "scroll_direction": "diagonal"}, "scroll_direction"},
			{map[string]any{"action": "key", "text": "NoSuchKeyZZ"}, "No such key name"},
		} {
			if res := call(tc.args); !res.IsError || !strings.Contains(textOf(res), tc.want) {
				t.Errorf("computer %v: %q, want an error with %q", tc.args["action"], textOf(res), tc.want)
			}
		}
	})

	// /mcp: a session starts on code-interpreter, where the computer
	// tool says what to do; create_sandbox with the desktop template
	// gives it a screen. Closing the session kills that sandbox.
	t.Run("mcp over http", func(t *testing.T) {
		cs, err := connectHTTP(ctx, srv.URL, srv.Key)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		call := func(name string, args map[string]any) *mcp.CallToolResult {
			t.Helper()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
			if err != nil || len(res.Content) == 0 {
				t.Fatalf("%s: %+v, %v", name, res, err)
			}
			return res
		}
		if res := call("computer", map[string]any{"action": "key", "text": "Return"}); !res.IsError ||
			!strings.Contains(res.Content[0].(*mcp.TextContent).Text, `create_sandbox with template "desktop"`) {
			t.Errorf("computer in a code-interpreter sandbox: %+v", res.Content[0])
		}
		if res := call("create_sandbox", map[string]any{"template": "desktop"}); res.IsError {
			t.Fatalf("create_sandbox: %+v", res.Content[0])
		}
		res := call("computer", map[string]any{"action": "screenshot"})
		if img, ok := res.Content[len(res.Content)-1].(*mcp.ImageContent); res.IsError || !ok {
			t.Fatalf("screenshot: %+v", res.Content[0])
		} else {
			checkScreen(t, img.Data, 1024, 768)
		}
	})

	t.Run("v1 tools", func(t *testing.T) {
		post := func(args string) api.ToolResult {
			t.Helper()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/sandboxes/"+id+"/tools/computer", strings.NewReader(args))
			req.Header.Set("Authorization", "Bearer "+srv.Key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var res api.ToolResult
			if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != 200 {
				t.Fatalf("POST tools/computer %s: %d, %v", args, resp.StatusCode, err)
			}
			return res
		}
		res := post(`{"action":"screenshot"}`)
		if res.IsError || len(res.Content) != 2 || res.Content[1].Type != "image" || res.Content[1].MIMEType != "image/png" {
			t.Fatalf("screenshot: %+v", res.Content[0])
		}
		b, err := base64.StdEncoding.DecodeString(res.Content[1].Data)
		if err != nil {
			t.Fatal(err)
		}
		checkScreen(t, b, 1024, 768)

		// The button again, now with the file removed first.
		if err := c.Remove(ctx, id, "/home/user/tk/clicked.txt"); err != nil {
			t.Fatal(err)
		}
		bt := layout["button"]
		if res := post(fmt.Sprintf(`{"action":"mouse_move","coordinate":[%d,%d]}`, bt[0], bt[1])); res.IsError {
			t.Fatalf("mouse_move: %+v", res.Content)
		}
		if res := post(`{"action":"left_click"}`); res.IsError {
			t.Fatalf("left_click: %+v", res.Content)
		}
		waitFor(t, "clicked.txt", func() bool { return readSandboxFile(ctx, c, id, "/home/user/tk/clicked.txt") == "clicked" })
		if res := post(`{"action":"wait","duration":0.2}`); res.IsError || len(res.Content) != 2 {
			t.Errorf("wait: %+v", res.Content)
		}
		if res := post(`{"action":"left_click","coordinate":[5,5],"text":"hyper"}`); !res.IsError || !strings.Contains(res.Content[0].Text, "modifier") {
			t.Errorf("a bad modifier: %+v", res.Content)
		}
		if res := post(`{"action":"hold_key","text":"shift","duration":0.2}`); res.IsError {
			t.Errorf("hold_key: %+v", res.Content)
		}

		// open: xdg-open starts the file's application (Mousepad).
		if _, err := c.WriteFile(ctx, id, "/home/user/kiln-notes.txt", strings.NewReader("opened by the computer tool\n")); err != nil {
			t.Fatal(err)
		}
		if res := post(`{"action":"open","text":"/home/user/kiln-notes.txt"}`); res.IsError || !strings.Contains(res.Content[0].Text, "opening") {
			t.Fatalf("open: %+v", res.Content)
		}
		start := time.Now()
		waitFor(t, "the opened file's window", func() bool {
			res, err := c.Output(ctx, id, api.CommandRequest{Args: []string{"xdotool", "search", "--onlyvisible", "--name", "kiln-notes"}})
			return err == nil && res.Exit.Code == 0
		})
		t.Logf("open: the file's window appeared in %v", time.Since(start).Round(time.Millisecond))
	})
}

// stubAnthropic stands in for the Anthropic SDK, so that the agent loop
// of docs/desktop.md runs offline: a scripted model that checks each
// request's shape (the computer tool with the screen's size, the first
// screenshot as an image, tool results) and asks for a click, a bad key
// and a screenshot before it answers.
const stubAnthropic = `import types

def _block(**kw):
    return types.SimpleNamespace(**kw)

class _Messages:
    step = 0
    def create(self, model, max_tokens, tools, messages, betas):
        assert tools[0]["type"] == "computer_20250124" and tools[0]["display_width_px"] == 1024, tools
        assert betas == ["computer-use-2025-01-24"], betas
        self.step += 1
        last = messages[-1]["content"]
        if self.step == 1:
            assert last[1]["type"] == "image" and last[1]["source"]["media_type"] == "image/png", last
            return _block(content=[_block(type="tool_use", id="toolu_1", input={"action": "left_click", "coordinate": [512, 384]})])
        if self.step == 2:
            assert last[0]["tool_use_id"] == "toolu_1" and not last[0]["is_error"], last
            return _block(content=[_block(type="tool_use", id="toolu_2", input={"action": "key", "text": "NoSuchKeyZZ"}),
                                   _block(type="tool_use", id="toolu_3", input={"action": "screenshot"})])
        assert last[0]["is_error"] and last[1]["content"][1]["type"] == "image", last
        return _block(content=[_block(type="text", text="done: " + last[1]["content"][0]["text"])])

class _Beta:
    messages = _Messages()

class Anthropic:
    def __init__(self):
        self.beta = _Beta()
`

// runDocsLoop runs the Python agent loop of docs/desktop.md against kiln
// serve with stubAnthropic for the model.
func runDocsLoop(t *testing.T, ctx context.Context, url, key string) {
	doc, err := os.ReadFile("../../docs/desktop.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```python\n")
	code, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/desktop.md has no python block")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "loop.py"), []byte(code), 0o644)
	os.WriteFile(filepath.Join(dir, "anthropic.py"), []byte(stubAnthropic), 0o644)
	cmd := exec.CommandContext(ctx, "python3", "loop.py")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "KILN_URL="+url, "KILN_API_KEY="+key, "PYTHONPATH="+dir)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	want := []string{`0 {"action": "left_click", "coordinate": [512, 384]} ok`, `1 {"action": "key", "text": "NoSuchKeyZZ"} error`,
		`1 {"action": "screenshot"} ok`, "done: display_width_px: 1024, display_height_px: 768"}
	if err != nil || strings.Join(want, "\n") != strings.TrimSpace(string(out)) {
		t.Fatalf("the loop of docs/desktop.md: %v\n%s\nwant:\n%s", err, out, strings.Join(want, "\n"))
	}
	t.Logf("the loop of docs/desktop.md ran in %v:\n%s", time.Since(start).Round(time.Millisecond), out)
}

// BenchmarkDesktopScreenshot measures the native screenshot's round trip
// (GET /v1/sandboxes/{id}/screenshot of a 1024x768 XFCE desktop, runsc)
// and a computer tool click through POST /v1/sandboxes/{id}/tools/computer,
// against a command's round trip.
func BenchmarkDesktopScreenshot(b *testing.B) {
	ocitest.RequireRoot(b)
	kiln := servetest.Build(b)
	servetest.Builtin(b, kiln, "desktop")
	srv := servetest.Start(b, kiln)
	ctx := context.Background()
	id := desktopSandbox(b, ctx, srv.Client)
	b.Run("screenshot", func(b *testing.B) {
		var size int
		for b.Loop() {
			png, err := srv.Client.Screenshot(ctx, id, "")
			if err != nil {
				b.Fatal(err)
			}
			size = len(png)
		}
		b.ReportMetric(float64(size), "png-bytes")
	})
	// The floor: one command's round trip through the same API.
	b.Run("command-true", func(b *testing.B) {
		for b.Loop() {
			if _, err := srv.Client.Output(ctx, id, api.CommandRequest{Args: []string{"true"}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("computer-left_click", func(b *testing.B) {
		for b.Loop() {
			res, err := srv.Client.CallTool(ctx, id, "computer", json.RawMessage(`{"action":"left_click","coordinate":[900,700]}`))
			if err != nil || res.IsError {
				b.Fatalf("%+v, %v", res, err)
			}
		}
	})
}
