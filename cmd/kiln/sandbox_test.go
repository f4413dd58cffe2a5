package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// remoteFake serves h and returns a remote whose output is captured.
func remoteFake(t *testing.T, h http.HandlerFunc) (*remote, *strings.Builder, *strings.Builder) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	var stdout, stderr strings.Builder
	return &remote{c: client.New(srv.URL, "e2b_test"), stdout: &stdout, stderr: &stderr, stdin: strings.NewReader("")}, &stdout, &stderr
}

// code returns the exit code main would use for err.
func code(err error) int {
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	return 1
}

func TestSandboxList(t *testing.T) {
	now := time.Now()
	pages := map[string]api.SandboxList{
		"": {Sandboxes: []api.Sandbox{{ID: "sbx_a", Template: "base", Runtime: "runsc", State: "running",
			CreatedAt: now.Add(-90 * time.Second), ExpiresAt: now.Add(210 * time.Second)}}, NextPageToken: "p2"},
		"p2": {Sandboxes: []api.Sandbox{{ID: "sbx_b", Template: "python", Runtime: "runc", State: "stopped",
			CreatedAt: now.Add(-3 * time.Hour), ExpiresAt: now.Add(-time.Hour)}}},
	}
	r, stdout, _ := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		if q["state"][0] != "running" || q["state"][1] != "stopped" || q.Get("metadata.job") != "ci" {
			t.Errorf("query %s", req.URL.RawQuery)
		}
		json.NewEncoder(w).Encode(pages[q.Get("page_token")])
	})
	err := r.sandbox(context.Background(), []string{"ls", "--state", "running,stopped", "--metadata", "job=ci"})
	if err != nil {
		t.Fatal(err)
	}
	want := "ID     TEMPLATE  RUNTIME  STATE    AGE  EXPIRES\n" +
		"sbx_a  base      runsc    running  1m   in 3m\n" +
		"sbx_b  python    runc     stopped  3h   -\n"
	if stdout.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", stdout, want)
	}

	stdout.Reset()
	if err := r.sandbox(context.Background(), []string{"ls", "--json", "--state=running", "--state=stopped", "--metadata=job=ci"}); err != nil {
		t.Fatal(err)
	}
	var got []api.Sandbox
	if err := json.Unmarshal([]byte(stdout.String()), &got); err != nil || len(got) != 2 || got[1].ID != "sbx_b" {
		t.Errorf("--json: %v, %+v", err, got)
	}
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		status     int
		body       string
		want       int
		wantStderr string
	}{
		{"ok", []string{"get", "sbx_a"}, 200, `{"id":"sbx_a","state":"running"}`, 0, ""},
		{"flags after args", []string{"kill", "sbx_a", "--json"}, 204, "", 0, ""},
		{"not found", []string{"get", "sbx_a"}, 404, `{"code":"not_found","message":"sandbox sbx_a not found"}`, 3, "not_found: sandbox sbx_a not found"},
		{"not found among many", []string{"kill", "sbx_a", "sbx_b"}, 404, `{"code":"not_found","message":"gone"}`, 3, "sbx_b: not_found: gone"},
		{"unauthenticated", []string{"ls"}, 401, `{"code":"unauthenticated","message":"missing API key"}`, 4, "missing API key"},
		{"permission denied", []string{"ls"}, 403, `{"code":"permission_denied","message":"admin only"}`, 4, "admin only"},
		{"server error", []string{"get", "sbx_a"}, 500, `{"code":"internal","message":"internal error"}`, 1, ""},
		{"missing argument", []string{"get"}, 200, "", 2, "wrong number of arguments"},
		{"bad flag", []string{"ls", "--nope"}, 200, "", 2, "flag provided but not defined"},
		{"bad duration", []string{"timeout", "sbx_a", "soon"}, 200, "", 2, "DURATION"},
		{"unknown command", []string{"frobnicate"}, 200, "", 2, "unknown command"},
		{"help", []string{"exec", "-h"}, 200, "", 0, "Examples:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _, stderr := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			err := r.sandbox(context.Background(), tt.args)
			if got := code(err); got != tt.want {
				t.Errorf("exit code %d (err %v), want %d", got, err, tt.want)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr, tt.wantStderr)
			}
		})
	}
}

func TestSandboxExec(t *testing.T) {
	events := func(evs ...api.Event) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			for _, ev := range evs {
				json.NewEncoder(w).Encode(ev)
			}
		}
	}
	tests := []struct {
		name       string
		write      func(w http.ResponseWriter)
		want       int
		wantStdout string
		wantStderr string
	}{
		{"exit code", events(api.Event{Seq: 1, Type: api.EventStart, PID: 9}, api.Event{Seq: 2, Type: api.EventStdout, Data: []byte("hi\n")},
			api.Event{Seq: 3, Type: api.EventStderr, Data: []byte("oops\n")}, api.Event{Seq: 4, Type: api.EventExit, Exit: &api.ExitStatus{Code: 7}}),
			7, "hi\n", "oops\n"},
		{"timeout", events(api.Event{Seq: 1, Type: api.EventExit, PID: 9, Exit: &api.ExitStatus{Code: 137, Reason: api.ExitTimeout}}),
			137, "", "command ended: timeout"},
		{"dropped", events(api.Event{Seq: 1, Type: api.EventStart, PID: 9}, api.Event{Seq: 2, Type: api.EventStdout, Data: []byte("part")}),
			1, "part", "kiln sandbox logs sbx_a 9 --after-seq 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req api.CommandRequest
			r, stdout, stderr := remoteFake(t, func(w http.ResponseWriter, hr *http.Request) {
				json.NewDecoder(hr.Body).Decode(&req)
				tt.write(w)
			})
			err := r.sandbox(context.Background(), []string{"exec", "sbx_a", "--user", "root", "--env", "A=1", "--", "ls", "-la"})
			if got := code(err); got != tt.want {
				t.Errorf("exit code %d (err %v), want %d", got, err, tt.want)
			}
			if strings.Join(req.Args, " ") != "ls -la" || req.User != "root" || req.Env["A"] != "1" || req.Timeout != 60 {
				t.Errorf("request %+v", req)
			}
			if stdout.String() != tt.wantStdout || !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stdout %q, stderr %q; want %q and %q", stdout, stderr, tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

func TestFilesGetPut(t *testing.T) {
	stored := map[string]string{}
	r, stdout, _ := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		p := req.URL.Query().Get("path")
		switch req.Method {
		case "PUT":
			b, _ := io.ReadAll(req.Body)
			stored[p] = string(b) + " mode=" + req.URL.Query().Get("mode")
			json.NewEncoder(w).Encode(api.FileInfo{Path: p, Size: int64(len(b))})
		case "GET":
			if _, ok := stored[p]; !ok {
				w.WriteHeader(404)
				io.WriteString(w, `{"code":"not_found","message":"no such file"}`)
				return
			}
			io.WriteString(w, stored[p])
		}
	})
	dir := t.TempDir()
	local := filepath.Join(dir, "in.txt")
	os.WriteFile(local, []byte("hello"), 0o600)
	ctx := context.Background()
	if err := r.files(ctx, []string{"put", "sbx_a", local, "/tmp/"}); err != nil {
		t.Fatal(err)
	}
	if stored["/tmp/in.txt"] != "hello mode=0600" || !strings.Contains(stdout.String(), "/tmp/in.txt") {
		t.Errorf("stored %q, stdout %q", stored, stdout)
	}
	if err := r.files(ctx, []string{"get", "sbx_a", "/tmp/in.txt", dir + "/out.txt"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "out.txt")); string(b) != "hello mode=0600" {
		t.Errorf("downloaded %q", b)
	}
	// A failed download leaves no file behind.
	err := r.files(ctx, []string{"get", "sbx_a", "/tmp/missing", dir + "/missing"})
	if _, serr := os.Stat(filepath.Join(dir, "missing")); code(err) != 3 || serr == nil {
		t.Errorf("get missing: exit %d, stat %v", code(err), serr)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("temporary files left: %v", ents)
	}
}

func TestKeysCreate(t *testing.T) {
	var req api.CreateKeyRequest
	r, stdout, stderr := remoteFake(t, func(w http.ResponseWriter, hr *http.Request) {
		json.NewDecoder(hr.Body).Decode(&req)
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(api.APIKey{ID: "key_1", Name: req.Name, Secret: "e2b_secret"})
	})
	if err := r.keys(context.Background(), []string{"create", "ci", "--max-sandboxes", "3", "--max-memory", "8G"}); err != nil {
		t.Fatal(err)
	}
	if req != (api.CreateKeyRequest{Name: "ci", MaxSandboxes: 3, MaxMemoryBytes: 8 << 30}) {
		t.Errorf("request %+v", req)
	}
	if stdout.String() != "e2b_secret\n" || !strings.Contains(stderr.String(), "not shown again") {
		t.Errorf("stdout %q, stderr %q", stdout, stderr)
	}
}

func TestSandboxFork(t *testing.T) {
	r, stdout, _ := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		if req.Method != "POST" || req.URL.Path != "/v1/sandboxes/sbx_a/fork" || string(b) != `{"count":3}` {
			t.Errorf("request %s %s %s", req.Method, req.URL.Path, b)
		}
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(api.ForkResponse{Sandboxes: []api.Sandbox{{ID: "sbx_b"}, {ID: "sbx_c"}, {ID: "sbx_d"}}})
	})
	if err := r.sandbox(context.Background(), []string{"fork", "sbx_a", "--count", "3"}); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "sbx_b\nsbx_c\nsbx_d\n" {
		t.Errorf("output %q", stdout)
	}
	if err := r.sandbox(context.Background(), []string{"fork"}); code(err) != 2 {
		t.Errorf("fork without id: %v", err)
	}
}
