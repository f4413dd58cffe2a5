package e2b_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kiln-sh/kiln/internal/e2b"
)

func TestClusterRouting(t *testing.T) {
	for _, tc := range []struct {
		path   string
		id     string
		ok     bool
		create bool
	}{
		{"/sandboxes/abcdefgh12", "abcdefgh12", true, false},
		{"/sandboxes/abcdefgh12/timeout", "abcdefgh12", true, false},
		{"/v2/sandboxes/abcdefgh12/connect", "abcdefgh12", true, false},
		{"/sandboxes/metrics", "", false, false},
		{"/sandboxes", "", false, true},
		{"/v2/sandboxes", "", false, true},
		{"/sandboxes/", "", false, false},
		{"/templates/abcdefgh12", "", false, false},
	} {
		id, ok := e2b.SandboxOfPath(tc.path)
		if id != tc.id || ok != tc.ok {
			t.Errorf("SandboxOfPath(%q) = %q, %v; want %q, %v", tc.path, id, ok, tc.id, tc.ok)
		}
		if got := e2b.IsCreate(httptest.NewRequest("POST", tc.path, nil)); got != tc.create {
			t.Errorf("IsCreate(POST %s) = %v, want %v", tc.path, got, tc.create)
		}
	}
	if e2b.IsCreate(httptest.NewRequest("GET", "/sandboxes", nil)) {
		t.Error("IsCreate(GET /sandboxes) = true")
	}

	for _, tc := range []struct {
		path        string
		id          string
		content, ok bool
	}{
		{"/volumes/vol123", "vol123", false, true},
		{"/volumecontent/vol123/file", "vol123", true, true},
		{"/volumes", "", false, false},
		{"/volumes/", "", false, false},
		{"/volumes/a/b", "", false, false},
		{"/volumecontent/", "", false, false},
	} {
		id, content, ok := e2b.VolumeOfPath(tc.path)
		if id != tc.id || content != tc.content || ok != tc.ok {
			t.Errorf("VolumeOfPath(%q) = %q, %v, %v; want %q, %v, %v", tc.path, id, content, ok, tc.id, tc.content, tc.ok)
		}
	}

	for _, tc := range []struct {
		method, path, tmpl, build string
		route                     e2b.TemplateRoute
	}{
		{"POST", "/v3/templates", "", "", e2b.TemplateNew},
		{"GET", "/v3/templates", "", "", e2b.NotTemplate},
		{"POST", "/v2/templates/site/builds/b1", "site", "b1", e2b.TemplateStart},
		{"GET", "/templates/site/builds/b1/status", "site", "b1", e2b.TemplateStatus},
		{"GET", "/templates/site/files/" + strings.Repeat("a", 64), "site", "", e2b.TemplateFileAsk},
		{"PUT", "/templates/site/files/" + strings.Repeat("a", 64), "site", "", e2b.TemplateFilePut},
		{"DELETE", "/templates/site/files/" + strings.Repeat("a", 64), "", "", e2b.NotTemplate},
		{"GET", "/templates/site/tags", "", "", e2b.NotTemplate},
		{"GET", "/templates/aliases/site", "", "", e2b.NotTemplate},
		{"GET", "/templates/tags", "", "", e2b.NotTemplate},
		{"DELETE", "/templates/site", "site", "", e2b.TemplateItself},
		{"GET", "/templates", "", "", e2b.NotTemplate},
		{"GET", "/templates/", "", "", e2b.NotTemplate},
		{"GET", "/templates/site/builds/b1", "", "", e2b.NotTemplate},
	} {
		route, tmpl, build := e2b.TemplateRouteOf(httptest.NewRequest(tc.method, tc.path, nil))
		if route != tc.route || tmpl != tc.tmpl || build != tc.build {
			t.Errorf("TemplateRouteOf(%s %s) = %v, %q, %q; want %v, %q, %q", tc.method, tc.path, route, tmpl, build, tc.route, tc.tmpl, tc.build)
		}
	}
	for _, tc := range []struct {
		host, domain string
		under        bool
	}{
		{"nosandbox.localhost:8420", "localhost:8420", true},
		{"8000-abc.sandboxes.example.com", "sandboxes.example.com", true},
		{"localhost:8420", "localhost:8420", false},
		{"api.example.com", "sandboxes.example.com", false},
		{"x.localhost", "", false},
	} {
		if got := e2b.UnderDomain(tc.host, tc.domain); got != tc.under {
			t.Errorf("UnderDomain(%q, %q) = %v, want %v", tc.host, tc.domain, got, tc.under)
		}
	}

	r := httptest.NewRequest("GET", "/health", nil)
	r.Header.Set("E2b-Sandbox-Id", "abcdefgh12")
	r.Header.Set("E2b-Sandbox-Port", "49983")
	if id, port, ok := e2b.Target(r); id != "abcdefgh12" || port != 49983 || !ok {
		t.Errorf("Target(headers) = %q, %d, %v", id, port, ok)
	}
	r = httptest.NewRequest("GET", "/health", nil)
	r.Host = "8080-abcdefgh12.sandboxes.example.com:443"
	if id, port, ok := e2b.Target(r); id != "abcdefgh12" || port != 8080 || !ok {
		t.Errorf("Target(host) = %q, %d, %v", id, port, ok)
	}
	e2b.RouteByHeaders(r, "abcdefgh12", 8080)
	if r.Header.Get("E2b-Sandbox-Id") != "abcdefgh12" || r.Header.Get("E2b-Sandbox-Port") != "8080" {
		t.Errorf("RouteByHeaders set %v", r.Header)
	}
	if _, _, ok := e2b.Target(httptest.NewRequest("GET", "/v2/sandboxes", nil)); ok {
		t.Error("Target(control plane) ok")
	}
}
