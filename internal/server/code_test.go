package server_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/config"
	"github.com/kiln-sh/kiln/internal/oci/ocitest"
	"github.com/kiln-sh/kiln/internal/template"
)

// codeRun is what one streamed execution produced.
type codeRun struct {
	api.CodeResult
	done    bool       // the stream ended with a done event
	failure *api.Error // the stream's error event, if any
	events  []api.EventType
}

// runCode posts req to .../code and reads the NDJSON stream to its end.
func runCode(t *testing.T, h *harness, base string, req api.CodeRequest) codeRun {
	t.Helper()
	b, _ := json.Marshal(req)
	resp := h.request("POST", base+"/code", h.a, bytes.NewReader(b))
	if resp.StatusCode != http.StatusOK {
		e := apiErr(t, resp)
		t.Fatalf("POST %s/code: status %d: %s: %s", base, resp.StatusCode, e.Code, e.Message)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("Content-Type %q", ct)
	}
	var run codeRun
	var stdout, stderr strings.Builder
	readEvents(t, resp.Body, func(ev api.Event) bool {
		if ev.Type != api.EventPing {
			run.events = append(run.events, ev.Type)
		}
		switch ev.Type {
		case api.EventStdout:
			stdout.Write(ev.Data)
		case api.EventStderr:
			stderr.Write(ev.Data)
		case api.EventResult:
			if ev.Result == nil {
				t.Errorf("result event without a result")
				break
			}
			run.Results = append(run.Results, *ev.Result)
		case api.EventExecutionError:
			run.Error = ev.ExecutionError
		case api.EventDone:
			run.done, run.ExecutionCount = true, ev.ExecutionCount
		case api.EventError:
			run.failure = ev.Error
		}
		return true
	})
	run.Stdout, run.Stderr = stdout.String(), stderr.String()
	return run
}

// mustRun runs code that must succeed and returns its output.
func mustRun(t *testing.T, h *harness, base string, req api.CodeRequest) codeRun {
	t.Helper()
	run := runCode(t, h, base, req)
	if run.failure != nil || run.Error != nil || !run.done {
		t.Fatalf("code %q: failure %+v, exception %+v, done %v (events %v, stderr %q)", req.Code, run.failure, run.Error, run.done, run.events, run.Stderr)
	}
	return run
}

// mainResult returns the result marked as the cell's value.
func (r codeRun) mainResult() (api.Result, bool) {
	for _, res := range r.Results {
		if res.IsMainResult {
			return res, true
		}
	}
	return api.Result{}, false
}

// TestCodeInterpreter runs Python through the real server in a
// code-interpreter sandbox: persistence, rich results, exceptions,
// timeouts, contexts and the aggregated form.
func TestCodeInterpreter(t *testing.T) {
	h := newHarness(t, true, harnessOpts{})
	_, terr := template.Lookup(config.FromEnv().DataDir, "code-interpreter")
	ocitest.Require(t, terr == nil, fmt.Sprintf("code-interpreter template not built (make setup): %v", terr))
	sb := h.create(h.a, api.CreateSandboxRequest{Template: "code-interpreter", Timeout: 900})
	base := "/v1/sandboxes/" + sb.ID

	// Until kiln-agent serves the code methods, say so once instead of
	// failing every subtest.
	resp := h.request("GET", base+"/contexts", h.a, nil)
	if resp.StatusCode != http.StatusOK {
		e := apiErr(t, resp)
		ocitest.Require(t, !strings.Contains(e.Message, "unknown method"), "kiln-agent does not serve the code methods yet: "+e.Message)
		t.Fatalf("GET %s/contexts: %d %s: %s", base, resp.StatusCode, e.Code, e.Message)
	}
	resp.Body.Close()

	t.Run("persistence", func(t *testing.T) {
		h := h.with(t)
		first := mustRun(t, h, base, api.CodeRequest{Code: "x = 6 * 7\nprint('set')"})
		if first.Stdout != "set\n" {
			t.Errorf("stdout %q", first.Stdout)
		}
		second := mustRun(t, h, base, api.CodeRequest{Code: "import sys\nprint(x)\nprint('warn', file=sys.stderr)\nx + 1", Language: "python"})
		if second.Stdout != "42\n" || second.Stderr != "warn\n" {
			t.Errorf("stdout %q stderr %q", second.Stdout, second.Stderr)
		}
		if res, ok := second.mainResult(); !ok || res.Data["text/plain"] != "43" {
			t.Errorf("results %+v, want a main result 43", second.Results)
		}
		if second.ExecutionCount <= first.ExecutionCount {
			t.Errorf("execution counts %d then %d", first.ExecutionCount, second.ExecutionCount)
		}
		if last := second.events[len(second.events)-1]; last != api.EventDone {
			t.Errorf("events %v: want done last", second.events)
		}
	})

	t.Run("dataframe", func(t *testing.T) {
		h := h.with(t)
		run := mustRun(t, h, base, api.CodeRequest{Code: "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"})
		res, found := run.mainResult()
		if !found || !strings.Contains(res.Data["text/html"], "<table") || !strings.Contains(res.Data["text/plain"], "a  b") {
			t.Errorf("results %+v, want a main result with an HTML table", run.Results)
		}
	})

	t.Run("chart", func(t *testing.T) {
		h := h.with(t)
		run := mustRun(t, h, base, api.CodeRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()"})
		var pngs []string
		for _, res := range run.Results {
			if v, ok := res.Data["image/png"]; ok {
				pngs = append(pngs, v)
			}
		}
		if len(pngs) != 1 {
			t.Fatalf("%d image/png results, want 1: %+v", len(pngs), run.Results)
		}
		b, err := base64.StdEncoding.DecodeString(pngs[0])
		if err != nil {
			t.Fatalf("image/png is not base64: %v", err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("image/png does not decode: %v", err)
		}
		if r := img.Bounds(); r.Dx() < 100 || r.Dy() < 100 {
			t.Errorf("figure of %v", r)
		}
	})

	t.Run("languages", func(t *testing.T) {
		h := h.with(t)
		// Each pair runs in the language's default context: the first cell
		// sets state (where the language keeps any), the second reads it.
		tests := []struct {
			lang, first, second string
			wantOut, wantValue  string
		}{
			{"javascript", "let x = 41; function inc(v) { return v + 1 }", "console.log('hi'); inc(x)", "hi\n", "42"},
			{"bash", "cd /tmp; greet() { echo hello $1; }", "pwd; greet kiln", "/tmp\nhello kiln\n", ""},
			{"r", "x <- 41", "cat('hi\\n'); x + 1", "hi\n", "[1] 42"},
			{"go", "package main\nfunc main() {}", "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"hello go\") }", "hello go\n", ""},
			{"rust", "fn main() {}", "fn main() { println!(\"hello rust\"); }", "hello rust\n", ""},
			{"c", "int main(void) { return 0; }", "#include <stdio.h>\nint main(void) { puts(\"hello c\"); return 0; }", "hello c\n", ""},
			{"cpp", "int main() { return 0; }", "#include <iostream>\nint main() { std::cout << \"hello cpp\" << std::endl; }", "hello cpp\n", ""},
			{"java", "public class Main { public static void main(String[] a) {} }", "public class Main { public static void main(String[] a) { System.out.println(\"hello java\"); } }", "hello java\n", ""},
		}
		for _, tt := range tests {
			t.Run(tt.lang, func(t *testing.T) {
				mustRun(t, h, base, api.CodeRequest{Language: tt.lang, Code: tt.first, Timeout: 120})
				run := mustRun(t, h, base, api.CodeRequest{Language: tt.lang, Code: tt.second, Timeout: 120})
				if run.Stdout != tt.wantOut {
					t.Errorf("stdout %q, want %q (stderr %q)", run.Stdout, tt.wantOut, run.Stderr)
				}
				if tt.wantValue != "" {
					found := false
					for _, r := range run.Results {
						found = found || strings.TrimSpace(r.Data["text/plain"]) == tt.wantValue
					}
					if !found {
						t.Errorf("results %+v, want a value %q", run.Results, tt.wantValue)
					}
				}
			})
		}
		run := runCode(t, h, base, api.CodeRequest{Language: "c", Code: "int main(void) { return undefined_thing; }", Timeout: 120})
		if run.Error == nil || run.Error.Name != "CompileError" || !strings.Contains(run.Error.Traceback, "undefined_thing") {
			t.Errorf("compile error: %+v", run.Error)
		}
	})

	t.Run("data analysis flow", func(t *testing.T) {
		// The classic flow: upload a CSV the test makes, group it with
		// pandas, plot it, get the chart back.
		h := h.with(t)
		var csv strings.Builder
		csv.WriteString("title,year,vote_average,vote_count\n")
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 10000 {
			fmt.Fprintf(&csv, "Movie %d,%d,%.1f,%d\n", i, 1980+rng.IntN(44), 1+rng.Float64()*9, rng.IntN(5000))
		}
		resp := h.request("PUT", base+"/files?path=/home/user/movies.csv", h.a, strings.NewReader(csv.String()))
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("upload: %s", resp.Status)
		}
		run := mustRun(t, h, base, api.CodeRequest{Timeout: 120, Code: `
import pandas as pd
import matplotlib.pyplot as plt
df = pd.read_csv("movies.csv")
by_year = df.groupby("year")["vote_average"].mean()
print(len(df), "rows,", by_year.size, "years")
by_year.plot(kind="line", title="Average vote by year")
plt.xlabel("year"); plt.ylabel("vote average")
by_year.head()
`})
		if run.Stdout != "10000 rows, 44 years\n" {
			t.Errorf("stdout %q (stderr %q)", run.Stdout, run.Stderr)
		}
		var png64 string
		for _, r := range run.Results {
			if v, ok := r.Data["image/png"]; ok {
				png64 = v
			}
		}
		b, err := base64.StdEncoding.DecodeString(png64)
		if err != nil || len(b) == 0 {
			t.Fatalf("no chart: %+v", run.Results)
		}
		if _, err := png.Decode(bytes.NewReader(b)); err != nil {
			t.Fatalf("chart does not decode: %v", err)
		}
		if res, ok := run.mainResult(); !ok || !strings.Contains(res.Data["text/plain"], "1980") {
			t.Errorf("main result %+v", res)
		}
	})

	t.Run("large chart", func(t *testing.T) {
		// Bigger than one channel frame (256 KiB): it must arrive whole.
		run := mustRun(t, h, base, api.CodeRequest{Code: "import numpy as np, matplotlib.pyplot as plt\nfig = plt.figure(figsize=(16, 16))\nplt.scatter(np.random.rand(20000), np.random.rand(20000), c=np.random.rand(20000), s=3)"})
		for _, res := range run.Results {
			if v, ok := res.Data["image/png"]; ok {
				b, err := base64.StdEncoding.DecodeString(v)
				if err != nil || len(b) < 256<<10 {
					t.Fatalf("large chart: %d bytes, %v", len(b), err)
				}
				if _, err := png.Decode(bytes.NewReader(b)); err != nil {
					t.Fatalf("large chart does not decode: %v", err)
				}
				return
			}
		}
		t.Fatalf("no image/png result: %+v (stderr %q)", run.Results, run.Stderr)
	})

	t.Run("exception then success", func(t *testing.T) {
		h := h.with(t)
		run := runCode(t, h, base, api.CodeRequest{Code: "print('before')\n1 / 0"})
		if run.failure != nil || !run.done {
			t.Fatalf("an exception must end the stream normally: failure %+v, done %v", run.failure, run.done)
		}
		e := run.Error
		if e == nil || e.Name != "ZeroDivisionError" || !strings.Contains(e.Value, "division by zero") ||
			!strings.Contains(e.Traceback, "ZeroDivisionError") || strings.Contains(e.Traceback, "\x1b[") {
			t.Fatalf("exception %+v, want ZeroDivisionError with a plain traceback", e)
		}
		if run.Stdout != "before\n" {
			t.Errorf("stdout %q", run.Stdout)
		}
		if after := mustRun(t, h, base, api.CodeRequest{Code: "print('fine')"}); after.Stdout != "fine\n" {
			t.Errorf("after the exception: stdout %q", after.Stdout)
		}
	})

	t.Run("timeout keeps state", func(t *testing.T) {
		h := h.with(t)
		mustRun(t, h, base, api.CodeRequest{Code: "kept = 'yes'"})
		start := time.Now()
		run := runCode(t, h, base, api.CodeRequest{Code: "import time\nprint('sleeping', flush=True)\ntime.sleep(60)\nprint('woke')", Timeout: 1})
		if took := time.Since(start); took > 20*time.Second {
			t.Errorf("a 1 s timeout took %v", took)
		}
		if strings.Contains(run.Stdout, "woke") || !strings.Contains(run.Stdout, "sleeping") {
			t.Errorf("stdout %q: want the output before the interrupt only", run.Stdout)
		}
		if run.Error == nil && run.failure == nil {
			t.Errorf("a timed-out execution reported neither an exception nor an error (events %v)", run.events)
		}
		if after := mustRun(t, h, base, api.CodeRequest{Code: "print(kept)"}); after.Stdout != "yes\n" {
			t.Errorf("after the timeout: stdout %q, want the variable kept", after.Stdout)
		}
	})

	t.Run("aggregated", func(t *testing.T) {
		h := h.with(t)
		resp := h.request("POST", base+"/code", h.a, strings.NewReader(`{"code":"print('hi')\n1 + 1"}`), "Accept", "application/json")
		defer resp.Body.Close()
		var res api.CodeResult
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		if res.Stdout != "hi\n" || len(res.Results) != 1 || res.Results[0].Data["text/plain"] != "2" || res.Error != nil || res.ExecutionCount == 0 {
			t.Errorf("result %+v", res)
		}
		resp = h.request("POST", base+"/code", h.a, strings.NewReader(`{"code":"raise ValueError('bad')"}`), "Accept", "application/json")
		defer resp.Body.Close()
		res = api.CodeResult{}
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, err)
		}
		if res.Error == nil || res.Error.Name != "ValueError" || res.Error.Value != "bad" {
			t.Errorf("error %+v", res.Error)
		}
	})

	t.Run("code size", func(t *testing.T) {
		h := h.with(t)
		// 200 KiB fits one channel frame; the API's limit of 1 MiB takes
		// several, which the agent reassembles.
		pad := "# " + strings.Repeat("x", 200<<10) + "\n"
		if run := mustRun(t, h, base, api.CodeRequest{Code: pad + "print('big')"}); run.Stdout != "big\n" {
			t.Errorf("stdout %q", run.Stdout)
		}
		if run := mustRun(t, h, base, api.CodeRequest{Code: strings.Repeat(pad, 5) + "print('near 1 MiB')"}); run.Stdout != "near 1 MiB\n" {
			t.Errorf("code of about 1 MiB: stdout %q", run.Stdout)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		h := h.with(t)
		var c api.Context
		h.do("POST", base+"/contexts", h.a, api.CreateContextRequest{Language: "python", Cwd: "/tmp", Env: map[string]string{"CTX_VAR": "v1"}}, 201, &c)
		if c.ID == "" || c.Language != "python" || c.Cwd != "/tmp" || c.CreatedAt.IsZero() {
			t.Fatalf("created %+v", c)
		}
		run := mustRun(t, h, base, api.CodeRequest{ContextID: c.ID, Code: "import os\nonly_here = 1\nprint(os.getcwd(), os.environ['CTX_VAR'])"})
		if run.Stdout != "/tmp v1\n" {
			t.Errorf("in the context: stdout %q", run.Stdout)
		}
		if run := mustRun(t, h, base, api.CodeRequest{Code: "print('only_here' in globals())"}); run.Stdout != "False\n" {
			t.Errorf("the default context sees the new context's variable: %q", run.Stdout)
		}
		var list []api.Context
		h.do("GET", base+"/contexts", h.a, nil, 200, &list)
		if !slices.ContainsFunc(list, func(x api.Context) bool { return x.ID == c.ID }) {
			t.Errorf("list %+v lacks %s", list, c.ID)
		}
		var restarted api.Context
		h.do("POST", base+"/contexts/"+c.ID+"/restart", h.a, nil, 200, &restarted)
		if restarted.ID != c.ID {
			t.Errorf("restart answered %+v", restarted)
		}
		if run := mustRun(t, h, base, api.CodeRequest{ContextID: c.ID, Code: "print('only_here' in globals())"}); run.Stdout != "False\n" {
			t.Errorf("after restart: %q, want the state gone", run.Stdout)
		}
		h.do("DELETE", base+"/contexts/"+c.ID, h.a, nil, 204, nil)
		resp := h.request("POST", base+"/code", h.a, strings.NewReader(`{"code":"1","context_id":"`+c.ID+`"}`))
		if resp.StatusCode != 404 {
			t.Errorf("code in a deleted context: status %d, want 404", resp.StatusCode)
		}
		resp.Body.Close()
		h.do("DELETE", base+"/contexts/"+c.ID, h.a, nil, 404, nil)
		h.do("POST", base+"/contexts/"+c.ID+"/restart", h.a, nil, 404, nil)
		// Another key's sandbox is not found.
		h.do("GET", base+"/contexts", h.b, nil, 404, nil)
	})
}

// TestCodeValidation checks what the code routes refuse before they reach
// a sandbox; it needs no root.
func TestCodeValidation(t *testing.T) {
	h := newHarness(t, false, harnessOpts{})
	base := "/v1/sandboxes/abcdefgh12"
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"empty code", "POST", "/code", `{"code":"  "}`, 400},
		{"no code", "POST", "/code", `{}`, 400},
		{"code too large", "POST", "/code", `{"code":"` + strings.Repeat("x", 1<<20+1) + `"}`, 400},
		{"negative timeout", "POST", "/code", `{"code":"1","timeout":-1}`, 400},
		{"timeout too long", "POST", "/code", `{"code":"1","timeout":1e9}`, 400},
		{"bad language", "POST", "/code", `{"code":"1","language":"py thon"}`, 400},
		{"bad context id", "POST", "/code", `{"code":"1","context_id":"../x"}`, 400},
		{"bad env", "POST", "/code", `{"code":"1","env":{"A=B":"c"}}`, 400},
		{"reserved env", "POST", "/code", `{"code":"1","env":{"KILN_X":"c"}}`, 400},
		{"NUL in env", "POST", "/code", `{"code":"1","env":{"A":"b\u0000c"}}`, 400},
		{"unknown field", "POST", "/code", `{"code":"1","lang":"r"}`, 400},
		{"valid code, no sandbox", "POST", "/code", `{"code":"1","language":"c++","timeout":2.5}`, 404},
		{"context bad language", "POST", "/contexts", `{"language":"-"}`, 400},
		{"context bad env", "POST", "/contexts", `{"env":{"":"x"}}`, 400},
		{"context NUL cwd", "POST", "/contexts", `{"cwd":"/a\u0000b"}`, 400},
		{"context, no sandbox", "POST", "/contexts", `{"language":"r"}`, 404},
		{"list, no sandbox", "GET", "/contexts", ``, 404},
		{"restart bad id", "POST", "/contexts/a%20b/restart", ``, 400},
		{"delete bad id", "DELETE", "/contexts/.x", ``, 400},
		{"delete, no sandbox", "DELETE", "/contexts/c1", ``, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := h.with(t)
			resp := h.request(tt.method, base+tt.path, h.a, strings.NewReader(tt.body))
			if resp.StatusCode != tt.status {
				e := apiErr(t, resp)
				t.Fatalf("status %d (%s: %s), want %d", resp.StatusCode, e.Code, e.Message, tt.status)
			}
			apiErr(t, resp)
		})
	}
	t.Run("websocket refused", func(t *testing.T) {
		h := h.with(t)
		resp := h.request("POST", base+"/code", h.a, strings.NewReader(`{"code":"1"}`), "Upgrade", "websocket", "Connection", "Upgrade")
		if resp.StatusCode != 400 {
			t.Errorf("status %d, want 400", resp.StatusCode)
		}
		resp.Body.Close()
	})
	t.Run("unauthenticated", func(t *testing.T) {
		h := h.with(t)
		resp := h.request("POST", base+"/code", "", strings.NewReader(`{"code":"1"}`))
		if resp.StatusCode != 401 {
			t.Errorf("status %d, want 401", resp.StatusCode)
		}
		resp.Body.Close()
	})
}
