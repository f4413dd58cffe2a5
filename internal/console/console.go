// Package console is Kiln's web console: a few static pages, embedded in
// the binary, that kiln serve answers under /console/. Everything the
// console shows or does goes through the public API (api/openapi.yaml)
// with the API key the user signs in with, which the page keeps in
// sessionStorage and sends as a header, never in a URL. So this package
// holds no state and sees no key: it serves files, with a strict
// Content-Security-Policy, and sends browsers that open / to the console.
//
// The only third-party code is xterm.js and uPlot, copied from their locked
// npm packages into assets/vendor by `make console-vendor` and committed
// (vendor_test.go checks the copies).
package console

import (
	"embed"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// Prefix is where the console lives.
const Prefix = "/console/"

//go:embed assets
var embedded embed.FS

// files is the assets directory.
var files = mustSub(embedded, "assets")

func mustSub(f fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return sub
}

// CSP is the Content-Security-Policy of every console response: scripts
// and styles only from the console's own files (no inline script, no
// eval), API calls only to this server, images from the server and from
// data:/blob: URLs the page makes (PNG results, file previews), no
// plugins, no framing of the console. Inline styles are allowed because
// xterm.js and uPlot position their elements with style attributes and
// xterm.js writes its theme into a <style> element; code results' HTML
// is shown in sandboxed iframes without scripts.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; frame-src 'self' blob:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'"

// Serve answers GET and HEAD under Prefix with the console's files; a
// path without one is the console's page (index.html), whose views are
// URL fragments. A missing file wraps errdefs.ErrNotFound.
func Serve(w http.ResponseWriter, r *http.Request) error {
	name := strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(r.URL.Path, Prefix)), "/")
	if name == "" || name == "." {
		name = "index.html"
	}
	b, err := fs.ReadFile(files, name)
	if err != nil {
		return fmt.Errorf("no console file %q: %w", errdefs.ClipN(name, 64), errdefs.ErrNotFound)
	}
	h := w.Header()
	setHeaders(h)
	ct := mime.TypeByExtension(path.Ext(name))
	if ct == "" {
		ct = "application/octet-stream"
	}
	h.Set("Content-Type", ct)
	// The files change only with the binary; revalidating costs little
	// and never serves a stale page after an upgrade.
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(b)
	}
	return nil
}

func setHeaders(h http.Header) {
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// Root wraps the handler of unknown routes: a browser's GET / (it accepts
// text/html) is sent to the console; everything else, API clients' GET /
// among it, goes to next as before.
func Root(next func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
			strings.Contains(r.Header.Get("Accept"), "text/html") {
			http.Redirect(w, r, Prefix, http.StatusFound)
			return nil
		}
		return next(w, r)
	}
}
