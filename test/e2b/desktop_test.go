package e2b_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/servetest"
)

// chromiumPath is Debian's chromium (scripts/setup-deps.sh installs it).
const chromiumPath = "/usr/bin/chromium"

// TestDesktopSDK drives the desktop template with the stock E2B desktop
// SDK (the desktop/ project: @e2b/desktop, pinned) against a real kiln
// serve on HTTPS, so that the stream URLs the SDK makes (always https://)
// are used as they are: desktop/desktop.test.mjs creates a desktop, takes
// screenshots, moves and clicks the mouse, types, opens files and URLs,
// launches applications, looks windows up and starts the stream; each
// stream URL is loaded here in a real headless Chromium, which must see
// noVNC connect and draw the desktop (and, with requireAuth, connect only
// with the auth key). The template (and its warm snapshot for this
// build) is built first when missing.
func TestDesktopSDK(t *testing.T) {
	ocitest.RequireRoot(t)
	requireNode(t)
	_, err := exec.LookPath(chromiumPath)
	ocitest.Require(t, err == nil, "chromium not installed (scripts/setup-deps.sh installs it)")
	kiln := servetest.Build(t)
	servetest.Builtin(t, kiln, "desktop")
	srv := servetest.StartWith(t, kiln, servetest.Options{TLS: true})
	dir, err := filepath.Abs("desktop")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, dir)
	b := newStreamBrowser(t, srv.CAFile)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test-reporter=spec", "desktop.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(sdkEnv(dir, srv), "NODE_EXTRA_CA_CERTS="+srv.CAFile, "KILN_TEST_BROWSER=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			t.Log(line)
			if check, ok := strings.CutPrefix(line, "kiln-check: stream "); ok {
				f := strings.Fields(check)
				verdict := "malformed check: " + check
				if len(f) == 2 {
					verdict = b.checkStream(f[0], f[1])
				}
				t.Logf("browser: %s", verdict)
				fmt.Fprintln(stdin, verdict)
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err = cmd.Wait()
	pw.Close()
	<-done
	if ctx.Err() != nil {
		t.Fatalf("the desktop tests did not finish in time")
	}
	if err != nil {
		t.Fatalf("node desktop.test.mjs: %v (the failures are above)", err)
	}
	if ids := srv.Alive(t); len(ids) > 0 {
		t.Errorf("sandboxes left after the desktop tests: %v", ids)
	}
}

// streamBrowser is a headless Chromium that trusts the server's
// certificate (and no other that is not trusted already).
type streamBrowser struct {
	t   *testing.T
	ctx context.Context
	n   int // stream checks made
	dir string
}

func newStreamBrowser(t *testing.T, certFile string) *streamBrowser {
	t.Helper()
	pemBytes, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemBytes)
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	spki := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("ignore-certificate-errors-spki-list", base64.StdEncoding.EncodeToString(spki[:])),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	dir, err := os.MkdirTemp("", "kiln-desktop-stream-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stream screenshots: %s", dir)
	return &streamBrowser{t: t, ctx: ctx, dir: dir}
}

// checkStream loads the stream page url in a new tab and returns "ok"
// once noVNC has connected and its canvas shows the desktop (not blank),
// else what it saw. Unless noKey is "-", it then loads noKey (the page
// without the auth key), which must ask for a password and not connect,
// and noKey with a wrong password, which must fail.
func (b *streamBrowser) checkStream(url, noKey string) string {
	b.n++
	tab, closeTab := chromedp.NewContext(b.ctx)
	defer closeTab()
	ctx, cancel := context.WithTimeout(tab, 90*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		return fmt.Sprintf("loading %s: %v", url, err)
	}
	status := func() string {
		s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.getElementById('noVNC_status') || {}).textContent || ''`))
		return s
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.documentElement.classList.contains('noVNC_connected')`,
		chromedp.WithPollingTimeout(45*time.Second), chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		return fmt.Sprintf("noVNC did not connect (status %q): %v", status(), err)
	}
	connected := time.Since(t0)
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		shot, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS(`#noVNC_container canvas`)))
		if err != nil {
			last = "screenshot of the canvas: " + err.Error()
			continue
		}
		img, err := png.Decode(bytes.NewReader(shot))
		if err != nil {
			last = "decoding the canvas screenshot: " + err.Error()
			continue
		}
		colours, dominant := imageStats(img)
		last = fmt.Sprintf("the canvas is blank: %d colours, %.1f%% one colour", colours, 100*dominant)
		if colours >= 16 && dominant <= 0.99 {
			path := filepath.Join(b.dir, fmt.Sprintf("stream-%d.png", b.n))
			_ = os.WriteFile(path, shot, 0o644)
			b.t.Logf("stream %d: connected in %s, drawn in %s (%dx%d, %d colours, %.1f%% one colour): %s",
				b.n, connected.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond),
				img.Bounds().Dx(), img.Bounds().Dy(), colours, 100*dominant, path)
			last = ""
			break
		}
	}
	if last != "" {
		return last
	}
	if noKey == "-" {
		return "ok"
	}
	if v := b.refused(noKey, `document.getElementById('noVNC_credentials_dlg').classList.contains('noVNC_open')`); v != "" {
		return "without the auth key: " + v
	}
	if v := b.refused(noKey+"&password=wrongpassword123", `/fail/i.test(document.getElementById('noVNC_status').textContent)`); v != "" {
		return "with a wrong auth key: " + v
	}
	return "ok"
}

// refused loads url in a new tab and returns "" once the JavaScript
// condition refusal holds and noVNC is not connected, else what it saw.
func (b *streamBrowser) refused(url, refusal string) string {
	tab, closeTab := chromedp.NewContext(b.ctx)
	defer closeTab()
	ctx, cancel := context.WithTimeout(tab, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		return fmt.Sprintf("loading %s: %v", url, err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](refusal,
		chromedp.WithPollingTimeout(30*time.Second), chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		return fmt.Sprintf("noVNC never refused (%s): %v", refusal, err)
	}
	connected, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.classList.contains('noVNC_connected')`))
	if err != nil || connected {
		return fmt.Sprintf("noVNC connected (%v)", err)
	}
	return ""
}

// imageStats returns how many distinct colours img has and the share of
// its pixels that have the most common one.
func imageStats(img image.Image) (colours int, dominant float64) {
	counts := map[[3]uint32]int{}
	r := img.Bounds()
	top := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			cr, cg, cb, _ := img.At(x, y).RGBA()
			k := [3]uint32{cr >> 8, cg >> 8, cb >> 8}
			counts[k]++
			top = max(top, counts[k])
		}
	}
	return len(counts), float64(top) / float64(r.Dx()*r.Dy())
}
