package server_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// edgeBound bounds every wait of the edge tests: what the server must
// answer or close, it does well within it.
const edgeBound = 30 * time.Second

// slowRequest sends a request with head (request line and headers, no
// blank line) and a chunked body it feeds one byte every `every` until
// the connection fails or the test ends. It returns the connection and a
// reader of the answer.
func slowRequest(t *testing.T, addr, head string, every time.Duration) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); c.Close(); wg.Wait() })
	if _, err := io.WriteString(c, head+"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := io.WriteString(c, "1\r\n \r\n"); err != nil {
				return
			}
		}
	}()
	return c, bufio.NewReader(c)
}

// answer reads a response from br within edgeBound and reports whether
// the server then closed the connection (also within edgeBound).
func answer(t *testing.T, c net.Conn, br *bufio.Reader) (status int, body string, closed bool) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(edgeBound))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Errorf("no answer within %v: %v", edgeBound, err)
		return 0, "", false
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	_, err = io.Copy(io.Discard, br)
	return resp.StatusCode, string(b), !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestSlowBodiesWithoutCredentials: many connections trickling a body
// (a byte every 2s) to routes that need credentials, without any, are all
// answered 401 at once and closed (net/http would otherwise read up to
// 256 KiB of each body, forever at that pace, before answering), on the
// native API, E2B's control plane and envd; an authenticated client is
// served meanwhile.
func TestSlowBodiesWithoutCredentials(t *testing.T) {
	h := newHarness(t, true, harnessOpts{e2b: true})
	sb := h.create(h.a, api.CreateSandboxRequest{Template: "base"})
	addr := h.ts.Listener.Addr().String()
	heads := []string{
		"POST /v1/sandboxes HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n",
		"POST /v1/sandboxes HTTP/1.1\r\nHost: kiln\r\nX-API-Key: e2b_" + strings.Repeat("0", 40) + "\r\n",
		"POST /v2/sandboxes HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\n",
		"POST /process.Process/Start HTTP/1.1\r\nHost: kiln\r\nContent-Type: application/json\r\nE2b-Sandbox-Id: " +
			sb.ID + "\r\nE2b-Sandbox-Port: 49983\r\n",
		"POST /contexts HTTP/1.1\r\nHost: 49999-" + sb.ID + ".kiln.test\r\n",
	}
	const n = 50
	type conn struct {
		c    net.Conn
		br   *bufio.Reader
		head string
	}
	conns := make([]conn, n)
	for i := range conns {
		head := heads[i%len(heads)]
		c, br := slowRequest(t, addr, head, 2*time.Second)
		conns[i] = conn{c, br, head}
	}
	// Meanwhile, an authenticated client is served.
	h.do("GET", "/v1/sandboxes/"+sb.ID, h.a, nil, http.StatusOK, nil)

	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			status, body, closed := answer(t, c.c, c.br)
			line, _, _ := strings.Cut(c.head, "\r\n")
			if status != http.StatusUnauthorized || !closed {
				t.Errorf("%s: %d %.100s (closed %v), want 401 and the connection closed", line, status, body, closed)
			}
		})
	}
	wg.Wait()
	h.do("GET", "/v1/sandboxes/"+sb.ID, h.a, nil, http.StatusOK, nil)
}

// TestSlowBodyTimesOut: an authenticated body that trickles (less than
// config.BodyProgressBytes per BodyTimeout) ends with 408, on the native
// API, E2B's control plane and an envd upload; an upload that keeps
// making progress runs past the timeout (it is no total deadline).
func TestSlowBodyTimesOut(t *testing.T) {
	h := newHarness(t, true, harnessOpts{e2b: true, edge: config.Edge{BodyTimeout: 2 * time.Second}})
	sb := h.create(h.a, api.CreateSandboxRequest{Template: "base"})
	token := e2b.AccessToken([]byte("test secret"), sandbox.ID(sb.ID))
	addr := h.ts.Listener.Addr().String()
	for _, tc := range []struct{ name, head string }{
		{"native create", "POST /v1/sandboxes HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer " + h.a + "\r\n"},
		{"E2B create", "POST /v2/sandboxes HTTP/1.1\r\nHost: kiln\r\nX-API-KEY: " + h.a + "\r\nContent-Type: application/json\r\n"},
		{"native file upload", "PUT /v1/sandboxes/" + sb.ID + "/files?path=/tmp/slow HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer " + h.a + "\r\n"},
		{"envd upload", "POST /files?path=/tmp/slow HTTP/1.1\r\nHost: kiln\r\nE2b-Sandbox-Id: " + sb.ID +
			"\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: " + token + "\r\nContent-Type: application/octet-stream\r\n"},
		{"envd RPC", "POST /filesystem.Filesystem/Stat HTTP/1.1\r\nHost: kiln\r\nE2b-Sandbox-Id: " + sb.ID +
			"\r\nE2b-Sandbox-Port: 49983\r\nX-Access-Token: " + token + "\r\nContent-Type: application/json\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := slowRequest(t, addr, tc.head, 300*time.Millisecond)
			status, body, closed := answer(t, c, br)
			if status != http.StatusRequestTimeout || !closed {
				t.Errorf("%d %.200s (closed %v), want 408 and the connection closed", status, body, closed)
			}
			if strings.HasPrefix(tc.name, "native") && !strings.Contains(body, "timed out") {
				t.Errorf("body %s: want the reason", body)
			}
		})
	}

	t.Run("steady upload", func(t *testing.T) {
		// 1 MiB in 64 KiB pieces every 500ms: 8s, four timeouts long.
		pr, pw := io.Pipe()
		go func() {
			piece := bytes.Repeat([]byte("k"), 64<<10)
			for range 16 {
				time.Sleep(500 * time.Millisecond)
				if _, err := pw.Write(piece); err != nil {
					return
				}
			}
			pw.Close()
		}()
		resp := h.request("PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/tmp/steady", h.a, pr)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("steady upload: %d %s", resp.StatusCode, b)
		}
		var st api.FileInfo
		h.do("GET", "/v1/sandboxes/"+sb.ID+"/files/stat?path=/tmp/steady", h.a, nil, http.StatusOK, &st)
		if st.Size != 1<<20 {
			t.Errorf("uploaded %d bytes, want %d", st.Size, 1<<20)
		}
	})
}

// TestPendingConnections: connections that never complete a request
// header are capped; beyond the cap the oldest are closed, while a
// connection that carried an authenticated request is never counted.
func TestPendingConnections(t *testing.T) {
	const max = 8
	// A long header timeout: what closes the connections here is the cap.
	h := newHarness(t, false, harnessOpts{edge: config.Edge{MaxPendingConns: max}, header: 10 * time.Minute})
	addr := h.ts.Listener.Addr().String()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: kiln\r\n"); err != nil { // never finished
			t.Fatal(err)
		}
		return c
	}
	// closed waits up to d for c to be closed by the server.
	closed := func(c net.Conn, d time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(d))
		_, err := c.Read(make([]byte, 1))
		return !errors.Is(err, os.ErrDeadlineExceeded)
	}

	// A client authenticates on a connection it keeps.
	trusted, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer trusted.Close()
	tr := bufio.NewReader(trusted)
	get := func() int {
		t.Helper()
		if _, err := fmt.Fprintf(trusted, "GET /v1/keys HTTP/1.1\r\nHost: kiln\r\nAuthorization: Bearer %s\r\n\r\n", h.admin); err != nil {
			t.Fatal(err)
		}
		_ = trusted.SetReadDeadline(time.Now().Add(edgeBound))
		resp, err := http.ReadResponse(tr, nil)
		if err != nil {
			t.Fatalf("the authenticated connection: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(); got != http.StatusOK {
		t.Fatalf("GET /v1/keys: %d", got)
	}

	var conns []net.Conn
	for range 3 * max {
		conns = append(conns, dial())
	}
	for i, c := range conns[:2*max] {
		if !closed(c, edgeBound) {
			t.Errorf("pending connection %d of %d is still open, want the oldest closed beyond %d", i, len(conns), max)
		}
	}
	// The newest are kept (nothing closes them within a second).
	for i, c := range conns[2*max:] {
		if closed(c, time.Second) {
			t.Errorf("pending connection %d of %d was closed, want the newest %d kept", 2*max+i, len(conns), max)
		}
	}
	// The authenticated connection, idle all along, is still served.
	if got := get(); got != http.StatusOK {
		t.Errorf("GET /v1/keys again on the authenticated connection: %d", got)
	}
	h.do("GET", "/v1/keys", h.admin, nil, http.StatusOK, nil)
}
