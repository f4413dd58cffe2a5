package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/console"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/servetest"
	"github.com/kiln-sh/kiln/internal/template"
	"github.com/kiln-sh/kiln/internal/template/dockerfile"
)

// chromiumPath is Debian's chromium (scripts/setup-deps.sh installs it).
const chromiumPath = "/usr/bin/chromium"

// browser drives one headless Chromium tab against a real kiln serve.
type browser struct {
	t   *testing.T
	ctx context.Context
	url string // the server's

	mu       sync.Mutex
	problems []string // uncaught exceptions and CSP violations
}

// newBrowser starts Chromium with the flags this closed network needs (no
// background networking, no QUIC, a fresh profile) and one tab.
func newBrowser(t *testing.T, url string) *browser {
	t.Helper()
	_, err := exec.LookPath(chromiumPath)
	ocitest.Require(t, err == nil, "chromium not installed (scripts/setup-deps.sh installs it)")
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browser{t: t, ctx: ctx, url: url}
	err = chromedp.Listen(ctx, func(ev any) {
		var p string
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			p = "exception: " + ev.ExceptionDetails.Text
			if ev.ExceptionDetails.Exception != nil {
				p += " " + ev.ExceptionDetails.Exception.Description
			}
		case *log.EventEntryAdded:
			if strings.Contains(ev.Entry.Text, "Content Security Policy") {
				p = "CSP: " + ev.Entry.Text
			}
		}
		if p != "" {
			b.mu.Lock()
			b.problems = append(b.problems, p)
			b.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, log.Enable, struct{}{}); err != nil {
		t.Fatalf("enabling the log domain: %v", err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, struct{}{}); err != nil {
		t.Fatalf("enabling the runtime domain: %v", err)
	}
	return b
}

// do runs actions, failing the test with a screenshot's path on error.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.fail(what, err)
	}
}

// wait polls a JavaScript condition until it is true, for up to d.
func (b *browser) wait(what, expr string, d time.Duration) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, d+30*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(d), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		b.fail(what, err)
	}
}

func (b *browser) eval(expr string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.fail("evaluating "+expr, err)
	}
	return s
}

func (b *browser) fail(what string, err error) {
	b.t.Helper()
	path := b.shot("failure-" + regexp.MustCompile(`\W+`).ReplaceAllString(b.t.Name(), "_"))
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 3000) : ''`))
	b.t.Fatalf("%s: %v (screenshot %s)\npage text:\n%s", what, err, path, body)
}

// shotDir is where screenshots go: $KILN_CONSOLE_SCREENSHOTS (docs/console
// to refresh the docs' pictures), else a directory under the temp dir that
// the test logs and leaves, as artifacts.
func shotDir() string {
	if d := os.Getenv("KILN_CONSOLE_SCREENSHOTS"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "kiln-console-screenshots")
}

// shot saves a screenshot of the viewport as name.png and returns its path.
func (b *browser) shot(name string) string {
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		return "(none: " + err.Error() + ")"
	}
	dir := shotDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "(none: " + err.Error() + ")"
	}
	p := filepath.Join(dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		return "(none: " + err.Error() + ")"
	}
	return p
}

func (b *browser) signIn(key string) {
	b.t.Helper()
	b.do("opening the sign-in page", chromedp.Navigate(b.url+"/console/"), chromedp.WaitVisible(chromedp.CSS(`input[name=key]`)))
	b.do("typing the key", chromedp.SetValue(chromedp.CSS(`input[name=key]`), key), chromedp.Click(chromedp.CSS(`form.signin button[type=submit]`)))
}

// labelled fails the test for every visible form control or button of
// the page without an accessible name (a label, aria-label or text).
func (b *browser) labelled(page string) {
	b.t.Helper()
	got := b.eval(`[...document.querySelectorAll('input, select, textarea, button, [role=tab]')]
		.filter((el) => el.offsetParent !== null || el.getClientRects().length)
		.filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label') && !el.getAttribute('aria-labelledby') && !el.textContent.trim() && !el.title)
		.map((el) => el.outerHTML.slice(0, 120)).join('\n')`)
	if got != "" {
		b.t.Errorf("%s: controls without an accessible name:\n%s", page, got)
	}
}

// noProblems fails the test on uncaught exceptions and CSP violations seen
// so far.
func (b *browser) noProblems() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		b.t.Errorf("page problem: %s", p)
	}
	b.problems = nil
}

func js(s string) string { return fmt.Sprintf("%q", s) }

// TestConsoleBrowser drives the console in a real headless Chromium against
// a real kiln serve (issue 16's "Must show"): sign in with a wrong and a
// right key, a sandbox made through the API shows up in the list, a
// terminal runs `echo hi`, an upload through the file browser is read back
// through the API, a Python cell draws a matplotlib chart, a kill from the
// console ends the sandbox, and a non-admin key never sees another key's
// sandbox while an admin key sees every key's. The main pages' screenshots
// are saved (see shotDir).
func TestConsoleBrowser(t *testing.T) {
	ocitest.RequireRoot(t)
	dataDir := config.FromEnv().DataDir
	for _, name := range []string{"base", "code-interpreter"} {
		_, err := template.Lookup(dataDir, name)
		ocitest.Require(t, err == nil, fmt.Sprintf("template %s not built (make setup): %v", name, err))
	}
	_, err := exec.LookPath(chromiumPath)
	ocitest.Require(t, err == nil, "chromium not installed (scripts/setup-deps.sh installs it)")
	srv := servetest.Start(t, servetest.Build(t))
	ctx := context.Background()
	runtimeName := os.Getenv("KILN_TEST_RUNTIME") // "" = the server's default (runsc)
	newKey := func(name string) (string, *client.Client) {
		k, err := srv.Client.CreateKey(ctx, api.CreateKeyRequest{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		return k.Secret, client.New(srv.URL, k.Secret)
	}
	keyA, ann := newKey("ann")
	_, bob := newKey("bob")
	// servetest kills the admin's sandboxes; these are Ann's and Bob's.
	var made []func()
	t.Cleanup(func() {
		for _, kill := range made {
			kill()
		}
	})
	create := func(c *client.Client, tmpl string) api.Sandbox {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: tmpl, Runtime: runtimeName, Timeout: 900,
			Metadata: map[string]string{"test": "console"}})
		if err != nil {
			t.Fatalf("creating a %s sandbox: %v", tmpl, err)
		}
		made = append(made, func() {
			if err := c.KillSandbox(context.Background(), sb.ID); err != nil {
				t.Errorf("killing %s: %v", sb.ID, err)
			}
		})
		return *sb
	}
	b := newBrowser(t, srv.URL)
	t.Logf("screenshots in %s", shotDir())

	// A wrong key is refused, said so, and not kept. The browser opens /,
	// which sends it to the console.
	b.do("opening /", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`input[name=key]`)))
	if got := b.eval(`location.pathname`); got != "/console/" {
		t.Errorf("/ led the browser to %q, want /console/", got)
	}
	b.do("typing a wrong key", chromedp.SetValue(chromedp.CSS(`input[name=key]`), "e2b_"+strings.Repeat("0", 40)),
		chromedp.Click(chromedp.CSS(`form.signin button[type=submit]`)))
	b.wait("the wrong key's error", `document.getElementById('signin-error').textContent.includes('refused')`, 30*time.Second)
	if got := b.eval(`String(sessionStorage.getItem('kiln.apiKey'))`); got != "null" {
		t.Errorf("a refused key was kept: %q", got)
	}
	b.shot("signin")

	// Bob's sandbox exists before Ann signs in: her list must never show it.
	bobs := create(bob, "base")
	b.signIn(keyA)
	b.wait("the sandbox list", `!!document.querySelector('#sandboxes') && document.querySelector('p.muted[aria-live]').textContent !== ''`, 30*time.Second)
	if strings.Contains(b.eval(`location.href`), keyA) {
		t.Error("the key is in the URL")
	}
	b.do("marking the page", chromedp.Evaluate[chromedp.Void](`window.kilnMark = 1`))

	// A sandbox made through the API shows up without a reload within 2 s
	// (the list polls every second), and Bob's still does not.
	sb := create(ann, "base")
	b.wait("the new sandbox in the list", fmt.Sprintf(`!!document.querySelector('tr[data-id=%s]')`, js(sb.ID)), 2*time.Second)
	if b.eval(`String(window.kilnMark)`) != "1" {
		t.Error("the list reloaded the page")
	}
	if got := b.eval(fmt.Sprintf(`String(!!document.querySelector('tr[data-id=%s]'))`, js(bobs.ID))); got != "false" {
		t.Errorf("Ann's list shows Bob's sandbox %s", bobs.ID)
	}
	b.wait("the running state and memory", fmt.Sprintf(`(() => { const r = document.querySelector('tr[data-id=%s]'); return r && r.textContent.includes('running') && r.cells[8].textContent.includes('MiB'); })()`, js(sb.ID)), 30*time.Second)
	b.shot("sandboxes")
	b.labelled("the sandbox list")

	// The sandbox's page, then its terminal: type `echo hi`, see hi.
	b.do("opening the sandbox", chromedp.Navigate(srv.URL+"/console/#/sandboxes/"+sb.ID))
	b.wait("the usage chart", `!!document.querySelector('.chart canvas') && document.querySelector('dl.facts').textContent.includes('console')`, 30*time.Second)
	b.shot("sandbox")
	b.do("opening the terminal", chromedp.Navigate(srv.URL+"/console/#/sandboxes/"+sb.ID+"/terminal"))
	b.wait("the shell's prompt", `(document.querySelector('.xterm-rows')?.textContent || '').includes('$')`, 60*time.Second)
	// The text goes in as a keyboard's input event would deliver it
	// (chromedp's synthetic key events reach xterm.js twice), then Enter.
	b.do("focusing the terminal", chromedp.Click(chromedp.CSS(`.xterm-screen`)))
	if _, err := chromedp.Call(b.ctx, input.InsertText, input.InsertTextParams{Text: "echo hi"}); err != nil {
		t.Fatal(err)
	}
	b.do("pressing Enter", chromedp.KeyEvent("\r"))
	b.wait("hi in the terminal", `[...document.querySelectorAll('.xterm-rows > div')].some((d) => d.textContent.trim() === 'hi')`, 30*time.Second)
	b.shot("terminal")
	b.labelled("the terminal")

	// Upload through the file input; read it back through the API.
	local := filepath.Join(t.TempDir(), "from-browser.txt")
	content := "uploaded by the console test\n"
	if err := os.WriteFile(local, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	b.do("opening the files", chromedp.Navigate(srv.URL+"/console/#/sandboxes/"+sb.ID+"/files"),
		chromedp.WaitVisible(chromedp.CSS(`#file-list table, #file-list p`)))
	b.do("uploading", chromedp.SetUploadFiles(chromedp.CSS(`#file-upload`), []string{local}))
	b.wait("the uploaded file in the list", `!!document.querySelector('tr[data-path="/home/user/from-browser.txt"]')`, 30*time.Second)
	var got strings.Builder
	if _, err := ann.ReadFile(ctx, sb.ID, "/home/user/from-browser.txt", &got); err != nil {
		t.Fatalf("reading the upload through the API: %v", err)
	}
	if got.String() != content {
		t.Errorf("the upload reads back as %q, want %q", got.String(), content)
	}
	b.do("viewing it", chromedp.Click(chromedp.CSS(`tr[data-path="/home/user/from-browser.txt"] button.link`)))
	b.wait("its text in the viewer", `(document.querySelector('.viewer pre')?.textContent || '') === `+js(content), 30*time.Second)
	b.shot("files")
	b.labelled("the file browser")
	// Drop a file on the drop zone (a DragEvent carrying a File, as a
	// drag from the desktop delivers it).
	b.do("dropping a file", chromedp.Evaluate[chromedp.Void](`(() => {
		const dt = new DataTransfer();
		dt.items.add(new File(['dropped on the console\n'], 'dropped.txt', { type: 'text/plain' }));
		document.getElementById('drop-zone').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true, cancelable: true }));
	})()`))
	b.wait("the dropped file in the list", `!!document.querySelector('tr[data-path="/home/user/dropped.txt"]')`, 30*time.Second)
	got.Reset()
	if _, err := ann.ReadFile(ctx, sb.ID, "dropped.txt", &got); err != nil || got.String() != "dropped on the console\n" {
		t.Errorf("the dropped file reads back as %q, %v", got.String(), err)
	}

	// A Python cell draws a matplotlib chart; an exception shows its traceback.
	ci := create(ann, "code-interpreter")
	b.do("opening the code cells", chromedp.Navigate(srv.URL+"/console/#/sandboxes/"+ci.ID+"/code"),
		chromedp.WaitVisible(chromedp.CSS(`textarea[data-cell="1"]`)))
	b.do("running a chart cell",
		chromedp.SetValue(chromedp.CSS(`textarea[data-cell="1"]`), "import matplotlib.pyplot as plt\nprint('drawing')\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"),
		chromedp.Click(chromedp.CSS(`.cell button.primary`)))
	b.wait("the chart", `(() => { const i = document.querySelector('.out img.result'); return !!i && i.src.startsWith('data:image/png;base64,') && i.complete && i.naturalWidth > 100; })()`, 120*time.Second)
	b.wait("the cell's stdout", `(document.querySelector('.out pre.stdout')?.textContent || '').includes('drawing')`, 10*time.Second)
	b.do("running a failing cell", chromedp.WaitVisible(chromedp.CSS(`textarea[data-cell="2"]`)),
		chromedp.SetValue(chromedp.CSS(`textarea[data-cell="2"]`), "1 / 0"),
		chromedp.Click(chromedp.CSS(`.cell:nth-child(2) button.primary`)))
	b.wait("the traceback", `(document.querySelector('.out pre.traceback')?.textContent || '').includes('ZeroDivisionError')`, 60*time.Second)
	b.do("running a DataFrame cell", chromedp.WaitVisible(chromedp.CSS(`textarea[data-cell="3"]`)),
		chromedp.SetValue(chromedp.CSS(`textarea[data-cell="3"]`), "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"),
		chromedp.Click(chromedp.CSS(`.cell:nth-child(3) button.primary`)))
	b.wait("the table in a sandboxed frame", `(() => { const f = document.querySelector('.cell:nth-child(3) iframe.html'); return !!f && f.getAttribute('sandbox') === '' && f.srcdoc.includes('<table'); })()`, 60*time.Second)
	b.labelled("the code cells")
	b.shot("code")

	// A template build from a Dockerfile, its log followed live to ready.
	b.do("opening the templates", chromedp.Navigate(srv.URL+"/console/#/templates"),
		chromedp.WaitVisible(chromedp.CSS(`textarea[name=dockerfile-text]`)))
	b.do("starting a build",
		chromedp.SetValue(chromedp.CSS(`input[name=template]`), "console-test:v1"),
		chromedp.SetValue(chromedp.CSS(`textarea[name=dockerfile-text]`), "FROM base\nENV MADE_BY=console\nRUN echo built by the console > /tmp/console.txt\n"),
		chromedp.Click(chromedp.CSS(`form.card button.primary`)))
	b.wait("the build's page", `location.hash.startsWith('#/templates/builds/')`, 30*time.Second)
	b.wait("the build ready", `document.getElementById('step-text')?.textContent === 'ready' && document.querySelector('.head .badge')?.textContent === 'ready'`, 5*time.Minute)
	if got := b.eval(`(() => { const p = document.querySelector('progress'); return p.value + '/' + p.max + ' ' + document.getElementById('build-log').textContent.includes('[2/2] RUN echo built by the console'); })()`); got != "2/2 true" {
		t.Errorf("the build's progress and log: %s, want 2/2 and the RUN step's line", got)
	}
	buildID := strings.TrimPrefix(b.eval(`location.hash`), "#/templates/builds/")
	if bu, err := ann.TemplateBuild(ctx, buildID); err != nil || bu.Status != api.BuildReady || bu.Template != "console-test" || bu.Steps != 2 {
		t.Errorf("the console's build %s: %+v, %v", buildID, bu, err)
	}
	b.shot("build")

	// Kill from the console (confirmed in the dialog): the API says it is
	// stopped and the list no longer shows it.
	b.do("opening the sandbox", chromedp.Navigate(srv.URL+"/console/#/sandboxes/"+sb.ID))
	b.wait("the actions", `!!document.querySelector('.actions button.danger:not([disabled])')`, 30*time.Second)
	b.do("killing", chromedp.Click(chromedp.CSS(`.actions button.danger`)), chromedp.WaitVisible(chromedp.CSS(`#confirm`)),
		chromedp.Click(chromedp.CSS(`#confirm-ok`)))
	b.wait("the stopped state", `(document.querySelector('.head .badge')?.textContent || '') === 'stopped'`, 60*time.Second)
	b.wait("the reason it ended", `document.querySelector('main [role=alert]')?.textContent.includes('killed')`, 30*time.Second)
	if got, err := ann.GetSandbox(ctx, sb.ID); err != nil || got.State != "stopped" {
		t.Errorf("after the console's kill the API says %+v, %v; want stopped", got.State, err)
	}
	b.do("opening the list", chromedp.Navigate(srv.URL+"/console/#/sandboxes"))
	b.wait("the list", fmt.Sprintf(`!!document.querySelector('tr[data-id=%s]')`, js(ci.ID)), 30*time.Second)
	if got := b.eval(fmt.Sprintf(`String(!!document.querySelector('tr[data-id=%s]'))`, js(sb.ID))); got != "false" {
		t.Error("the killed sandbox is still in the list of live sandboxes")
	}

	// Sign out; the admin key sees every key's sandboxes with "All keys",
	// and the keys, templates and health pages.
	b.do("signing out", chromedp.Click(chromedp.CSS(`#logout`)), chromedp.WaitVisible(chromedp.CSS(`input[name=key]`)))
	if got := b.eval(`String(sessionStorage.getItem('kiln.apiKey'))`); got != "null" {
		t.Errorf("the key survived sign-out: %q", got)
	}
	b.signIn(srv.Key)
	b.wait("the admin's list", `!!document.querySelector('#f-all') && !document.getElementById('nav-keys').hidden`, 30*time.Second)
	b.do("all keys", chromedp.Click(chromedp.CSS(`#f-all`)))
	b.wait("Ann's and Bob's sandboxes", fmt.Sprintf(`!!document.querySelector('tr[data-id=%s]') && !!document.querySelector('tr[data-id=%s]')`, js(ci.ID), js(bobs.ID)), 30*time.Second)
	b.shot("sandboxes-admin")
	b.do("the keys page", chromedp.Navigate(srv.URL+"/console/#/keys"))
	b.wait("Ann's key", `document.querySelector('table')?.textContent.includes('ann')`, 30*time.Second)
	b.shot("keys")
	b.labelled("the keys page")
	b.do("the templates page", chromedp.Navigate(srv.URL+"/console/#/templates"))
	b.wait("the built-ins", `document.querySelector('table')?.textContent.includes('code-interpreter')`, 30*time.Second)
	b.shot("templates")
	b.labelled("the templates page")
	b.do("the health page", chromedp.Navigate(srv.URL+"/console/#/health"))
	b.wait("the version, runtimes, capacity and sandboxes", `(() => { const t = document.querySelector('dl.facts')?.textContent || ''; return t.includes('running') && t.includes('runsc (default)') && !!document.querySelector('dl.facts meter'); })()`, 30*time.Second)
	b.shot("health")

	// Phone width: the list still fits.
	b.do("phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(srv.URL+"/console/#/sandboxes?owner=*"))
	b.wait("the list at phone width", `!!document.querySelector('#sandboxes tbody tr')`, 30*time.Second)
	if got := b.eval(`String(document.documentElement.scrollWidth <= window.innerWidth + 1)`); got != "true" {
		t.Errorf("the page is wider than a phone's screen: %s", b.eval(`document.documentElement.scrollWidth + ' > ' + window.innerWidth`))
	}
	b.shot("sandboxes-phone")
	b.noProblems()
}

// TestConsoleDockerfile compiles Dockerfiles with the console's compiler
// (in the page, served by console.Serve alone: no sandbox needed) and the
// CLI's (internal/template/dockerfile): the same recipe for what the
// console supports, and a refusal naming the line for what it leaves to
// the CLI.
func TestConsoleDockerfile(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := console.Serve(w, r); err != nil {
			http.NotFound(w, r)
		}
	}))
	defer ts.Close()
	b := newBrowser(t, ts.URL)
	b.do("opening the console", chromedp.Navigate(ts.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS(`input[name=key]`)))
	isTemplate := func(n string) bool { return n == "base" || n == "code-interpreter" }
	for _, src := range []string{
		"FROM base\nRUN apt-get update && apt-get install -y cowsay\n",
		"# a comment\nFROM code-interpreter:default AS app\nENV MODE=prod DEBUG=0\nWORKDIR /srv\nWORKDIR app/../web\nUSER user\n" +
			"RUN [\"echo\", \"hi there\", \"it's\"]\nEXPOSE 8080\nCMD [\"python3\", \"-m\", \"http.server\"]\n",
		"FROM python:3.12-slim\nENV PATH=/opt/bin:$PATH A=\"two words\" B='lit $x' C=${A}-x\nENV GREETING hello   world\n" +
			"RUN pip install \\\n    requests \\\n    # a comment line\n    numpy\nENTRYPOINT [\"/bin/tini\", \"--\"]\nCMD python3 app.py\n",
		"FROM docker.io/library/debian:12\nENTRYPOINT python3 -m http.server 8000\nCMD [\"ignored\"]\n",
	} {
		want, _, err := dockerfile.Compile([]byte(src), dockerfile.Options{IsTemplate: isTemplate})
		if err != nil {
			t.Fatalf("the CLI refuses %q: %v", src, err)
		}
		out := b.eval(`import('/console/js/dockerfile.js').then((m) => { try { return JSON.stringify(m.compileDockerfile(` + js(src) +
			`, (n) => ['base', 'code-interpreter'].includes(n))); } catch (e) { return 'ERROR ' + e.message; } })`)
		var got api.TemplateSpec
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Errorf("the console's compiler on %q: %s", src, out)
			continue
		}
		if diff := cmp.Diff(want, &got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("the console's and the CLI's recipes of %q differ (-CLI +console):\n%s", src, diff)
		}
	}
	for src, line := range map[string]string{
		"FROM base\nCOPY . /app\n":       "Dockerfile:2",
		"FROM base\nARG V=1\nRUN echo\n": "Dockerfile:2",
		"RUN echo\n":                     "Dockerfile:1",
		"FROM scratch\n":                 "Dockerfile:1",
	} {
		out := b.eval(`import('/console/js/dockerfile.js').then((m) => { try { return JSON.stringify(m.compileDockerfile(` + js(src) +
			`, () => true)); } catch (e) { return 'ERROR ' + e.message; } })`)
		if !strings.HasPrefix(out, "ERROR "+line+":") {
			t.Errorf("the console's compiler on %q: %s, want an error at %s", src, out, line)
		}
	}
}
