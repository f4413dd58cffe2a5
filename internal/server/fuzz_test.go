package server

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/apikey"
	"github.com/kiln-sh/kiln/internal/edge"
	"github.com/kiln-sh/kiln/internal/errdefs"
)

// The fuzz targets run their seeds as unit tests; `go test -fuzz` explores
// further. Decoders must never panic, and must either refuse input as
// invalid_argument or produce values within the documented bounds.

func FuzzCreateSandboxBody(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"template":"base","runtime":"runc","timeout":60}`,
		`{"limits":{"cpus":0.5,"memory_bytes":268435456,"disk_bytes":1073741824,"pids":64}}`,
		`{"timeout":-1}`, `{"timeout":9223372036854775807}`, `{"limits":{"cpus":-1}}`,
		`{"env":{"A":"1"},"metadata":{"k":"v"}}`, `{"x":1}`, `[]`, `null`, `{"timeout":1e400}`, ``,
	} {
		f.Add([]byte(s))
	}
	s := New(Options{})
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.CreateSandboxRequest
		if err := decodeBody(strings.NewReader(string(body)), &req); err != nil {
			mustBeInvalid(t, err)
			return
		}
		opts, err := s.createOptions(apikey.Key{ID: "key_1"}, req)
		if err != nil {
			mustBeInvalid(t, err)
			return
		}
		if opts.Timeout < 0 || opts.Timeout > s.cfg.Limits.MaxSandboxTimeout || opts.Owner != "key_1" {
			t.Fatalf("options out of bounds: %+v", opts)
		}
		if opts.Limits.CPUs < 0 || opts.Limits.MemoryBytes < 0 || opts.Limits.DiskBytes < 0 || opts.Limits.Pids < 0 {
			t.Fatalf("negative limits passed: %+v", opts.Limits)
		}
		if opts.Quota.MaxSandboxes <= 0 || opts.Quota.MaxMemoryBytes <= 0 {
			t.Fatalf("no quota: %+v", opts.Quota)
		}
	})
}

func FuzzCommandBody(f *testing.F) {
	for _, s := range []string{
		`{"cmd":"echo hi"}`, `{"args":["ls","-l"],"cwd":"/tmp","user":"root","timeout":1.5}`,
		`{"cmd":"sh","pty":{"cols":80,"rows":24},"stdin":true,"background":true}`,
		`{"cmd":"x","timeout":-1}`, `{"cmd":"x","timeout":1e308}`, `{"cmd":"x","output_limit":-5}`,
		`{"args":[""]}`, `{"args":["a"],"cmd":"b"}`, `{"cmd":"x","env":{"KILN_A":"1"}}`,
		`{"cmd":"x","user":"nobody"}`, `{"cmd":"x","pty":{"cols":0,"rows":1}}`, `{"cmd":"x","timeout":0.0001}`,
	} {
		f.Add([]byte(s))
	}
	s := New(Options{})
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.CommandRequest
		if err := decodeBody(strings.NewReader(string(body)), &req); err != nil {
			mustBeInvalid(t, err)
			return
		}
		p, err := s.execParams(req)
		if err != nil {
			mustBeInvalid(t, err)
			return
		}
		l := s.cfg.Limits
		switch {
		case (len(p.Args) == 0) == (p.Cmd == ""):
			t.Fatalf("args %q and cmd %q", p.Args, p.Cmd)
		case p.TimeoutMs <= 0 || time.Duration(p.TimeoutMs)*time.Millisecond > l.MaxCommandTimeout:
			t.Fatalf("timeout %d ms", p.TimeoutMs)
		case p.OutputLimit <= 0 || p.OutputLimit > l.MaxOutputBytes:
			t.Fatalf("output limit %d", p.OutputLimit)
		case p.User != "user" && p.User != "root":
			t.Fatalf("user %q", p.User)
		case p.PTY != nil && (p.PTY.Cols == 0 || p.PTY.Rows == 0):
			t.Fatalf("pty %+v", p.PTY)
		}
	})
}

func FuzzQuery(f *testing.F) {
	for _, s := range []string{
		"", "state=running&state=stopped", "metadata.a=b&metadata.c=d&limit=10", "limit=0", "limit=-1",
		"limit=99999999999999999999", "state=bogus", "page_token=abc", "foo=1", "metadata.=x", "limit=1&limit=2",
		"path=/tmp&user=root&depth=3", "path=&user=x", "path=a%00b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		if flt, err := listFilter(q); err != nil {
			mustBeInvalid(t, err)
		} else if flt.Limit < 0 || flt.Limit > 1000 || len(flt.Token) > 512 {
			t.Fatalf("filter out of bounds: %+v", flt)
		}
		if p, err := pathParams(q); err != nil {
			mustBeInvalid(t, err)
		} else if p.Path == "" || strings.ContainsRune(p.Path, 0) || (p.User != "user" && p.User != "root") {
			t.Fatalf("path params %+v", p)
		}
		if d, err := intParam(q, "depth", 1, 1, 64); err == nil && (d < 1 || d > 64) {
			t.Fatalf("depth %d", d)
		}
		if m, err := modeParam(q.Get("mode")); err == nil && m > 0o7777 {
			t.Fatalf("mode %o", m)
		}
	})
}

func mustBeInvalid(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("error %v is not invalid_argument", err)
	}
	if edge.Code(err) != api.CodeInvalidArgument {
		t.Fatalf("error %v maps to %s", err, edge.Code(err))
	}
}
