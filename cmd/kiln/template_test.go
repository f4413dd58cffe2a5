package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
)

// fakeTemplates is a server of the /v1/templates API that runs builds by
// replaying a given log: enough to check what the CLI sends and shows.
type fakeTemplates struct {
	mu       sync.Mutex
	uploads  map[string]int // hash -> bytes
	req      api.TemplateBuildRequest
	log      []api.TemplateLogEntry
	final    api.TemplateBuild
	requests []string
}

func (f *fakeTemplates) serve(t *testing.T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.requests = append(f.requests, r.Method+" "+r.URL.Path)
		p := r.URL.Path
		switch {
		case r.Method == "HEAD" && strings.HasPrefix(p, "/v1/templates/files/"):
			w.WriteHeader(404)
		case r.Method == "PUT" && strings.HasPrefix(p, "/v1/templates/files/"):
			b, _ := io.ReadAll(r.Body)
			f.uploads[strings.TrimPrefix(p, "/v1/templates/files/")] = len(b)
			w.WriteHeader(204)
		case r.Method == "GET" && p == "/v1/templates/base":
			json.NewEncoder(w).Encode(api.Template{Name: "base", Tag: "default", Builtin: true, Public: true})
		case r.Method == "POST" && p == "/v1/templates/builds":
			if err := json.NewDecoder(r.Body).Decode(&f.req); err != nil {
				t.Errorf("build request: %v", err)
			}
			w.WriteHeader(202)
			json.NewEncoder(w).Encode(api.TemplateBuild{ID: f.final.ID, Template: "cowsay", Status: api.BuildBuilding})
		case r.Method == "GET" && p == "/v1/templates/builds/"+f.final.ID+"/logs":
			if r.URL.Query().Get("offset") != "0" {
				t.Errorf("log offset %s", r.URL.RawQuery)
			}
			for _, e := range f.log {
				json.NewEncoder(w).Encode(e)
			}
		case r.Method == "GET" && p == "/v1/templates/builds/"+f.final.ID:
			json.NewEncoder(w).Encode(f.final)
		default:
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeNotFound, Message: "not found"})
		}
	}
}

// TestTemplateBuildCommand drives kiln template build against a fake
// server: the Dockerfile is compiled and its context uploaded, the request
// carries the flags, the log is shown as plain progress lines, and the
// exit status is the build's.
func TestTemplateBuildCommand(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM base\nARG V=1\nCOPY data.txt /data.txt\nRUN echo $V\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "data.txt"), []byte("hello"), 0o644)
	at := func(ms int) time.Time { return time.Date(2026, 1, 1, 0, 0, 0, ms*int(time.Millisecond), time.UTC) }
	log := []api.TemplateLogEntry{
		{Time: at(0), Level: "info", Step: -1, Message: "[base] FROM template base", Stage: "base", Total: 2, Event: api.LogBegin},
		{Time: at(100), Level: "info", Step: 0, Message: "[1/2] COPY data.txt /data.txt CACHED", Stage: "step", Total: 2, Event: api.LogBegin, Cached: true},
		{Time: at(200), Level: "info", Step: 1, Message: "[2/2] RUN V=2 echo $V", Stage: "step", Total: 2, Event: api.LogBegin},
		{Time: at(700), Level: "info", Step: 1, Message: "2", Output: true, Stage: "step", Total: 2},
	}
	tests := []struct {
		name       string
		final      api.TemplateBuild
		end        api.TemplateLogEntry
		want       int
		wantStdout string
		wantStderr string
	}{
		{"ready", api.TemplateBuild{ID: "tb1", Template: "cowsay", Tag: "v2", Status: api.BuildReady, Steps: 2, CachedSteps: 1},
			api.TemplateLogEntry{Time: at(900), Level: "info", Step: -1, Message: "build tb1 ready in 0.9s", Stage: "finalize", Total: 2, Event: api.LogReady},
			0, "cowsay:v2 ready: build tb1, 2 steps (1 cached)\n",
			"#1 [base] FROM template base\n#1 DONE 0.1s\n#2 [1/2] COPY data.txt /data.txt\n#2 CACHED\n#3 [2/2] RUN V=2 echo $V\n#3 0.500 2\n#3 DONE 0.7s\nbuild tb1 ready in 0.9s\n"},
		{"failed", api.TemplateBuild{ID: "tb2", Template: "cowsay", Status: api.BuildError, Reason: "step 2 (RUN): the command exited with status 3\n2\x1b[2J"},
			api.TemplateLogEntry{Time: at(900), Level: "error", Step: 1, Message: "build failed: step 2 (RUN): the command exited with status 3\n2",
				Stage: "step", Total: 2, Event: api.LogError},
			1, "", "#3 ERROR: step 2 (RUN): the command exited with status 3\nkiln: template build tb2 failed: step 2 (RUN): the command exited with status 3\n2\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeTemplates{uploads: map[string]int{}, log: append(append([]api.TemplateLogEntry{}, log...), tt.end), final: tt.final}
			r, stdout, stderr := remoteFake(t, f.serve(t))
			err := r.template(context.Background(), config.Default(), []string{"build", "-t", "cowsay:v2", "--build-arg", "V=2",
				dir, "--cmd", "sleep infinity", "--memory", "512", "--no-cache", "--progress", "plain"})
			if got := code(err); got != tt.want {
				t.Errorf("exit %d (%v), want %d; stderr:\n%s", got, err, tt.want, stderr)
			}
			if stdout.String() != tt.wantStdout {
				t.Errorf("stdout %q, want %q", stdout, tt.wantStdout)
			}
			if !strings.HasSuffix(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr:\n%s\nwant it to end with:\n%s", stderr, tt.wantStderr)
			}
			s := f.req.Spec
			if f.req.Template != "cowsay:v2" || s.From.Template != "base" || len(s.Steps) != 2 || s.StartCmd != "sleep infinity" ||
				s.MemoryMB != 512 || !s.NoCache || s.Steps[1].Args[0] != `export V="2"; echo $V` {
				t.Errorf("build request %+v", f.req)
			}
			if h := s.Steps[0].FilesHash; h == "" || f.uploads[h] == 0 {
				t.Errorf("COPY's files %q not uploaded (uploads %v)", h, f.uploads)
			}
		})
	}
}

// TestTemplateDetach: --detach prints the build id and does not follow.
func TestTemplateDetach(t *testing.T) {
	f := &fakeTemplates{uploads: map[string]int{}, final: api.TemplateBuild{ID: "tb9"}}
	r, stdout, _ := remoteFake(t, f.serve(t))
	err := r.template(context.Background(), config.Default(), []string{"build", "--detach", "-t", "tools",
		"--from-image", "debian:bookworm", "--run", "apt-get update, really", "--run", "true"})
	if err != nil || stdout.String() != "tb9\n" {
		t.Fatalf("exit %v, stdout %q", err, stdout)
	}
	s := f.req.Spec
	if s.From.Image != "debian:bookworm" || len(s.Steps) != 2 || s.Steps[0].Args[0] != "apt-get update, really" || s.Steps[1].Type != api.StepRun {
		t.Errorf("spec %+v", s)
	}
	for _, req := range f.requests {
		if strings.HasSuffix(req, "/logs") {
			t.Errorf("--detach followed the log: %v", f.requests)
		}
	}
}

// TestTemplateUsage: bad flags and arguments are usage errors (exit 2)
// that say what is wrong; -h is not an error.
func TestTemplateUsage(t *testing.T) {
	tests := []struct {
		args       []string
		want       int
		wantStderr string
	}{
		{[]string{"build", "-t", "x"}, 2, "give one CONTEXT_DIR"},
		{[]string{"build", "-f", "Dockerfile", "."}, 2, "-f builds on a server: give the template's name with -t"},
		{[]string{"build", "-t", "x", "--force", "."}, 2, "--force is for local builds"},
		{[]string{"build", "--local", "-t", "x", "."}, 2, "not both"},
		{[]string{"build", "-t", "x", "--progress", "fancy", "."}, 2, `--progress "fancy"`},
		{[]string{"build", "-t", "x", "--from", "base", "."}, 2, "takes no Dockerfile"},
		{[]string{"build", "-t", "x", "--run", "true", "."}, 2, "--run and --registry-user go with --from"},
		{[]string{"build", "--nope"}, 2, "flag provided but not defined"},
		{[]string{"build", "nosuch"}, 1, ""},
		{[]string{"build", "-h"}, 0, "Examples:"},
		{[]string{"tag", "web", "tb1"}, 2, `want NAME:TAG, got "web"`},
		{[]string{"untag"}, 2, "wrong number of arguments"},
		{[]string{"ls", "--nope"}, 2, "flag provided but not defined"},
		{[]string{"logs"}, 2, "wrong number of arguments"},
		{[]string{"frobnicate"}, 2, "unknown command"},
		{nil, 2, "kiln template build -t NAME[:TAG]"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r, _, stderr := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
				t.Errorf("a usage error reached the server: %s %s", req.Method, req.URL)
			})
			err := r.template(context.Background(), config.Config{DataDir: t.TempDir()}, tt.args)
			if got := code(err); got != tt.want {
				t.Errorf("exit %d (%v), want %d", got, err, tt.want)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr, tt.wantStderr)
			}
		})
	}
}

// TestTemplateManage drives ls, get, tag, untag, rm, builds, publish and
// logs against a fake server.
func TestTemplateManage(t *testing.T) {
	now := time.Now()
	started, finished := now.Add(-3*time.Minute), now.Add(-3*time.Minute+4200*time.Millisecond)
	build := api.TemplateBuild{ID: "tb1", Template: "web", Tag: "default", Status: api.BuildReady, Steps: 3, CachedSteps: 2, Layers: 9, Warm: true,
		CreatedAt: started, StartedAt: &started, FinishedAt: &finished,
		Spec: &api.TemplateSpec{From: api.TemplateBase{Template: "base"}, StartCmd: "python3 -m http.server", ReadyCmd: "curl -sf localhost:8000"}}
	web := api.Template{Name: "web", Tag: "default", BuildID: "tb1", Owner: "key1", UpdatedAt: now.Add(-3 * time.Minute), Build: &build}
	var reqs []string
	r, stdout, _ := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		reqs = append(reqs, req.Method+" "+req.URL.String()+" "+strings.TrimSpace(string(b)))
		switch {
		case req.Method == "GET" && req.URL.Path == "/v1/templates":
			json.NewEncoder(w).Encode(api.TemplateList{Templates: []api.Template{{Name: "base", Tag: "default", Builtin: true, Public: true}, web}})
		case req.Method == "GET" && req.URL.Path == "/v1/templates/web":
			json.NewEncoder(w).Encode(web)
		case req.Method == "PUT" && req.URL.Path == "/v1/templates/web/tags/stable":
			json.NewEncoder(w).Encode(api.Template{Name: "web", Tag: "stable", BuildID: "tb1"})
		case req.Method == "PATCH" && req.URL.Path == "/v1/templates/web":
			json.NewEncoder(w).Encode(api.Template{Name: "web", Tag: "default", Public: true})
		case req.Method == "POST" && req.URL.Path == "/v1/templates/web:v1/push":
			json.NewEncoder(w).Encode(api.TemplatePushResult{Image: "reg.example/team/web:v1", Digest: "sha256:abc", BuildID: "tb1"})
		case req.Method == "DELETE":
			w.WriteHeader(204)
		case req.URL.Path == "/v1/templates/builds":
			json.NewEncoder(w).Encode(api.TemplateBuildList{Builds: []api.TemplateBuild{build}})
		case req.URL.Path == "/v1/templates/builds/tb1/logs":
			json.NewEncoder(w).Encode(api.TemplateLogEntry{Time: started, Step: -1, Level: "info", Message: "[base] FROM template base"})
		default:
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeNotFound, Message: "template \"nope\" not found"})
		}
	})
	ctx := context.Background()
	steps := []struct {
		args []string
		out  string
		code int
		req  string
	}{
		{[]string{"ls"}, "NAME  TAG      BUILD     STATUS  PUBLIC  UPDATED\nbase  default  built-in  ready   yes     -\nweb   default  tb1       ready   no      3m\n", 0, "GET /v1/templates "},
		{[]string{"get", "web"}, "name:     web:default\nbuild:    tb1\nowner:    key1\npublic:   no\nupdated:  " + web.UpdatedAt.Local().Format(time.DateTime) +
			"\nstatus:   ready (3 steps, 2 cached, 9 layers, warm)\nfrom:     template base\nstart:    python3 -m http.server\nready:    curl -sf localhost:8000\n", 0, "GET /v1/templates/web "},
		{[]string{"get", "nope"}, "", 3, "GET /v1/templates/nope "},
		{[]string{"tag", "web:stable", "tb1"}, "web:stable -> tb1\n", 0, `PUT /v1/templates/web/tags/stable {"build_id":"tb1"}`},
		{[]string{"untag", "web:stable"}, "web:stable\n", 0, "DELETE /v1/templates/web/tags/stable "},
		{[]string{"publish", "web"}, "web public: yes\n", 0, `PATCH /v1/templates/web {"public":true}`},
		{[]string{"push", "web:v1", "reg.example/team/web:v1", "--registry-user", "ci"}, "reg.example/team/web:v1@sha256:abc\n", 0,
			`POST /v1/templates/web:v1/push {"image":"reg.example/team/web:v1","registry":{"username":"ci","password":""}}`},
		{[]string{"push", "web:v1"}, "", 2, `POST /v1/templates/web:v1/push {"image":"reg.example/team/web:v1","registry":{"username":"ci","password":""}}`},
		{[]string{"rm", "web:v1", "web"}, "web:v1\nweb\n", 0, "DELETE /v1/templates/web "},
		{[]string{"builds", "web", "--limit", "5"}, "ID   TEMPLATE     STATUS  STEPS  CACHED  AGE  TOOK\ntb1  web:default  ready   3      2       3m   4.2s\n", 0,
			"GET /v1/templates/builds?limit=5&template=web "},
		{[]string{"logs", "tb1"}, "#1 [base] FROM template base\n", 0, "GET /v1/templates/builds/tb1/logs?follow=false&offset=0 "},
	}
	for _, s := range steps {
		stdout.Reset()
		err := r.template(ctx, config.Default(), s.args)
		if got := code(err); got != s.code || stdout.String() != s.out {
			t.Errorf("%v: exit %d (%v), output:\n%s\nwant %d:\n%s", s.args, got, err, stdout, s.code, s.out)
		}
		if last := reqs[len(reqs)-1]; last != s.req {
			t.Errorf("%v: request %q, want %q", s.args, last, s.req)
		}
	}
}

// TestTemplateListLocal: ls --local lists the built-ins built in the data
// dir, with no server.
func TestTemplateListLocal(t *testing.T) {
	r, stdout, _ := remoteFake(t, func(w http.ResponseWriter, req *http.Request) {
		t.Errorf("ls --local asked the server: %s", req.URL)
	})
	if err := r.template(context.Background(), config.Default(), []string{"ls", "--local", "--data-dir", t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "NAME  BUILD  USER  WORKDIR  WARM\n" {
		t.Errorf("output %q", stdout)
	}
}
