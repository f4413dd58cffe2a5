package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/client"
)

// TestCodeRoutes checks the unary code methods' requests and answers.
func TestCodeRoutes(t *testing.T) {
	ctx := context.Background()
	kc := api.Context{ID: "c1", Language: "python", Cwd: "/home/user", CreatedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	res := api.CodeResult{Stdout: "2\n", Results: []api.Result{{Data: map[string]string{"text/plain": "4"}, IsMainResult: true}}, ExecutionCount: 3}
	tests := []struct {
		name   string
		status int
		answer any
		call   func(c *client.Client) (any, error)
		want   seen
		accept string
		result any
	}{
		{"run json", 200, res, func(c *client.Client) (any, error) {
			return c.RunCodeJSON(ctx, "sbx_1", api.CodeRequest{Code: "print(1+1)\n2*2", Timeout: 1.5})
		}, seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/code", Body: `{"code":"print(1+1)\n2*2","timeout":1.5}`}, "application/json", &res},
		{"create context", 201, kc, func(c *client.Client) (any, error) {
			return c.CreateContext(ctx, "sbx_1", api.CreateContextRequest{Language: "r", Env: map[string]string{"A": "b"}})
		}, seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/contexts", Body: `{"language":"r","env":{"A":"b"}}`}, "application/json", kc},
		{"contexts", 200, []api.Context{kc}, func(c *client.Client) (any, error) { return c.Contexts(ctx, "sbx_1") },
			seen{Method: "GET", Path: "/v1/sandboxes/sbx_1/contexts"}, "application/json", []api.Context{kc}},
		{"restart context", 200, kc, func(c *client.Client) (any, error) { return c.RestartContext(ctx, "sbx_1", "c1") },
			seen{Method: "POST", Path: "/v1/sandboxes/sbx_1/contexts/c1/restart"}, "application/json", kc},
		{"delete context", 204, nil, func(c *client.Client) (any, error) { return nil, c.DeleteContext(ctx, "sbx_1", "c/1") },
			seen{Method: "DELETE", Path: "/v1/sandboxes/sbx_1/contexts/c/1"}, "application/json", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got seen
			var accept, rawPath string
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got = seen{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: strings.TrimSpace(string(b)),
					Auth: r.Header.Get("Authorization"), ContentType: r.Header.Get("Content-Type")}
				accept, rawPath = r.Header.Get("Accept"), r.URL.EscapedPath()
				if tt.answer != nil {
					w.Header().Set("Content-Type", "application/json")
				}
				w.WriteHeader(tt.status)
				if tt.answer != nil {
					json.NewEncoder(w).Encode(tt.answer)
				}
			})
			out, err := tt.call(c)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			want.Auth = "Bearer " + testKey
			if want.Body != "" {
				want.ContentType = "application/json"
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if accept != tt.accept {
				t.Errorf("Accept %q, want %q", accept, tt.accept)
			}
			if strings.Contains(tt.name, "delete") && rawPath != "/v1/sandboxes/sbx_1/contexts/c%2F1" {
				t.Errorf("context id not escaped: %s", rawPath)
			}
			if tt.result != nil {
				if diff := cmp.Diff(tt.result, out); diff != "" {
					t.Errorf("result (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestRunCodeStream(t *testing.T) {
	png := api.Result{Data: map[string]string{"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}}
	main := api.Result{Data: map[string]string{"text/plain": "42"}, IsMainResult: true}
	xerr := api.ExecutionError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "Traceback ...\nZeroDivisionError: division by zero"}
	tests := []struct {
		name      string
		events    []api.Event
		extra     string
		want      *api.CodeResult
		wantErr   string
		wantCode  api.ErrorCode // of a *client.Error, if the error is one
		wantCalls string        // the callbacks called, in order
	}{
		{name: "complete", events: []api.Event{
			{Seq: 1, Type: api.EventStdout, Data: []byte("a\n")},
			{Type: api.EventPing},
			{Seq: 2, Type: api.EventStderr, Data: []byte("warn\n")},
			{Seq: 3, Type: api.EventResult, Result: &png},
			{Seq: 4, Type: api.EventStdout, Data: []byte("b\n")},
			{Seq: 5, Type: api.EventResult, Result: &main},
			{Seq: 6, Type: api.EventDone, ExecutionCount: 7},
		}, want: &api.CodeResult{Stdout: "a\nb\n", Stderr: "warn\n", Results: []api.Result{png, main}, ExecutionCount: 7},
			wantCalls: "event out event err event result event out event result event"},
		{name: "exception", events: []api.Event{
			{Seq: 1, Type: api.EventStdout, Data: []byte("before\n")},
			{Seq: 2, Type: api.EventExecutionError, ExecutionError: &xerr},
			{Seq: 3, Type: api.EventDone, ExecutionCount: 2},
		}, want: &api.CodeResult{Stdout: "before\n", Results: []api.Result{}, Error: &xerr, ExecutionCount: 2},
			wantCalls: "event out event error event"},
		{name: "error event", events: []api.Event{
			{Seq: 1, Type: api.EventStdout, Data: []byte("x")},
			{Seq: 2, Type: api.EventError, Error: &api.Error{Code: api.CodeUnavailable, Message: "agent gone"}},
		}, want: &api.CodeResult{Stdout: "x", Results: []api.Result{}},
			wantErr: "agent gone", wantCode: api.CodeUnavailable, wantCalls: "event out event"},
		{name: "dropped", events: []api.Event{{Seq: 1, Type: api.EventStdout, Data: []byte("x")}},
			want:    &api.CodeResult{Stdout: "x", Results: []api.Result{}},
			wantErr: "ended before the execution finished", wantCalls: "event out"},
		{name: "garbage", extra: "not json\n", want: &api.CodeResult{Results: []api.Result{}}, wantErr: "decoding stream event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var req api.CodeRequest
			var accept string
			c := fake(t, func(w http.ResponseWriter, r *http.Request) {
				accept = r.Header.Get("Accept")
				json.NewDecoder(r.Body).Decode(&req)
				writeEvents(w, tt.events...)
				io.WriteString(w, tt.extra)
			})
			var calls []string
			res, err := c.RunCode(context.Background(), "sbx_1", api.CodeRequest{Code: "1/0", Language: "python"}, client.CodeOptions{
				OnStdout: func([]byte) { calls = append(calls, "out") },
				OnStderr: func([]byte) { calls = append(calls, "err") },
				OnResult: func(api.Result) { calls = append(calls, "result") },
				OnError:  func(api.ExecutionError) { calls = append(calls, "error") },
				OnEvent:  func(api.Event) { calls = append(calls, "event") },
			})
			if accept != "application/x-ndjson" || req.Code != "1/0" || req.Language != "python" {
				t.Errorf("request: Accept %q, body %+v", accept, req)
			}
			if got := strings.Join(calls, " "); got != tt.wantCalls {
				t.Errorf("callbacks %q, want %q", got, tt.wantCalls)
			}
			if diff := cmp.Diff(tt.want, res); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
			if tt.wantCode != "" && !client.IsCode(err, tt.wantCode) {
				t.Errorf("err = %v, want code %s", err, tt.wantCode)
			}
		})
	}
}

func TestRunCodeHTTPError(t *testing.T) {
	c := fake(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"code":"not_found","message":"context c9 not found"}`)
	})
	res, err := c.RunCode(context.Background(), "sbx_1", api.CodeRequest{Code: "x", ContextID: "c9"}, client.CodeOptions{})
	var e *client.Error
	if res != nil || !errors.As(err, &e) || e.Status != 404 || e.Code != api.CodeNotFound {
		t.Fatalf("RunCode = %+v, %v; want a 404 *client.Error", res, err)
	}
}
