package e2b_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/e2b"
)

func TestRouted(t *testing.T) {
	for _, tc := range []struct {
		method, target string
		hdr            map[string]string
		want           bool
	}{
		{"GET", "/healthz", nil, false},
		{"GET", "/metrics", nil, false},
		{"POST", "/v1/sandboxes", nil, false},
		{"GET", "/v1/sandboxes/abc/files?path=/x", nil, false},
		{"GET", "/files?path=x", nil, false}, // unsigned: not E2B's
		{"GET", "/sandboxesx", nil, false},
		{"GET", "/health", nil, true},
		{"POST", "/sandboxes", nil, true},
		{"GET", "/sandboxes/abc", nil, true},
		{"POST", "/v2/sandboxes", nil, true},
		{"DELETE", "/templates/abc", nil, true},
		{"GET", "/files?path=x&signature=v1_abc", nil, true},
		{"POST", "/files?signature=v1_abc", nil, true},
		{"GET", "/v1/sandboxes", map[string]string{"E2b-Sandbox-Id": "abc"}, true},
		{"GET", "/healthz", map[string]string{"E2b-Sandbox-Port": "49983"}, true},
		{"GET", "/health", map[string]string{"Host": "49983-abcdefgh.localhost:8080"}, true},
		{"GET", "/healthz", map[string]string{"Host": "127.0.0.1:8080"}, false},
		{"GET", "/healthz", map[string]string{"Host": "api.example.com"}, false},
		{"GET", "/healthz", map[string]string{"Host": "1-api.example.com"}, false},
		{"GET", "/healthz", map[string]string{"Host": "99999-abcdefgh.example.com"}, false},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		for k, v := range tc.hdr {
			if k == "Host" {
				r.Host = v
			} else {
				r.Header.Set(k, v)
			}
		}
		if got := e2b.Routed(r); got != tc.want {
			t.Errorf("%s %s %v: Routed = %v, want %v", tc.method, tc.target, tc.hdr, got, tc.want)
		}
	}
}

// dataBody is the data plane's error JSON.
type dataBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId"`
	Port      int    `json:"port"`
}

func TestDataPlaneRouting(t *testing.T) {
	h := newHarness(t, "code-interpreter")
	sb := h.create(h.a, map[string]any{"templateID": "code-interpreter"})
	dead := h.create(h.a, map[string]any{"templateID": "base"})
	h.api("DELETE", "/sandboxes/"+dead.SandboxID, h.a, nil, http.StatusNoContent, nil)
	port := strconv.Itoa(e2b.JupyterPort)

	for _, tc := range []struct {
		name   string
		method string
		path   string
		hdr    []string
		status int
		body   string // exact, for the JSON answers
	}{
		{"headers", "GET", "/health", []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", port}, 200, `"OK"`},
		{"host", "GET", "/health", []string{"Host", port + "-" + sb.SandboxID + ".localhost:1234"}, 200, `"OK"`},
		{"host, another domain", "GET", "/contexts", []string{"Host", port + "-" + sb.SandboxID + ".kiln.test", "E2B-Traffic-Access-Token", *sb.TrafficAccessToken}, 200, ""},
		{"host, no credentials", "GET", "/contexts", []string{"Host", port + "-" + sb.SandboxID + ".kiln.test"}, 401, ""},
		{"headers, no credentials", "POST", "/contexts", []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", port}, 401, ""},
		{"only the id header", "GET", "/health", []string{"E2b-Sandbox-Id", sb.SandboxID}, 400,
			`{"code":400,"message":"Missing header: E2b-Sandbox-Port"}`},
		{"only the port header", "GET", "/health", []string{"E2b-Sandbox-Port", port}, 400,
			`{"code":400,"message":"Missing header: E2b-Sandbox-Id"}`},
		{"bad port", "GET", "/health", []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "http"}, 400, ""},
		{"killed sandbox", "GET", "/health", []string{"E2b-Sandbox-Id", dead.SandboxID, "E2b-Sandbox-Port", port}, 502,
			fmt.Sprintf(`{"code":502,"message":"The sandbox was not found","sandboxId":"%s"}`, dead.SandboxID)},
		{"unknown sandbox", "GET", "/health", []string{"E2b-Sandbox-Id", "nosuchsandbox1", "E2b-Sandbox-Port", "49983"}, 502,
			`{"code":502,"message":"The sandbox was not found","sandboxId":"nosuchsandbox1"}`},
		{"unknown sandbox by host", "GET", "/health", []string{"Host", "49983-nosuchsandbox1.localhost"}, 502,
			`{"code":502,"message":"The sandbox was not found","sandboxId":"nosuchsandbox1"}`},
		// Other ports go to the exposed-port proxy (internal/proxy): the
		// owner's key may use them in any sandbox; nothing listens on 8080.
		{"other port", "GET", "/", []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "8080", "X-API-KEY", h.a}, 502,
			fmt.Sprintf(`{"code":502,"message":"The sandbox is running but port is not open","sandboxId":"%s","port":8080}`, sb.SandboxID)},
		{"signed /files, no such signature", "GET", "/files?path=a.txt&signature=v1_nope", nil, 401,
			`{"code":401,"message":"invalid signature"}`},
		{"signed /files, expired", "GET", fmt.Sprintf("/files?path=a.txt&signature=v1_x&signature_expiration=%d", time.Now().Add(-time.Minute).Unix()), nil, 401,
			`{"code":401,"message":"signature is already expired"}`},
		{"native API untouched", "GET", "/healthz", nil, 200, ""},
	} {
		status, hdr, b := h.call(tc.method, tc.path, nil, tc.hdr...)
		if status != tc.status || (tc.body != "" && !sameJSON(b, tc.body)) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, status, b, tc.status, tc.body)
		}
		if status >= 400 && hdr.Get("X-Request-Id") == "" {
			t.Errorf("%s: no X-Request-Id: the server's request log must see E2B requests", tc.name)
		}
		if tc.body != "" && tc.body[0] == '{' {
			var d dataBody
			if err := json.Unmarshal(b, &d); err != nil || d.Code != tc.status {
				t.Errorf("%s: body %s: want integer code %d", tc.name, b, tc.status)
			}
		}
	}
}

// sameJSON reports whether a and b are the same JSON value.
func sameJSON(a []byte, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

func TestPauseResumeForkSnapshot(t *testing.T) {
	h := newHarness(t, "code-interpreter")
	sb := h.create(h.a, map[string]any{"templateID": "code-interpreter-v1"})
	if sb.TemplateID != "code-interpreter" || sb.Alias != "code-interpreter-v1" {
		t.Errorf("created %+v: want template code-interpreter under the alias code-interpreter-v1", sb)
	}
	run := func(code string) []map[string]any {
		t.Helper()
		lines, status := execute(h, sb, map[string]any{"code": code})
		if status != 200 {
			t.Fatalf("execute %q: status %d", code, status)
		}
		return lines
	}
	run("x = 41")
	h.api("POST", "/sandboxes/"+sb.SandboxID+"/pause", h.a, map[string]any{"memory": true}, http.StatusNoContent, nil)
	var e errorJSON
	h.api("POST", "/sandboxes/"+sb.SandboxID+"/pause", h.a, nil, http.StatusConflict, &e)
	if e.Code != 409 {
		t.Errorf("pausing again: %+v, want code 409 (the SDK returns false)", e)
	}
	var l []listedJSON
	h.api("GET", "/v2/sandboxes?state=paused", h.a, nil, http.StatusOK, &l)
	if len(l) != 1 || l[0].SandboxID != sb.SandboxID || l[0].State != "paused" {
		t.Errorf("paused list: %+v", l)
	}
	status, _, b := h.call("GET", "/health", nil, "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", strconv.Itoa(e2b.JupyterPort))
	if status != 502 {
		t.Errorf("data plane of a paused sandbox: %d %s, want 502", status, b)
	}
	// Connect resumes it (201) with its interpreter's state.
	var c sandboxJSON
	h.api("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", h.a, map[string]any{"timeout": 60}, http.StatusCreated, &c)
	if c.SandboxID != sb.SandboxID || c.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("connect: %+v", c)
	}
	if got := mainText(run("x + 1")); got != "42" {
		t.Errorf("after resume x + 1 = %q, want 42", got)
	}
	h.api("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", h.a, nil, http.StatusOK, nil)
	h.api("POST", "/sandboxes/"+sb.SandboxID+"/resume", h.a, nil, http.StatusConflict, nil)

	// Forks continue from the sandbox's state, with tokens of their own.
	if testRuntime() == "runsc" {
		var forks []struct {
			Sandbox *sandboxJSON `json:"sandbox"`
		}
		h.api("POST", "/sandboxes/"+sb.SandboxID+"/fork", h.a, map[string]any{"count": 1, "timeout": 60}, http.StatusCreated, &forks)
		if len(forks) != 1 || forks[0].Sandbox == nil || forks[0].Sandbox.SandboxID == sb.SandboxID ||
			forks[0].Sandbox.EnvdAccessToken == sb.EnvdAccessToken {
			t.Fatalf("forks %+v: want one new sandbox", forks)
		}
		f := *forks[0].Sandbox
		lines, _ := execute(h, f, map[string]any{"code": "x = x + 100\nx"})
		if got := mainText(lines); got != "141" {
			t.Errorf("in the fork x + 100 = %q, want 141", got)
		}
		if got := mainText(run("x")); got != "41" {
			t.Errorf("the fork changed the source: x = %q", got)
		}
		var d listedJSON
		h.api("GET", "/sandboxes/"+f.SandboxID, h.a, nil, http.StatusOK, &d)
		if left := time.Until(d.EndAt); left > 61*time.Second || left < 30*time.Second {
			t.Errorf("fork lives %v more, want ~60s", left)
		}
	}

	// Snapshots: taken by name, listed, restored as a template, deleted.
	if testRuntime() == "runsc" {
		var snap struct {
			SnapshotID string   `json:"snapshotID"`
			Names      []string `json:"names"`
		}
		h.api("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", h.a, map[string]any{"name": "e2b-snap"}, http.StatusCreated, &snap)
		if snap.SnapshotID != "e2b-snap" || len(snap.Names) != 1 || snap.Names[0] != "e2b-snap" {
			t.Errorf("snapshot %+v", snap)
		}
		for _, tc := range []struct {
			query string
			want  int
		}{{"", 1}, {"?sandboxID=" + sb.SandboxID, 1}, {"?sandboxID=abcdefgh12345678", 0}, {"?name=other", 0}} {
			var l []map[string]any
			h.api("GET", "/snapshots"+tc.query, h.a, nil, http.StatusOK, &l)
			if len(l) != tc.want {
				t.Errorf("GET /snapshots%s: %v, want %d", tc.query, l, tc.want)
			}
		}
		from := h.create(h.a, map[string]any{"templateID": "e2b-snap"})
		if from.TemplateID != "code-interpreter" {
			t.Errorf("sandbox from the snapshot: %+v", from)
		}
		if lines, _ := execute(h, from, map[string]any{"code": "x"}); mainText(lines) != "41" {
			t.Errorf("restored from the snapshot, x = %q, want 41", mainText(lines))
		}
		h.api("DELETE", "/templates/e2b-snap", h.a, nil, http.StatusNoContent, nil)
		h.api("DELETE", "/templates/e2b-snap", h.a, nil, http.StatusNotFound, nil)
	}

	// Killed during an execution: the connection is torn down, not ended
	// cleanly, so the SDK goes on to find the sandbox gone.
	body, _ := json.Marshal(map[string]any{"code": "import time\nprint('started', flush=True)\ntime.sleep(600)"})
	req, _ := http.NewRequest("POST", h.ts.URL+"/execute", bytes.NewReader(body))
	hdr := jupyter(sb, true)
	for i := 0; i < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, "started") {
		t.Fatalf("first line %q, %v", line, err)
	}
	h.api("DELETE", "/sandboxes/"+sb.SandboxID, h.a, nil, http.StatusNoContent, nil)
	rest, err := io.ReadAll(rd)
	if err == nil || strings.Contains(string(rest), "end_of_execution") {
		t.Errorf("after the kill the stream went on: %q, %v; want it torn down", rest, err)
	}
}
