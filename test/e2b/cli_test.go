package e2b_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/template"
)

// cliDockerfile is what `e2b template create` builds in TestCLITemplates:
// an E2B base image, an ARG and an ENV, a WORKDIR, a COPY with --chown, a
// RUN, and a CMD (which the CLI makes the start command, ready after
// "sleep 20").
const cliDockerfile = `FROM e2bdev/base
ARG VERSION=1.2.3
ENV GREETING=hello-from-the-cli
WORKDIR /app
COPY --chown=user:user hello.txt /app/
RUN echo "built v$VERSION" > /app/built.txt
CMD ["python3", "-m", "http.server", "8000"]
`

// cliTemplate is one template of `e2b template list --format json`.
type cliTemplate struct {
	TemplateID string   `json:"templateID"`
	Aliases    []string `json:"aliases"`
	Public     bool     `json:"public"`
	CPUCount   int      `json:"cpuCount"`
	MemoryMB   int      `json:"memoryMB"`
}

// TestCLITemplates drives E2B's own CLI (npm @e2b/cli, pinned in cli/,
// unchanged, configured only by E2B_API_URL and E2B_API_KEY, with a HOME
// of its own) against kiln serve: `e2b template create` builds a
// Dockerfile (compiled by the CLI into E2B's build API calls), a sandbox of
// it made with the stock SDK has the files, environment, working
// directory, user and running CMD the Dockerfile asked for; a second
// create is served from the cache; `template list`, `publish` and
// `unpublish` see and change it; a failing RUN fails the create naming
// the step; `template delete` removes it.
func TestCLITemplates(t *testing.T) {
	ocitest.RequireRoot(t)
	_, err := template.Lookup(config.FromEnv().DataDir, "base")
	ocitest.Require(t, err == nil, fmt.Sprintf("template base not built (make setup): %v", err))
	requireNode(t)
	dir, err := filepath.Abs("cli")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, dir)
	srv := servetest.Start(t, servetest.Build(t))

	home, root := t.TempDir(), t.TempDir()
	for name, body := range map[string]string{
		"e2b.Dockerfile": cliDockerfile, // the name the CLI looks for first
		"hello.txt":      "hello from a COPY\n",
		"bad.Dockerfile": "FROM e2bdev/base\nRUN echo about to fail && exit 3\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cli := func(wantOK bool, args ...string) string {
		t.Helper()
		out, err := runCLI(t, dir, cliEnv(home, srv), args...)
		if (err == nil) != wantOK {
			t.Fatalf("e2b %s: %v (want success: %v)\n%s", strings.Join(args, " "), err, wantOK, out)
		}
		return out
	}
	list := func() map[string]cliTemplate {
		t.Helper()
		out := cli(true, "template", "list", "--format", "json")
		var ts []cliTemplate
		if err := json.Unmarshal([]byte(out[max(strings.Index(out, "["), 0):]), &ts); err != nil {
			t.Fatalf("e2b template list --format json: %v\n%s", err, out)
		}
		m := map[string]cliTemplate{}
		for _, tm := range ts {
			m[tm.TemplateID] = tm
		}
		return m
	}

	const name = "kiln-cli"
	out := cli(true, "template", "create", name, "--path", root, "--cpu-count", "1", "--memory-mb", "512")
	for _, want := range []string{"Uploaded 'hello.txt'", "ready when sleep 20", "Building sandbox template " + name + " finished"} {
		if !strings.Contains(out, want) {
			t.Errorf("e2b template create: no %q in its output", want)
		}
	}
	if tm, ok := list()[name]; !ok || tm.Public || tm.CPUCount != 1 || tm.MemoryMB != 512 || len(tm.Aliases) != 1 || tm.Aliases[0] != name {
		t.Errorf("e2b template list: %s is %+v (present: %v), want private, 1 vCPU, 512 MiB, alias %s", name, tm, ok, name)
	}

	var facts map[string]string
	check, err := runNodeScript(t, dir, append(sdkEnv(dir, srv), "HOME="+home), "check.mjs", name)
	if err != nil {
		t.Fatalf("node check.mjs %s: %v\n%s", name, err, check)
	}
	if err := json.Unmarshal([]byte(lastLine(check)), &facts); err != nil {
		t.Fatalf("node check.mjs %s: %v\n%s", name, err, check)
	}
	for k, want := range map[string]string{
		"pwd": "/app", "user": "user", "copied": "hello from a COPY", "owner": "user:user",
		"built": "built v1.2.3", "greeting": "hello-from-the-cli", "version": "1.2.3",
		"served": "hello from a COPY",
	} {
		if facts[k] != want {
			t.Errorf("in a sandbox of %s: %s is %q, want %q", name, k, facts[k], want)
		}
	}

	out = cli(true, "template", "create", name, "--path", root, "--cpu-count", "1", "--memory-mb", "512")
	for _, want := range []string{"Skipping upload of 'hello.txt', already cached", "RUN echo \"built v$VERSION\" > /app/built.txt CACHED"} {
		if !strings.Contains(out, want) {
			t.Errorf("e2b template create, again: no %q in its output", want)
		}
	}

	cli(true, "template", "publish", name, "--yes")
	if tm := list()[name]; !tm.Public {
		t.Errorf("after e2b template publish: %+v, want public", tm)
	}
	cli(true, "template", "unpublish", name, "--yes")
	if tm := list()[name]; tm.Public {
		t.Errorf("after e2b template unpublish: %+v, want private", tm)
	}

	out = cli(false, "template", "create", name+"-bad", "--path", root, "--dockerfile", "bad.Dockerfile")
	for _, want := range []string{"Template build failed", "step 3 (RUN): the command exited with status 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("e2b template create of a failing RUN: no %q in its output", want)
		}
	}

	cli(true, "template", "delete", name, "--yes")
	if tm, ok := list()[name]; ok {
		t.Errorf("e2b template list after delete: %+v", tm)
	}
	if st := aliasStatus(t, srv, name); st != http.StatusNotFound {
		t.Errorf("GET /templates/aliases/%s after delete: %d, want 404", name, st)
	}
	if out := cli(false, "template", "delete", name, "--yes"); !strings.Contains(out, "[404]") {
		t.Errorf("deleting %s again: want E2B's 404, got:\n%s", name, out)
	}
	if ids := srv.Alive(t); len(ids) > 0 {
		t.Errorf("sandboxes left: %v", ids)
	}
}

// cliTimeout bounds one CLI or check.mjs run (a create builds a template).
const cliTimeout = 10 * time.Minute

// runCLI runs the e2b command that dir's npm project installed, with env,
// and returns its output (stdout and stderr), logged.
func runCLI(t *testing.T, dir string, env []string, args ...string) (string, error) {
	t.Helper()
	return runLogged(t, dir, env, filepath.Join(dir, "node_modules", ".bin", "e2b"), args...)
}

// runNodeScript runs node script in dir with env.
func runNodeScript(t *testing.T, dir string, env []string, script string, args ...string) (string, error) {
	t.Helper()
	return runLogged(t, dir, env, "node", append([]string{script}, args...)...)
}

func runLogged(t *testing.T, dir string, env []string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env, cmd.WaitDelay = dir, env, 10*time.Second
	b, err := cmd.CombinedOutput()
	t.Logf("%s %s:\n%s", filepath.Base(name), strings.Join(args, " "), b)
	if ctx.Err() != nil {
		err = fmt.Errorf("did not finish in %v: %w", cliTimeout, err)
	}
	return string(b), err
}

// cliEnv is the CLI's environment: this process's without any E2B_*
// variable and with HOME (where it reads ~/.e2b/config.json) a fresh
// directory, plus the two variables that point it at srv, and
// NO_UPDATE_NOTIFIER (else it asks npm's registry for a newer version of
// itself).
func cliEnv(home string, srv *servetest.Server) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	return append(env, "HOME="+home, "NO_UPDATE_NOTIFIER=1", "E2B_API_URL="+srv.URL, "E2B_API_KEY="+srv.Key)
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// aliasStatus is the status of GET /templates/aliases/{name} with srv's key.
func aliasStatus(t *testing.T, srv *servetest.Server, name string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/templates/aliases/"+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", srv.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
