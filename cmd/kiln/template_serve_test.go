package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/servetest"
)

// TestTemplateCLI runs the real kiln binary against a real kiln serve:
// kiln template build compiles a Dockerfile (FROM base, COPY, RUN, ENV),
// uploads its context and shows the build as plain progress lines; the
// rebuild is all CACHED; ls lists the template; sandboxes made from it on
// runsc and runc see the copied file, the RUN's result and the ENV; a RUN
// that fails exits 1 naming the step; rm deletes the template.
func TestTemplateCLI(t *testing.T) {
	requireTemplate(t, "base")
	kiln := buildKiln(t)
	dataDir := servetest.DataDir(t)
	addr := servetest.FreeAddr(t)
	srv := startServe(t, kiln, dataDir, addr)
	t.Cleanup(func() { srv.Stop(t) })
	key := srv.AdminKey(t)
	run := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(kiln, args...)
		cmd.Env = append(os.Environ(), "KILN_URL=http://"+addr, "KILN_API_KEY="+key)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("kiln %v: %v", args, err)
		}
		return out.String(), errb.String(), code
	}

	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(`FROM base
COPY hello.txt /opt/hello.txt
RUN tr a-z A-Z < /opt/hello.txt > /opt/upper.txt && echo made-upper
ENV GREETING=hi
`), 0o644)
	os.WriteFile(filepath.Join(ctxDir, "hello.txt"), []byte("hello from the context\n"), 0o644)

	stdout, stderr, code := run("template", "build", "-t", "clitest", ctxDir)
	if code != 0 {
		t.Fatalf("first build: exit %d\n%s", code, stderr)
	}
	for _, re := range []string{
		`(?m)^#1 \[base\] FROM template base$`,
		`(?m)^#2 \[1/3\] COPY hello.txt /opt/hello.txt$`,
		`(?m)^#2 DONE \S+$`,
		`(?m)^#3 \[2/3\] RUN tr a-z A-Z < /opt/hello.txt > /opt/upper.txt && echo made-upper$`,
		`(?m)^#3 [0-9.]+ made-upper$`,
		`(?m)^#3 DONE \S+$`,
		`(?m)^#4 \[3/3\] ENV GREETING=`,
	} {
		if !regexp.MustCompile(re).MatchString(stderr) {
			t.Errorf("first build's progress has no line matching %s:\n%s", re, stderr)
		}
	}
	if !strings.HasPrefix(stdout, "clitest:default ready: build ") {
		t.Errorf("first build's stdout %q", stdout)
	}

	_, stderr, code = run("template", "build", "-t", "clitest", ctxDir)
	if code != 0 || !strings.Contains(stderr, "#2 CACHED\n") || !strings.Contains(stderr, "#3 CACHED\n") ||
		regexp.MustCompile(`(?m)^#3 [0-9.]+ made-upper$`).MatchString(stderr) {
		t.Errorf("rebuild: exit %d, want COPY and RUN CACHED:\n%s", code, stderr)
	}

	stdout, _, code = run("template", "ls")
	if code != 0 || !regexp.MustCompile(`(?m)^clitest\s+default\s+\S+\s+ready\s+no\s`).MatchString(stdout) ||
		!regexp.MustCompile(`(?m)^base\s+default\s+built-in\s`).MatchString(stdout) {
		t.Errorf("template ls: exit %d\n%s", code, stdout)
	}

	for _, rt := range []string{"runsc", "runc"} {
		stdout, stderr, code = run("sandbox", "create", "--template", "clitest", "--runtime", rt)
		if code != 0 {
			t.Fatalf("%s: sandbox create: exit %d: %s", rt, code, stderr)
		}
		id := strings.TrimSpace(stdout)
		out, stderr, code := run("sandbox", "exec", id, "--", "sh", "-c", `cat /opt/hello.txt /opt/upper.txt; echo "$GREETING"`)
		if want := "hello from the context\nHELLO FROM THE CONTEXT\nhi\n"; code != 0 || out != want {
			t.Errorf("%s: the template's sandbox: exit %d, %q (want %q) %s", rt, code, out, want, stderr)
		}
		if _, stderr, code := run("sandbox", "kill", id); code != 0 {
			t.Errorf("%s: kill: %s", rt, stderr)
		}
	}

	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM base\nRUN echo about to fail; exit 3\n"), 0o644)
	_, stderr, code = run("template", "build", "-t", "clitest-bad", ctxDir)
	if code != 1 || !regexp.MustCompile(`(?m)^#2 [0-9.]+ about to fail$`).MatchString(stderr) ||
		!regexp.MustCompile(`(?m)^kiln: template build \S+ failed: step 1 \(RUN, Dockerfile line 2\): .*status 3`).MatchString(stderr) {
		t.Errorf("failing RUN: exit %d, want 1 with the step named:\n%s", code, stderr)
	}

	if _, stderr, code := run("template", "rm", "clitest"); code != 0 {
		t.Errorf("template rm: exit %d %s", code, stderr)
	}
	if _, stderr, code := run("template", "get", "clitest"); code != 3 {
		t.Errorf("template get after rm: exit %d, want 3 (not found): %s", code, stderr)
	}
}
