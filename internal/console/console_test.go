package console

import (
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/errdefs"
)

// TestServe: files under Prefix, index.html for the bare prefix, the
// security headers on every answer, and nothing outside the assets
// however the path is spelt.
func TestServe(t *testing.T) {
	for _, tc := range []struct {
		path, ctype string
		found       bool
	}{
		{"/console/", "text/html; charset=utf-8", true},
		{"/console/index.html", "text/html; charset=utf-8", true},
		{"/console/style.css", "text/css; charset=utf-8", true},
		{"/console/js/api.js", "text/javascript; charset=utf-8", true},
		{"/console/vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8", true},
		{"/console/../console.go", "", false},
		{"/console/../../go.mod", "", false},
		{"/console/..%2fconsole.go", "", false},
		{"/console/js/../../console.go", "", false},
		{"/console/nope.js", "", false},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.URL.Path = tc.path
		err := Serve(w, r)
		if !tc.found {
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("%s: err %v, want not found", tc.path, err)
			}
			continue
		}
		if err != nil || w.Code != http.StatusOK {
			t.Errorf("%s: %d, %v", tc.path, w.Code, err)
			continue
		}
		if got := w.Header().Get("Content-Type"); got != tc.ctype {
			t.Errorf("%s: Content-Type %q, want %q", tc.path, got, tc.ctype)
		}
		for _, h := range []string{"Content-Security-Policy", "X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy"} {
			if w.Header().Get(h) == "" {
				t.Errorf("%s: no %s header", tc.path, h)
			}
		}
	}
}

// TestCSPStrict: the policy allows scripts only from the console's own
// files: no inline script, no eval, no other origin.
func TestCSPStrict(t *testing.T) {
	directives := map[string]string{}
	for _, d := range strings.Split(CSP, ";") {
		f := strings.Fields(d)
		directives[f[0]] = strings.Join(f[1:], " ")
	}
	if directives["script-src"] != "'self'" {
		t.Errorf("script-src %q, want only 'self'", directives["script-src"])
	}
	for _, d := range []string{"default-src", "object-src", "base-uri", "frame-ancestors"} {
		if v := directives[d]; v != "'none'" {
			t.Errorf("%s %q, want 'none'", d, v)
		}
	}
	if directives["connect-src"] != "'self'" {
		t.Errorf("connect-src %q, want 'self'", directives["connect-src"])
	}
}

// TestNoInlineScript: the pages and modules work under the CSP: every
// <script> has a src, no element has an on* attribute, no javascript: URL,
// and the modules build no markup from strings (innerHTML and the like)
// nor run strings as code.
func TestNoInlineScript(t *testing.T) {
	inline := regexp.MustCompile(`(?i)<script(\s[^>]*)?>`)
	handler := regexp.MustCompile(`(?i)\son[a-z]+\s*=`)
	unsafe := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function\(|javascript:`)
	err := fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "vendor/") {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		s := string(b)
		switch {
		case strings.HasSuffix(p, ".html"):
			for _, m := range inline.FindAllStringSubmatch(s, -1) {
				if !strings.Contains(m[1], "src=") {
					t.Errorf("%s: inline <script>: %s", p, m[0])
				}
			}
			if m := handler.FindString(s); m != "" {
				t.Errorf("%s: inline event handler %q", p, m)
			}
		case strings.HasSuffix(p, ".js"):
			if m := unsafe.FindString(s); m != "" {
				t.Errorf("%s: uses %s", p, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
