package agent

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/agentapi/channel"
	"github.com/kiln-sh/kiln/internal/agentapi/wire"
)

// newCodeHarness runs an agent whose kernels find /usr/bin/python3 (with
// ipykernel) first on PATH.
func newCodeHarness(t *testing.T) *harness {
	t.Helper()
	if err := exec.Command("/usr/bin/python3", "-c", "import ipykernel").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("python3-ipykernel is not installed: %v", err)
		}
		t.Skipf("python3-ipykernel is not installed (scripts/setup-deps.sh installs it): %v", err)
	}
	return newHarness(t, func(c *Config) {
		c.BaseEnv = append(c.BaseEnv, "PATH=/usr/bin:/bin")
	})
}

func (h *harness) call(method string, params, result any) error {
	h.t.Helper()
	return callOn(h.conn, method, params, result)
}

// callOn makes one call on conn and waits for its result.
func callOn(conn *channel.Conn, method string, params, result any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := conn.Call(ctx, method, params)
	if err != nil {
		return err
	}
	defer st.Close()
	return st.Wait(ctx, result)
}

func (h *harness) execute(p wire.ExecuteParams) result {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := h.conn.Call(ctx, wire.MethodExecute, p)
	if err != nil {
		h.t.Fatalf("calling execute: %v", err)
	}
	defer st.Close()
	return collect(ctx, st)
}

func TestCode(t *testing.T) {
	h := newCodeHarness(t)
	var c api.Context
	if err := h.call(wire.MethodContextCreate, wire.ContextParams{Language: "python", Cwd: "/tmp"}, &c); err != nil {
		t.Fatal(err)
	}
	if c.ID == "" || c.Language != "python" || c.Cwd != "/tmp" {
		t.Fatalf("context %+v", c)
	}
	tests := []struct {
		name  string
		p     wire.ExecuteParams
		check func(t *testing.T, r result)
	}{
		{"state persists", wire.ExecuteParams{ContextID: c.ID, Code: "a = 20"}, func(t *testing.T, r result) {
			if r.err != nil {
				t.Fatal(r.err)
			}
		}},
		{"result, output and done", wire.ExecuteParams{ContextID: c.ID, Code: "import os; print(os.getcwd()); a * 2 + 2"},
			func(t *testing.T, r result) {
				if r.err != nil || r.output(api.EventStdout) != "/tmp\n" {
					t.Fatalf("%+v", r)
				}
				last := r.events[len(r.events)-1]
				if last.Type != api.EventDone || last.ExecutionCount != 2 {
					t.Fatalf("last event %+v", last)
				}
				var main string
				for i, ev := range r.events {
					if ev.Seq != uint64(i+1) {
						t.Fatalf("event %d has seq %d", i, ev.Seq)
					}
					if ev.Type == api.EventResult && ev.Result.IsMainResult {
						main = ev.Result.Data["text/plain"]
					}
				}
				if main != "42" {
					t.Fatalf("main result %q", main)
				}
			}},
		{"large output is chunked", wire.ExecuteParams{ContextID: c.ID, Code: "print('z' * 1_000_000)"}, func(t *testing.T, r result) {
			if r.err != nil || len(r.output(api.EventStdout)) != 1_000_001 {
				t.Fatalf("err %v, %d bytes", r.err, len(r.output(api.EventStdout)))
			}
		}},
		{"execution error", wire.ExecuteParams{ContextID: c.ID, Code: "raise ValueError('nope')"}, func(t *testing.T, r result) {
			var ee *api.ExecutionError
			for _, ev := range r.events {
				if ev.ExecutionError != nil {
					ee = ev.ExecutionError
				}
			}
			if r.err != nil || ee == nil || ee.Name != "ValueError" || ee.Value != "nope" {
				t.Fatalf("%+v", r)
			}
		}},
		{"timeout", wire.ExecuteParams{ContextID: c.ID, Code: "import time; time.sleep(30)", TimeoutMs: 1000}, func(t *testing.T, r result) {
			if errCode(r.err) != api.CodeDeadlineExceeded {
				t.Fatalf("err %v", r.err)
			}
		}},
		{"survives the timeout", wire.ExecuteParams{ContextID: c.ID, Code: "print(a)"}, func(t *testing.T, r result) {
			if r.output(api.EventStdout) != "20\n" {
				t.Fatalf("%+v", r)
			}
		}},
		{"default context", wire.ExecuteParams{Language: "py", Code: "print('a' in globals())", Env: map[string]string{"X": "1"}},
			func(t *testing.T, r result) {
				if r.err != nil || r.output(api.EventStdout) != "False\n" {
					t.Fatalf("%+v", r)
				}
			}},
		{"unknown context", wire.ExecuteParams{ContextID: "nope", Code: "1"}, func(t *testing.T, r result) {
			if errCode(r.err) != api.CodeNotFound {
				t.Fatalf("err %v", r.err)
			}
		}},
		{"bad language", wire.ExecuteParams{Language: "cobol", Code: "1"}, func(t *testing.T, r result) {
			if errCode(r.err) != api.CodeInvalidArgument || !strings.Contains(r.err.Error(), "python") {
				t.Fatalf("err %v", r.err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, h.execute(tt.p)) })
	}

	var list []api.Context
	if err := h.call(wire.MethodContexts, nil, &list); err != nil || len(list) != 2 {
		t.Fatalf("contexts %+v %v", list, err)
	}
	if err := h.call(wire.MethodContextRestart, wire.ContextIDParams{ID: c.ID}, &c); err != nil {
		t.Fatal(err)
	}
	if r := h.execute(wire.ExecuteParams{ContextID: c.ID, Code: "print('a' in globals())"}); r.output(api.EventStdout) != "False\n" {
		t.Fatalf("after restart %+v", r)
	}
	if err := h.call(wire.MethodContextDelete, wire.ContextIDParams{ID: c.ID}, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.call(wire.MethodContextDelete, wire.ContextIDParams{ID: c.ID}, nil); errCode(err) != api.CodeNotFound {
		t.Fatalf("second delete: %v", err)
	}
	if err := h.call(wire.MethodContextCreate, wire.ContextParams{Language: "fortran"}, nil); errCode(err) != api.CodeInvalidArgument {
		t.Fatalf("bad language: %v", err)
	}
}

// Hidden executions (a warm template's imports, identify's code) are not
// counted: the user's first execution is number 1 in every kind of
// kernel, and the next hidden one does not move the count.
func TestHiddenExecutions(t *testing.T) {
	h := newCodeHarness(t)
	code := map[string]string{"python": "1", "bash": "true", "javascript": "1", "c": "int main(void) { return 0; }"}
	for _, lang := range []string{"python", "bash", "javascript", "c"} {
		t.Run(lang, func(t *testing.T) {
			counts := []int{}
			for _, hidden := range []bool{true, true, false, true, false} {
				r := h.execute(wire.ExecuteParams{Language: lang, Code: code[lang], Hidden: hidden})
				if r.err != nil || len(r.events) == 0 {
					t.Fatalf("execution: %+v", r)
				}
				if !hidden {
					counts = append(counts, r.events[len(r.events)-1].ExecutionCount)
				}
			}
			if !slices.Equal(counts, []int{1, 2}) {
				t.Fatalf("the user's execution counts %v, want [1 2]", counts)
			}
		})
	}
}
