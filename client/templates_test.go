package client_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// TestTemplateBuildLogs: pings are skipped, entries passed on in order, and
// an error event ends the stream as *client.Error.
func TestTemplateBuildLogs(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/templates/builds/b1/logs" || r.URL.Query().Get("offset") != "2" || r.URL.Query().Get("follow") != "true" {
			t.Errorf("request %s", r.URL)
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprint(w, `{"time":"2026-01-01T00:00:00Z","level":"info","step":0,"message":"[1/1] RUN echo hi"}`+"\n")
		fmt.Fprint(w, `{"type":"ping","seq":0,"time":"2026-01-01T00:00:01Z"}`+"\n")
		fmt.Fprint(w, `{"time":"2026-01-01T00:00:02Z","level":"info","step":0,"message":"hi","output":true}`+"\n")
		fmt.Fprint(w, `{"type":"error","seq":0,"time":"2026-01-01T00:00:03Z","error":{"code":"unavailable","message":"server is shutting down"}}`+"\n")
	})
	var got []api.TemplateLogEntry
	err := c.TemplateBuildLogs(context.Background(), "b1", 2, true, func(e api.TemplateLogEntry) error { got = append(got, e); return nil })
	if !client.IsCode(err, api.CodeUnavailable) {
		t.Errorf("err %v, want the error event's unavailable", err)
	}
	if len(got) != 2 || got[0].Message != "[1/1] RUN echo hi" || got[0].Output || !got[1].Output || got[1].Message != "hi" {
		t.Errorf("entries %+v", got)
	}
}

// TestTemplateFilesExist: 200 is true, 404 false, anything else an error.
func TestTemplateFilesExist(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   bool
		err    bool
	}{{200, true, false}, {404, false, false}, {400, false, true}} {
		c := fake(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodHead {
				t.Errorf("method %s", r.Method)
			}
			w.WriteHeader(tc.status)
		})
		ok, err := c.TemplateFilesExist(context.Background(), "aa")
		if ok != tc.want || (err != nil) != tc.err {
			t.Errorf("status %d: %v, %v", tc.status, ok, err)
		}
	}
}
