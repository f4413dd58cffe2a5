package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/servetest"
)

// TestLLMTools drives Kiln's tools for models against a real kiln serve.
// MCP with the Go SDK's MCP client, over stdio (the real `kiln mcp`
// binary) and over streamable HTTP (/mcp): the tools are listed, Python
// runs twice with its state kept, a chart arrives as image content, an
// exception and a failing command arrive as tool errors, files go in and
// out, and the session's sandbox is killed when the session ends. Then the
// function-calling example (examples/strawberry) runs its loop.
func TestLLMTools(t *testing.T) {
	requireTemplate(t, "code-interpreter")
	kiln := buildKiln(t)
	dataDir := servetest.DataDir(t)
	addr := servetest.FreeAddr(t)
	srv := startServe(t, kiln, dataDir, addr)
	defer func() { srv.Stop(t) }()
	key := srv.AdminKey(t)
	url := "http://" + addr
	c := client.New(url, key)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("stdio", func(t *testing.T) {
		cmd := exec.Command(kiln, "mcp")
		cmd.Env = append(os.Environ(), "KILN_URL="+url, "KILN_API_KEY="+key)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
			Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		exerciseMCP(t, ctx, cs, c)
		if t.Failed() {
			t.Logf("kiln mcp stderr:\n%s", stderr.String())
		}
	})

	// --sandbox: the session uses a given sandbox and leaves it running.
	t.Run("stdio --sandbox", func(t *testing.T) {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "base", Timeout: 120})
		if err != nil {
			t.Fatal(err)
		}
		defer c.KillSandbox(ctx, sb.ID)
		cmd := exec.Command(kiln, "mcp", "--url", url, "--api-key", key, "--sandbox", sb.ID)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
			Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "hostname"}})
		if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, sb.ID) {
			t.Fatalf("hostname: %+v, %v", res, err)
		}
		cs.Close()
		if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "running" {
			t.Errorf("the given sandbox after the session: %+v, %v", got, err)
		}
	})

	t.Run("http", func(t *testing.T) {
		// No key: the route's auth answers before MCP does, and the SDK
		// client cannot connect.
		resp, err := http.Post(url+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST /mcp without a key: %d, want 401", resp.StatusCode)
		}
		if cs, err := connectHTTP(ctx, url, ""); err == nil {
			cs.Close()
			t.Error("an MCP client without a key connected")
		}

		cs, err := connectHTTP(ctx, url, key)
		if err != nil {
			t.Fatal(err)
		}
		// Another key cannot use the session.
		other, err := c.CreateKey(ctx, api.CreateKeyRequest{Name: "other"})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
		req.Header.Set("Authorization", "Bearer "+other.Secret)
		req.Header.Set("Mcp-Session-Id", cs.ID())
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("another key's request on the session: %d, want 403", resp.StatusCode)
		}
		exerciseMCP(t, ctx, cs, c)
	})

	t.Run("strawberry example", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "strawberry")
		if out, err := exec.Command("go", "build", "-o", bin, "../../examples/strawberry").CombinedOutput(); err != nil {
			t.Fatalf("building the example: %v\n%s", err, out)
		}
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), "KILN_URL="+url, "KILN_API_KEY="+key)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "answer: The letter r appears 3 times in \"strawberry\".") {
			t.Fatalf("example: %v\n%s", err, out)
		}
		t.Logf("the example's loop:\n%s", out)

		// The same loop with the example's Chat Completions client,
		// against a stand-in for OpenAI's API on loopback that checks the
		// requests' shape.
		var mu sync.Mutex
		var problems []string
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			var req struct {
				Model    string           `json:"model"`
				Messages []map[string]any `json:"messages"`
				Tools    []struct {
					Type     string         `json:"type"`
					Function map[string]any `json:"function"`
				} `json:"tools"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || r.URL.Path != "/v1/chat/completions" ||
				r.Header.Get("Authorization") != "Bearer sk-test" || req.Model != "gpt-test" ||
				len(req.Tools) != 1 || req.Tools[0].Type != "function" || req.Tools[0].Function["name"] != "execute_python" {
				problems = append(problems, fmt.Sprintf("request %s %+v: %v", r.URL.Path, req, err))
				http.Error(w, "bad request", 400)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			switch last := req.Messages[len(req.Messages)-1]; last["role"] {
			case "user":
				io.WriteString(w, `{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,`+
					`"tool_calls":[{"id":"call_9","type":"function","function":{"name":"execute_python","arguments":"{\"code\":\"'strawberry'.count('r')\"}"}}]}}]}`)
			case "tool":
				if last["tool_call_id"] != "call_9" {
					problems = append(problems, fmt.Sprintf("tool message %v", last))
				}
				json.NewEncoder(w).Encode(map[string]any{"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
					"message": map[string]any{"role": "assistant", "content": fmt.Sprintf("There are %v r's.", last["content"])}}}})
			}
		}))
		defer api.Close()
		cmd = exec.CommandContext(ctx, bin, "-model", "gpt-test")
		cmd.Env = append(os.Environ(), "KILN_URL="+url, "KILN_API_KEY="+key, "OPENAI_BASE_URL="+api.URL+"/v1", "OPENAI_API_KEY=sk-test")
		out, err = cmd.CombinedOutput()
		mu.Lock()
		defer mu.Unlock()
		if err != nil || len(problems) > 0 || !strings.Contains(string(out), "answer: There are 3 r's.") {
			t.Fatalf("example with a Chat Completions server: %v, %q\n%s", err, problems, out)
		}
	})

	// Sessions cannot outlive the server: a shutdown kills their
	// sandboxes (and does not wait out the grace period for their
	// streams).
	t.Run("shutdown", func(t *testing.T) {
		cs, err := connectHTTP(ctx, url, key)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		id := sessionSandbox(t, ctx, cs, c)
		start := time.Now()
		srv.Stop(t)
		t.Logf("kiln serve stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
		srv = startServe(t, kiln, dataDir, addr)
		waitKilled(t, ctx, c, id)
	})
}

// connectHTTP opens an MCP session on /mcp, sending key (if any) as a
// Bearer token.
func connectHTTP(ctx context.Context, url, key string) (*mcp.ClientSession, error) {
	hc := &http.Client{Transport: bearer{key}}
	return mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
}

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.key != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// exerciseMCP runs the tools through cs, then closes it and checks that
// the session's sandbox is killed.
func exerciseMCP(t *testing.T, ctx context.Context, cs *mcp.ClientSession, c *client.Client) {
	t.Helper()
	defer cs.Close()
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range lt.Tools {
		names = append(names, tl.Name)
	}
	for _, want := range []string{"execute_python", "run_code", "run_command", "read_file", "write_file", "list_files", "create_sandbox", "kill_sandbox"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list lacks %s: %v", want, names)
		}
	}

	call := func(name string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return res
	}
	textOf := func(res *mcp.CallToolResult) string {
		var b strings.Builder
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				b.WriteString(tc.Text)
			}
		}
		return b.String()
	}

	// Python twice: the second call sees the first one's variable.
	if res := call("execute_python", map[string]any{"code": "x = 41\nprint('set')"}); res.IsError || textOf(res) != "set\n" {
		t.Errorf("first run: error %v, %q", res.IsError, textOf(res))
	}
	if res := call("run_code", map[string]any{"code": "x + 1", "language": "python"}); res.IsError || textOf(res) != "42" {
		t.Errorf("second run: error %v, %q", res.IsError, textOf(res))
	}

	// With a progress token the output streams (as progress
	// notifications) and the result is the same.
	params := &mcp.CallToolParams{Name: "execute_python", Arguments: map[string]any{"code": "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.2)\nx * 2"}}
	params.SetProgressToken("t1")
	if res, err := cs.CallTool(ctx, params); err != nil || res.IsError || textOf(res) != "0\n1\n2\n82" {
		t.Errorf("streamed run: %v, %+v", err, res)
	}

	// A chart is image content.
	res := call("execute_python", map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('kiln')"})
	var png []byte
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok && ic.MIMEType == "image/png" {
			png = ic.Data
		}
	}
	if res.IsError || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("chart: error %v, %d content items, png %d bytes, text %q", res.IsError, len(res.Content), len(png), textOf(res))
	}

	// An exception is a tool error with its traceback; the kernel lives on.
	res = call("execute_python", map[string]any{"code": "def f():\n    return 1 / 0\nf()"})
	if tx := textOf(res); !res.IsError || !strings.Contains(tx, "ZeroDivisionError") || !strings.Contains(tx, "f()") {
		t.Errorf("exception: error %v, %q", res.IsError, tx)
	}
	res = call("run_command", map[string]any{"command": "echo out; echo err >&2; exit 3"})
	if tx := textOf(res); !res.IsError || !strings.Contains(tx, "exit code 3") || !strings.Contains(tx, "out") || !strings.Contains(tx, "err") {
		t.Errorf("failing command: error %v, %q", res.IsError, tx)
	}
	res = call("execute_python", map[string]any{"cod": "1"})
	if tx := textOf(res); !res.IsError || !strings.Contains(tx, "cod") {
		t.Errorf("bad arguments: error %v, %q", res.IsError, tx)
	}

	// Files: written by one tool, seen by the others.
	if res := call("write_file", map[string]any{"path": "notes/a.txt", "content": "hello from mcp"}); res.IsError {
		t.Errorf("write_file: %q", textOf(res))
	}
	if res := call("read_file", map[string]any{"path": "notes/a.txt"}); res.IsError || textOf(res) != "hello from mcp" {
		t.Errorf("read_file: error %v, %q", res.IsError, textOf(res))
	}
	if res := call("list_files", map[string]any{"path": "notes"}); res.IsError || !strings.Contains(textOf(res), "/home/user/notes/a.txt") {
		t.Errorf("list_files: error %v, %q", res.IsError, textOf(res))
	}
	if res := call("read_file", map[string]any{"path": "nope.txt"}); !res.IsError || !strings.Contains(textOf(res), "not_found") {
		t.Errorf("missing file: error %v, %q", res.IsError, textOf(res))
	}
	if res := call("execute_python", map[string]any{"code": "open('notes/a.txt').read()"}); !strings.Contains(textOf(res), "hello from mcp") {
		t.Errorf("python reading the file: %q", textOf(res))
	}

	// Ending the session kills its sandbox.
	id := sessionSandbox(t, ctx, cs, c)
	if err := cs.Close(); err != nil {
		t.Errorf("closing the session: %v", err)
	}
	waitKilled(t, ctx, c, id)
}

// sessionSandbox returns the id of the session's sandbox (its hostname).
func sessionSandbox(t *testing.T, ctx context.Context, cs *mcp.ClientSession, c *client.Client) string {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{"command": "hostname"}})
	if err != nil || res.IsError || len(res.Content) == 0 {
		t.Fatalf("hostname: %+v, %v", res, err)
	}
	id := strings.TrimSpace(strings.TrimPrefix(res.Content[0].(*mcp.TextContent).Text, "exit code 0\nstdout:\n"))
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || sb.State != "running" || sb.Metadata["created_by"] != "kiln-mcp" {
		t.Fatalf("session sandbox %q: %+v, %v", id, sb, err)
	}
	return id
}

// waitKilled waits until sandbox id is gone.
func waitKilled(t *testing.T, ctx context.Context, c *client.Client, id string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		sb, err := c.GetSandbox(ctx, id)
		if client.IsCode(err, api.CodeNotFound) || (err == nil && sb.State == "stopped") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session sandbox %s after the session ended: %+v, %v", id, sb, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
