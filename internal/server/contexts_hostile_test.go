package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/template"
)

// codeInterpreterHarness is a server that can create code-interpreter
// sandboxes.
func codeInterpreterHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, true, harnessOpts{})
	_, terr := template.Lookup(config.FromEnv().DataDir, "code-interpreter")
	ocitest.Require(t, terr == nil, fmt.Sprintf("code-interpreter template not built (make setup): %v", terr))
	return h
}

// contextCode prints 2 in each language.
var contextCode = map[string]string{
	"python": "print(1+1)", "javascript": "console.log(1+1)", "bash": "echo $((1+1))", "r": "cat(1+1, \"\\n\")",
}

// createContext posts a context and returns it, or the error and status.
func createContext(t *testing.T, h *harness, base string, req api.CreateContextRequest) (api.Context, int, api.Error) {
	t.Helper()
	b, _ := json.Marshal(req)
	resp := h.request("POST", base+"/contexts", h.a, strings.NewReader(string(b)))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return api.Context{}, resp.StatusCode, apiErr(t, resp)
	}
	defer resp.Body.Close()
	var c api.Context
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatalf("context %q: %v", body, err)
	}
	return c, resp.StatusCode, api.Error{}
}

// A context whose working directory the sandbox's user cannot enter is
// refused with 403 in every language, on both runtimes, and the sandbox
// stays usable: python and R contexts used to panic the agent (and so
// kill the sandbox), javascript and bash answered 503.
func TestContextCwdRefused(t *testing.T) {
	h := codeInterpreterHarness(t)
	for _, rt := range []string{"runsc", "runc"} {
		t.Run(rt, func(t *testing.T) {
			h := h.with(t)
			sb := h.create(h.a, api.CreateSandboxRequest{Template: "code-interpreter", Runtime: rt, Timeout: 900})
			base := "/v1/sandboxes/" + sb.ID
			rootSh(t, h, base, "mkdir -m 700 /opt/private && mkdir -m 755 /opt/private/open")
			for _, lang := range []string{"python", "javascript", "bash", "r"} {
				for _, cwd := range []string{"/root", "/var/cache/ldconfig", "/opt/private", "/opt/private/open"} {
					c, status, e := createContext(t, h, base, api.CreateContextRequest{Language: lang, Cwd: cwd})
					if status != http.StatusForbidden || e.Code != api.CodePermissionDenied {
						t.Errorf("%s context in %s: %d %+v %+v; want 403 permission_denied", lang, cwd, status, e, c)
					}
				}
				// The sandbox goes on: a context of the language works.
				c, status, e := createContext(t, h, base, api.CreateContextRequest{Language: lang, Cwd: "/tmp"})
				if c.ID == "" {
					t.Fatalf("%s context in /tmp: %d %+v", lang, status, e)
				}
				run := mustRun(t, h, base, api.CodeRequest{ContextID: c.ID, Code: contextCode[lang]})
				if strings.TrimSpace(run.Stdout) != "2" {
					t.Errorf("%s context: stdout %q", lang, run.Stdout)
				}
				h.do("DELETE", base+"/contexts/"+c.ID, h.a, nil, http.StatusNoContent, nil)
			}
			var got api.Sandbox
			h.do("GET", base, h.a, nil, http.StatusOK, &got)
			if got.State != "running" {
				t.Errorf("sandbox %s after the refused contexts", got.State)
			}
		})
	}
}

// rootSh runs a shell command as root in the sandbox and fails the test
// unless it exits 0.
func rootSh(t *testing.T, h *harness, base, cmd string) string {
	t.Helper()
	b, _ := json.Marshal(api.CommandRequest{Cmd: cmd, User: "root"})
	resp := h.request("POST", base+"/commands", h.a, strings.NewReader(string(b)), "Accept", "application/json")
	defer resp.Body.Close()
	var res api.CommandResult
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &res) != nil || res.Exit.Code != 0 {
		t.Fatalf("%s: %d %s", cmd, resp.StatusCode, body)
	}
	return res.Stdout
}

// Python contexts are created in a small sandbox until one is refused
// with 429 resource_exhausted: the sandbox is still running and every
// earlier context still executes (before, ~13-23 idle Python kernels
// outgrew a 512 MiB runsc sandbox's host cgroup, which killed it whole).
func TestContextsMemoryExhausted(t *testing.T) {
	h := codeInterpreterHarness(t)
	for _, rt := range []string{"runsc", "runc"} {
		t.Run(rt, func(t *testing.T) {
			h := h.with(t)
			sb := h.create(h.a, api.CreateSandboxRequest{Template: "code-interpreter", Runtime: rt, Timeout: 900,
				Limits: api.Limits{MemoryBytes: 320 << 20}})
			base := "/v1/sandboxes/" + sb.ID
			var made []api.Context
			for len(made) < 20 {
				c, status, e := createContext(t, h, base, api.CreateContextRequest{Language: "python"})
				if c.ID != "" {
					made = append(made, c)
					continue
				}
				if status != http.StatusTooManyRequests || e.Code != api.CodeResourceExhausted || !strings.Contains(e.Message, "memory") {
					t.Fatalf("context %d: %d %+v; want 429 resource_exhausted about memory", len(made)+1, status, e)
				}
				t.Logf("context %d refused: %s", len(made)+1, e.Message)
				break
			}
			if len(made) == 0 || len(made) == 20 {
				t.Fatalf("%d contexts made: want some, then a refusal", len(made))
			}
			for i, c := range made {
				run := mustRun(t, h, base, api.CodeRequest{ContextID: c.ID, Code: fmt.Sprintf("print(%d)", i)})
				if strings.TrimSpace(run.Stdout) != fmt.Sprint(i) {
					t.Errorf("context %d: stdout %q", i, run.Stdout)
				}
			}
			var got api.Sandbox
			h.do("GET", base, h.a, nil, http.StatusOK, &got)
			if got.State != "running" {
				t.Fatalf("sandbox %s (%s)", got.State, got.Reason)
			}
			// Deleting a context makes room for another.
			h.do("DELETE", base+"/contexts/"+made[0].ID, h.a, nil, http.StatusNoContent, nil)
			if c, status, e := createContext(t, h, base, api.CreateContextRequest{Language: "python"}); c.ID == "" {
				t.Fatalf("context after a delete: %d %+v", status, e)
			}
		})
	}
}

// Code in a kernel that allocates past the sandbox's memory limit loses
// its kernel, not the sandbox: under gVisor the agent's guard kills the
// kernel holding the most memory before the host's cgroup would kill the
// whole sandbox; under runc the kernel's OOM killer picks it.
func TestKernelMemoryHog(t *testing.T) {
	h := codeInterpreterHarness(t)
	for _, rt := range []string{"runsc", "runc"} {
		t.Run(rt, func(t *testing.T) {
			h := h.with(t)
			sb := h.create(h.a, api.CreateSandboxRequest{Template: "code-interpreter", Runtime: rt, Timeout: 900,
				Limits: api.Limits{MemoryBytes: 512 << 20}})
			base := "/v1/sandboxes/" + sb.ID
			c, status, e := createContext(t, h, base, api.CreateContextRequest{Language: "python"})
			if c.ID == "" {
				t.Fatalf("context: %d %+v", status, e)
			}
			mustRun(t, h, base, api.CodeRequest{ContextID: c.ID, Code: "print(1)"})
			run := runCode(t, h, base, api.CodeRequest{ContextID: c.ID, Code: "x = bytearray(900 << 20)\nx[::4096] = b'a' * len(x[::4096])\nprint('survived')"})
			if strings.Contains(run.Stdout, "survived") {
				t.Fatalf("900 MiB allocated in a 512 MiB sandbox: %+v", run)
			}
			var got api.Sandbox
			h.do("GET", base, h.a, nil, http.StatusOK, &got)
			if got.State != "running" {
				t.Fatalf("sandbox %s (%s) after a kernel's memory hog", got.State, got.Reason)
			}
			// The killed kernel's memory is freed as the kernel reclaims
			// it: a new context may be refused (429) for a moment.
			var fresh api.Context
			for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
				c, status, e := createContext(t, h, base, api.CreateContextRequest{Language: "python"})
				if c.ID != "" {
					fresh = c
					break
				}
				if status != http.StatusTooManyRequests || time.Now().After(deadline) {
					t.Fatalf("context after the hog: %d %+v", status, e)
				}
			}
			if r := mustRun(t, h, base, api.CodeRequest{ContextID: fresh.ID, Code: "print(6*7)"}); strings.TrimSpace(r.Stdout) != "42" {
				t.Errorf("fresh context after the hog: %q", r.Stdout)
			}
		})
	}
}
