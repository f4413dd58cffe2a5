package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

const testKey = "e2b_0123456789abcdef0123456789abcdef01234567"

// fake serves h and returns a client for it.
func fake(t *testing.T, h http.HandlerFunc) *client.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return client.New(srv.URL+"/", testKey)
}

// writeEvents writes evs as an NDJSON stream, flushing each.
func writeEvents(w http.ResponseWriter, evs ...api.Event) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, ev := range evs {
		enc.Encode(ev)
		w.(http.Flusher).Flush()
	}
}

// seen is what the fake server received.
type seen struct {
	Method, Path, Query, Body, Auth, ContentType string
}

// TestRoutes checks that every method sends the right request, with the
// key, and decodes the answer.
func TestRoutes(t *testing.T) {
	ctx := context.Background()
	sb := api.Sandbox{ID: "sbx_1", Template: "base", State: "running"}
	fi := api.FileInfo{Name: "a", Path: "/home/user/a", Type: api.FileRegular, Size: 3}
	tests := []struct {
		name   string
		status int
		answer any // JSON-encoded; nil: no body
		call   func(c *client.Client) (any, error)
		want   seen
		result any
	}{
		{"create", 201, sb, func(c *client.Client) (any, error) {
			return c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "py", Timeout: 60})
		}, seen{Method: "POST", Path: "/v1/sandboxes", Body: `{"template":"py","timeout":60}`}, &sb},
		{"get", 200, sb, func(c *client.Client) (any, error) { return c.GetSandbox(ctx, "sbx_1") },
			seen{Method: "GET", Path: "/v1/sandboxes/sbx_1"}, &sb},
		{"list", 200, api.SandboxList{Sandboxes: []api.Sandbox{sb}, NextPageToken: "t2"}, func(c *client.Client) (any, error) {
			return c.ListSandboxes(ctx, client.ListFilter{States: []string{"running", "paused"}, Metadata: map[string]string{"job": "x"}, Limit: 5, PageToken: "t1"})
		}, seen{Method: "GET", Path: "/v1/sandboxes", Query: "limit=5&metadata.job=x&page_token=t1&state=running&state=paused"},
			&api.SandboxList{Sandboxes: []api.Sandbox{sb}, NextPageToken: "t2"}},
		{"kill", 204, nil, func(c *client.Client) (any, error) { return nil, c.KillSandbox(ctx, "sbx_1") },
			seen{Method: "DELETE", Path: "/v1/sandboxes/sbx_1"}, nil},
		{"timeout", 200, sb, func(c *client.Client) (any, error) {
			return c.SetTimeout(ctx, "sbx_1", 90*time.Second+time.Millisecond)
		},
			seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/timeout", Body: `{"timeout":91}`}, &sb},
		{"fork", 201, api.ForkResponse{Sandboxes: []api.Sandbox{sb, sb}}, func(c *client.Client) (any, error) { return c.Fork(ctx, "sbx_1", 2) },
			seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/fork", Body: `{"count":2}`}, []api.Sandbox{sb, sb}},
		{"usage", 200, api.Usage{Pids: 3}, func(c *client.Client) (any, error) { return c.Usage(ctx, "sbx_1") },
			seen{Method: "GET", Path: "/v1/sandboxes/sbx_1/usage"}, &api.Usage{Pids: 3}},
		{"start", 202, api.CommandStarted{PID: 7}, func(c *client.Client) (any, error) {
			return c.Start(ctx, "sbx_1", api.CommandRequest{Args: []string{"sleep", "9"}})
		}, seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/commands", Body: `{"args":["sleep","9"],"background":true}`}, 7},
		{"output", 200, api.CommandResult{PID: 8, Stdout: "hi\n"}, func(c *client.Client) (any, error) {
			return c.Output(ctx, "sbx_1", api.CommandRequest{Cmd: "echo hi", Background: true})
		}, seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/commands", Body: `{"cmd":"echo hi"}`}, &api.CommandResult{PID: 8, Stdout: "hi\n"}},
		{"processes", 200, []api.ProcessInfo{{PID: 7, Args: []string{"sleep"}}}, func(c *client.Client) (any, error) { return c.Processes(ctx, "sbx_1") },
			seen{Method: "GET", Path: "/v1/sandboxes/sbx_1/commands"}, []api.ProcessInfo{{PID: 7, Args: []string{"sleep"}}}},
		{"stdin", 204, nil, func(c *client.Client) (any, error) { return nil, c.SendStdin(ctx, "sbx_1", 7, []byte("raw\x00"), true) },
			seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/commands/7/stdin", Query: "close=true", Body: "raw\x00", ContentType: "application/octet-stream"}, nil},
		{"signal", 204, nil, func(c *client.Client) (any, error) { return nil, c.Signal(ctx, "sbx_1", 7, "SIGTERM") },
			seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/commands/7/signal", Body: `{"signal":"SIGTERM"}`}, nil},
		{"resize", 204, nil, func(c *client.Client) (any, error) {
			return nil, c.Resize(ctx, "sbx_1", 7, api.PTYSize{Cols: 80, Rows: 24})
		},
			seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/commands/7/resize", Body: `{"cols":80,"rows":24}`}, nil},
		{"ls", 200, []api.FileInfo{fi}, func(c *client.Client) (any, error) {
			return c.ListFiles(ctx, "sbx_1", "/home/user", 2, client.AsUser("root"))
		},
			seen{Method: "GET", Path: "/v1/sandboxes/sbx_1/files/list", Query: "depth=2&path=%2Fhome%2Fuser&user=root"}, []api.FileInfo{fi}},
		{"stat", 200, fi, func(c *client.Client) (any, error) { return c.Stat(ctx, "sbx_1", "a") },
			seen{Method: "GET", Path: "/v1/sandboxes/sbx_1/files/stat", Query: "path=a"}, &fi},
		{"mkdir", 200, fi, func(c *client.Client) (any, error) { return c.Mkdir(ctx, "sbx_1", "d/e", client.AsUser("root")) },
			seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/files/mkdir", Body: `{"path":"d/e","user":"root"}`}, &fi},
		{"move", 200, fi, func(c *client.Client) (any, error) { return c.Move(ctx, "sbx_1", "a", "b") },
			seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/files/move", Body: `{"from":"a","to":"b"}`}, &fi},
		{"rm", 204, nil, func(c *client.Client) (any, error) { return nil, c.Remove(ctx, "sbx_1", "a b") },
			seen{Method: "DELETE", Path: "/v1/sandboxes/sbx_1/files", Query: "path=a+b"}, nil},
		{"write", 200, fi, func(c *client.Client) (any, error) {
			return c.WriteFile(ctx, "sbx_1", "a", strings.NewReader("abc"), client.WithMode(0o755))
		}, seen{Method: "PUT", Path: "/v1/sandboxes/sbx_1/files", Query: "mode=0755&path=a", Body: "abc", ContentType: "application/octet-stream"}, &fi},
		{"create key", 201, api.APIKey{ID: "k1", Secret: "e2b_x"}, func(c *client.Client) (any, error) {
			return c.CreateKey(ctx, api.CreateKeyRequest{Name: "ci", MaxSandboxes: 3})
		}, seen{Method: "POST", Path: "/v1/keys", Body: `{"name":"ci","max_sandboxes":3}`}, &api.APIKey{ID: "k1", Secret: "e2b_x"}},
		{"list keys", 200, []api.APIKey{{ID: "k1"}}, func(c *client.Client) (any, error) { return c.ListKeys(ctx) },
			seen{Method: "GET", Path: "/v1/keys"}, []api.APIKey{{ID: "k1"}}},
		{"revoke key", 204, nil, func(c *client.Client) (any, error) { return nil, c.RevokeKey(ctx, "k1") },
			seen{Method: "DELETE", Path: "/v1/keys/k1"}, nil},
		{"health", 200, api.Health{Status: "ok", Version: "dev"}, func(c *client.Client) (any, error) { return c.Health(ctx) },
			seen{Method: "GET", Path: "/healthz"}, &api.Health{Status: "ok", Version: "dev"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got seen
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got = seen{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: strings.TrimSpace(string(b)),
					Auth: r.Header.Get("Authorization"), ContentType: r.Header.Get("Content-Type")}
				if tt.answer != nil {
					w.Header().Set("Content-Type", "application/json")
				}
				w.WriteHeader(tt.status)
				if tt.answer != nil {
					json.NewEncoder(w).Encode(tt.answer)
				}
			})
			res, err := tt.call(c)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			want.Auth = "Bearer " + testKey
			if want.ContentType == "" && want.Body != "" {
				want.ContentType = "application/json"
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if tt.result != nil {
				if diff := cmp.Diff(tt.result, res); diff != "" {
					t.Errorf("result (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		name   string
		status int
		header string // X-Request-Id
		body   string
		want   client.Error
	}{
		{"api error", 404, "", `{"code":"not_found","message":"sandbox sbx_1 not found","request_id":"r1"}`,
			client.Error{Status: 404, Code: api.CodeNotFound, Message: "sandbox sbx_1 not found", RequestID: "r1"}},
		{"request id from header", 401, "r2", `{"code":"unauthenticated","message":"missing API key"}`,
			client.Error{Status: 401, Code: api.CodeUnauthenticated, Message: "missing API key", RequestID: "r2"}},
		{"quota", 429, "", `{"code":"resource_exhausted","message":"too many sandboxes"}`,
			client.Error{Status: 429, Code: api.CodeResourceExhausted, Message: "too many sandboxes"}},
		{"proxy page", 502, "", "<html>Bad Gateway</html>",
			client.Error{Status: 502, Code: api.CodeUnavailable, Message: "<html>Bad Gateway</html>"}},
		{"empty body", 403, "", "",
			client.Error{Status: 403, Code: api.CodePermissionDenied, Message: "Forbidden"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				if tt.header != "" {
					w.Header().Set("X-Request-Id", tt.header)
				}
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			})
			_, err := c.GetSandbox(context.Background(), "sbx_1")
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not a *client.Error", err, err)
			}
			if diff := cmp.Diff(tt.want, *e); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != tt.want.Code {
				t.Errorf("errors.As(*api.Error) = %v, want code %s", ae, tt.want.Code)
			}
			if !client.IsCode(err, tt.want.Code) {
				t.Errorf("IsCode(%s) = false", tt.want.Code)
			}
		})
	}
}

// TestErrorStatusWithoutBody: an error status that comes without a body
// (a proxy's, or a HEAD) is read back as the code the API answers with
// that status (the shared table, api.ErrorCode.HTTPStatus).
func TestErrorStatusWithoutBody(t *testing.T) {
	for _, code := range api.ErrorCodes() {
		want := code
		if code == api.CodeAlreadyExists {
			want = api.CodeFailedPrecondition // both are 409; the client reads the broader
		}
		c := fake(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code.HTTPStatus()) })
		_, err := c.GetSandbox(context.Background(), "sbx_1")
		if !client.IsCode(err, want) {
			t.Errorf("HTTP %d without a body (%s): %v, want code %s", code.HTTPStatus(), code, err, want)
		}
	}
}

func TestTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	_, err := client.New(srv.URL, testKey).GetSandbox(context.Background(), "x")
	var e *client.Error
	if err == nil || errors.As(err, &e) {
		t.Fatalf("err = %v, want a transport error that is not *client.Error", err)
	}
}

func ev(seq uint64, typ api.EventType, data string) api.Event {
	e := api.Event{Seq: seq, Type: typ, PID: 42}
	if data != "" {
		e.Data = []byte(data)
	}
	return e
}

func TestRunStream(t *testing.T) {
	exit := api.Event{Seq: 5, Type: api.EventExit, PID: 42, Exit: &api.ExitStatus{Code: 3}}
	tests := []struct {
		name       string
		events     []api.Event
		extra      string // raw bytes after the events
		wantOut    string
		wantErr    string
		wantCause  error  // DroppedError.Err, if it is one
		wantSeq    uint64 // DroppedError.LastSeq, or Result.LastSeq
		wantExit   int
		wantEvents int
	}{
		{name: "complete", events: []api.Event{ev(1, api.EventStart, ""), {Type: api.EventPing}, ev(2, api.EventStdout, "out1 "),
			ev(3, api.EventStderr, "err1"), ev(4, api.EventStdout, "out2"), exit},
			wantOut: "out1 out2|err1", wantSeq: 5, wantExit: 3, wantEvents: 5},
		{name: "dropped", events: []api.Event{ev(1, api.EventStart, ""), ev(2, api.EventStdout, "partial")},
			wantOut: "partial|", wantErr: "connection dropped", wantCause: io.ErrUnexpectedEOF, wantSeq: 2, wantEvents: 2},
		{name: "dropped mid-line", events: []api.Event{ev(1, api.EventStart, "")}, extra: `{"seq":2,"type":"std`,
			wantErr: "connection dropped", wantCause: io.ErrUnexpectedEOF, wantSeq: 1, wantEvents: 1},
		{name: "error event", events: []api.Event{ev(1, api.EventStart, ""), {Seq: 2, Type: api.EventError, Error: &api.Error{Code: api.CodeUnavailable, Message: "agent gone"}}},
			wantErr:   "server ended the stream before the command exited (pid 42, last event seq 2; re-attach after seq 2): unavailable: agent gone",
			wantCause: &client.Error{Code: api.CodeUnavailable, Message: "agent gone"}, wantSeq: 2, wantEvents: 2},
		{name: "oversized event", extra: `{"seq":1,"type":"stdout","data":"` + strings.Repeat("A", client.MaxEventSize) + `"}` + "\n",
			wantErr: "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req api.CommandRequest
			var accept string
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				accept = r.Header.Get("Accept")
				json.NewDecoder(r.Body).Decode(&req)
				writeEvents(w, tt.events...)
				io.WriteString(w, tt.extra)
			})
			var stdout, stderr strings.Builder
			var events []api.Event
			res, err := c.Run(context.Background(), "sbx_1", api.CommandRequest{Args: []string{"sh", "-c", "x"}, Background: true}, client.RunOptions{
				OnStdout: func(b []byte) { stdout.Write(b) },
				OnStderr: func(b []byte) { stderr.Write(b) },
				OnEvent:  func(e api.Event) { events = append(events, e) },
			})
			if accept != "application/x-ndjson" || req.Background || len(req.Args) != 3 {
				t.Errorf("request: Accept %q, body %+v", accept, req)
			}
			if got := stdout.String() + "|" + stderr.String(); tt.wantOut != "" && got != tt.wantOut {
				t.Errorf("output = %q, want %q", got, tt.wantOut)
			}
			if len(events) != tt.wantEvents {
				t.Errorf("OnEvent called %d times, want %d (pings skipped)", len(events), tt.wantEvents)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if res.PID != 42 || res.Exit.Code != tt.wantExit || res.LastSeq != tt.wantSeq {
					t.Errorf("result = %+v, want pid 42, exit %d, seq %d", res, tt.wantExit, tt.wantSeq)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
			var d *client.DroppedError
			if !errors.As(err, &d) {
				if tt.wantCause != nil {
					t.Errorf("err is %T, want *client.DroppedError", err)
				}
				return
			}
			if tt.wantCause == nil {
				t.Fatalf("err is a DroppedError (%v), want a fatal stream error", err)
			}
			if d.PID != 42 || d.LastSeq != tt.wantSeq || !sameError(d.Err, tt.wantCause) {
				t.Errorf("dropped = %+v, want pid 42, last seq %d, cause %v", d, tt.wantSeq, tt.wantCause)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("seq %d", tt.wantSeq)) {
				t.Errorf("error %q does not name seq %d", err, tt.wantSeq)
			}
		})
	}
}

func TestAttach(t *testing.T) {
	var path, query string
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		path, query = r.URL.Path, r.URL.RawQuery
		writeEvents(w, ev(6, api.EventStdout, "more"), api.Event{Seq: 7, Type: api.EventExit, Exit: &api.ExitStatus{Code: 0}})
	})
	var out strings.Builder
	res, err := c.Attach(context.Background(), "sbx_1", 42, 5, client.RunOptions{OnStdout: func(b []byte) { out.Write(b) }})
	if err != nil {
		t.Fatal(err)
	}
	if path != "/v1/sandboxes/sbx_1/commands/42/events" || query != "after_seq=5" {
		t.Errorf("request %s?%s", path, query)
	}
	if out.String() != "more" || res.PID != 42 || res.LastSeq != 7 {
		t.Errorf("out %q, result %+v", out.String(), res)
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, ev(1, api.EventStart, ""), ev(2, api.EventStdout, "x"))
		<-r.Context().Done()
	})
	_, err := c.Run(ctx, "sbx_1", api.CommandRequest{Cmd: "sleep 100"}, client.RunOptions{
		OnStdout: func([]byte) { cancel() },
	})
	var d *client.DroppedError
	if !errors.As(err, &d) || d.LastSeq != 2 || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want DroppedError after seq 2 wrapping context.Canceled", err)
	}
}

func TestAllSandboxes(t *testing.T) {
	pages := map[string]api.SandboxList{
		"":   {Sandboxes: []api.Sandbox{{ID: "a"}, {ID: "b"}}, NextPageToken: "p2"},
		"p2": {Sandboxes: []api.Sandbox{{ID: "c"}, {ID: "d"}}, NextPageToken: "p3"},
		"p3": {Sandboxes: []api.Sandbox{{ID: "e"}}},
	}
	tests := []struct {
		name      string
		failOn    string // page token whose request fails
		stopAfter int    // break after this many; 0: never
		want      []string
		wantErr   bool
		wantReqs  int
	}{
		{name: "all pages", want: []string{"a", "b", "c", "d", "e"}, wantReqs: 3},
		{name: "break early", stopAfter: 3, want: []string{"a", "b", "c"}, wantReqs: 2},
		{name: "error on page 2", failOn: "p2", want: []string{"a", "b"}, wantErr: true, wantReqs: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqs := 0
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				reqs++
				tok := r.URL.Query().Get("page_token")
				if r.URL.Query().Get("state") != "running" || r.URL.Query().Get("limit") != "2" {
					t.Errorf("query %s lost the filter", r.URL.RawQuery)
				}
				if tt.failOn != "" && tok == tt.failOn {
					w.WriteHeader(503)
					io.WriteString(w, `{"code":"unavailable","message":"busy"}`)
					return
				}
				json.NewEncoder(w).Encode(pages[tok])
			})
			var got []string
			var gotErr error
			for sb, err := range c.AllSandboxes(context.Background(), client.ListFilter{States: []string{"running"}, Limit: 2}) {
				if err != nil {
					gotErr = err
					continue // the iterator must end by itself after an error
				}
				got = append(got, sb.ID)
				if len(got) == tt.stopAfter {
					break
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
			if (gotErr != nil) != tt.wantErr || reqs != tt.wantReqs {
				t.Errorf("err = %v, requests = %d; want error %v, %d requests", gotErr, reqs, tt.wantErr, tt.wantReqs)
			}
		})
	}
}

func TestUploadFiles(t *testing.T) {
	type part struct{ Field, Name, Content string }
	var got []part
	var query string
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		if r.ContentLength != -1 {
			t.Errorf("ContentLength = %d, want -1 (streamed)", r.ContentLength)
		}
		mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "multipart/form-data" {
			t.Fatalf("Content-Type %q", r.Header.Get("Content-Type"))
		}
		mr := multipart.NewReader(r.Body, params["boundary"])
		var fis []api.FileInfo
		for {
			p, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(p)
			// Part.FileName strips directories; the path is the raw parameter.
			_, cd, _ := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
			got = append(got, part{p.FormName(), cd["filename"], string(b)})
			fis = append(fis, api.FileInfo{Path: "/work/" + cd["filename"], Size: int64(len(b))})
		}
		json.NewEncoder(w).Encode(fis)
	})
	big := strings.Repeat("x", 1<<20)
	fis, err := c.UploadFiles(context.Background(), "sbx_1", "/work", []client.Upload{
		{Path: "main.py", Content: strings.NewReader("print(1)\n")},
		{Path: "data/big.txt", Content: io.MultiReader(strings.NewReader(big))},
	}, client.AsUser("root"))
	if err != nil {
		t.Fatal(err)
	}
	want := []part{{"file", "main.py", "print(1)\n"}, {"file", "data/big.txt", big}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parts (-want +got):\n%s", diff)
	}
	if query != "dir=%2Fwork&user=root" || len(fis) != 2 || fis[1].Size != 1<<20 {
		t.Errorf("query %q, infos %+v", query, fis)
	}
}

func TestUploadFilesReaderError(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("[]"))
	})
	_, err := c.UploadFiles(context.Background(), "sbx_1", "", []client.Upload{
		{Path: "bad", Content: io.MultiReader(strings.NewReader("abc"), errReader{})},
	})
	if err == nil || !strings.Contains(err.Error(), "uploading bad") {
		t.Fatalf("err = %v, want the reader's error", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// closeTracker records whether it was closed.
type closeTracker struct {
	io.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }

func TestFileStreams(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case "GET":
			io.WriteString(w, "contents of "+r.URL.Query().Get("path"))
		case "PUT":
			b, _ := io.ReadAll(r.Body)
			if r.ContentLength != -1 {
				t.Errorf("PUT ContentLength = %d, want -1 (streamed)", r.ContentLength)
			}
			json.NewEncoder(w).Encode(api.FileInfo{Path: r.URL.Query().Get("path"), Size: int64(len(b))})
		}
	})
	var out strings.Builder
	n, err := c.ReadFile(context.Background(), "sbx_1", "/etc/os-release", &out)
	if err != nil || out.String() != "contents of /etc/os-release" || n != int64(out.Len()) {
		t.Errorf("ReadFile = %d, %v, %q", n, err, out.String())
	}
	src := &closeTracker{Reader: strings.NewReader("12345")}
	fi, err := c.WriteFile(context.Background(), "sbx_1", "/tmp/x", src)
	if err != nil || fi.Size != 5 || fi.Path != "/tmp/x" {
		t.Errorf("WriteFile = %+v, %v", fi, err)
	}
	if src.closed {
		t.Error("WriteFile closed the caller's reader")
	}
}

func TestWatch(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "path=%2Fw&recursive=true" {
			t.Errorf("query %q", r.URL.RawQuery)
		}
		writeEvents(w,
			api.Event{Seq: 1, Type: api.EventStart},
			api.Event{Seq: 1, Type: api.EventFile, File: &api.FileEvent{Op: api.FileCreate, Path: "/w/a"}},
			api.Event{Type: api.EventPing},
			api.Event{Seq: 2, Type: api.EventFile, File: &api.FileEvent{Op: api.FileWrite, Path: "/w/a"}},
			api.Event{Seq: 3, Type: api.EventFile, File: &api.FileEvent{Op: api.FileRemove, Path: "/w/a"}},
		)
	})
	stop := errors.New("enough")
	var ops []api.FileOp
	err := c.Watch(context.Background(), "sbx_1", "/w", true, func(e api.Event) error {
		ops = append(ops, e.File.Op)
		if len(ops) == 2 {
			return stop
		}
		return nil
	})
	if err != stop || !cmp.Equal(ops, []api.FileOp{api.FileCreate, api.FileWrite}) {
		t.Errorf("Watch = %v, ops %v", err, ops)
	}
	// A stream that ends is an error: watches do not end by themselves.
	err = c.Watch(context.Background(), "sbx_1", "/w", true, func(api.Event) error { return nil })
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "seq 3") {
		t.Errorf("Watch to the end = %v", err)
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv("KILN_URL", "")
	t.Setenv("KILN_API_KEY", "")
	if got := client.FromEnv().BaseURL(); got != client.DefaultURL {
		t.Errorf("default URL = %q", got)
	}
	var auth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth = r.Header.Get("Authorization")
		io.WriteString(w, `{"status":"ok"}`)
	}))
	defer srv.Close()
	t.Setenv("KILN_URL", srv.URL)
	t.Setenv("KILN_API_KEY", "e2b_env")
	hc := &http.Client{Timeout: 5 * time.Second}
	if _, err := client.FromEnv(client.WithHTTPClient(hc)).Health(context.Background()); err != nil || auth != "Bearer e2b_env" {
		t.Errorf("Health: %v, Authorization %q", err, auth)
	}
}

// sameError compares *client.Error by value, other errors with errors.Is.
func sameError(got, want error) bool {
	var g, w *client.Error
	if errors.As(want, &w) {
		return errors.As(got, &g) && *g == *w
	}
	return errors.Is(got, want)
}
