package e2b_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/e2b"
)

// jupyter returns the headers the code-interpreter SDK sends to sandbox
// sb, as header pairs.
func jupyter(sb sandboxJSON, token bool) []string {
	hdr := []string{"E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", strconv.Itoa(e2b.JupyterPort)}
	if sb.TrafficAccessToken != nil {
		hdr = append(hdr, "E2B-Traffic-Access-Token", *sb.TrafficAccessToken) // as the SDKs send it
	}
	if token {
		hdr = append(hdr, "X-Access-Token", sb.EnvdAccessToken)
	}
	return hdr
}

// execute runs POST /execute and returns its lines (on 200) and status.
func execute(h *harness, sb sandboxJSON, body map[string]any) ([]map[string]any, int) {
	h.t.Helper()
	status, _, b := h.call("POST", "/execute", body, jupyter(sb, true)...)
	if status != http.StatusOK {
		h.t.Logf("execute: %d %s", status, b)
		return nil, status
	}
	var lines []map[string]any
	for line := range bytes.Lines(b) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			h.t.Fatalf("line %q is not JSON: %v", line, err)
		}
		lines = append(lines, m)
	}
	if len(lines) == 0 || lines[len(lines)-1]["type"] != "end_of_execution" {
		h.t.Errorf("lines %v: want end_of_execution last", lines)
	}
	return lines, status
}

// ofType returns the lines of a type.
func ofType(lines []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

// mainText is the text of the main result.
func mainText(lines []map[string]any) string {
	for _, l := range ofType(lines, "result") {
		if l["is_main_result"] == true {
			s, _ := l["text"].(string)
			return s
		}
	}
	return ""
}

func TestExecute(t *testing.T) {
	h := newHarness(t, "code-interpreter")
	sb := h.create(h.a, map[string]any{"templateID": "code-interpreter", "envVars": map[string]string{"GLOBAL_VAR": "g"}})

	t.Run("state, output and results", func(t *testing.T) {
		h := h.with(t)
		lines, _ := execute(h, sb, map[string]any{"code": "x = 1\nprint('hello')\n'quoted'"})
		if got := mainText(lines); got != "quoted" {
			t.Errorf("main result text %q, want the quotes stripped", got)
		}
		out := ofType(lines, "stdout")
		if len(out) != 1 || out[0]["text"] != "hello\n" {
			t.Errorf("stdout lines %v", out)
		}
		if ts, _ := out[0]["timestamp"].(string); !strings.HasSuffix(ts, "Z") {
			t.Errorf("stdout timestamp %q: want ISO 8601 UTC", ts)
		} else if at, err := time.Parse(time.RFC3339Nano, ts); err != nil || time.Since(at) > time.Minute {
			t.Errorf("stdout timestamp %q: %v", ts, err)
		}
		// The user's first cell is number 1: the template's warm imports
		// and the restored kernel's environment update are hidden.
		n := ofType(lines, "number_of_executions")
		if len(n) != 1 || n[0]["execution_count"].(float64) != 1 {
			t.Errorf("number_of_executions lines of the first cell %v, want execution_count 1", n)
		}
		lines, _ = execute(h, sb, map[string]any{"code": "x + 1"})
		if got := mainText(lines); got != "2" {
			t.Errorf("x + 1 = %q: state was not kept", got)
		}
		if c := ofType(lines, "number_of_executions"); len(c) != 1 || c[0]["execution_count"].(float64) <= n[0]["execution_count"].(float64) {
			t.Errorf("execution count did not grow: %v then %v", n, c)
		}
	})

	t.Run("stdout and stderr in order", func(t *testing.T) {
		h := h.with(t)
		lines, _ := execute(h, sb, map[string]any{"code": "import sys, time\nfor i in range(3):\n    print(i, flush=True)\n    print('e', i, file=sys.stderr, flush=True)\n    time.sleep(0.2)"})
		var got []string // consecutive pieces of one stream joined (the kernel may split a print)
		for _, l := range lines {
			if l["type"] != "stdout" && l["type"] != "stderr" {
				continue
			}
			prefix := l["type"].(string)[3:] + ":"
			if n := len(got); n > 0 && strings.HasPrefix(got[n-1], prefix) && !strings.HasSuffix(got[n-1], "\n") {
				got[n-1] += l["text"].(string)
			} else {
				got = append(got, prefix+l["text"].(string))
			}
		}
		want := []string{"out:0\n", "err:e 0\n", "out:1\n", "err:e 1\n", "out:2\n", "err:e 2\n"}
		if !slices.Equal(got, want) {
			t.Errorf("output %q, want %q", got, want)
		}
	})

	t.Run("keepalive", func(t *testing.T) {
		h := h.with(t)
		lines, _ := execute(h, sb, map[string]any{"code": "import time\ntime.sleep(6)\n'awake'"})
		if len(ofType(lines, "keepalive")) == 0 || mainText(lines) != "awake" {
			t.Errorf("6 s of silence: lines %v, want a keepalive line before the result", lines)
		}
	})

	t.Run("error", func(t *testing.T) {
		h := h.with(t)
		lines, _ := execute(h, sb, map[string]any{"code": "undefined_name"})
		errs := ofType(lines, "error")
		if len(errs) != 1 || errs[0]["name"] != "NameError" || errs[0]["value"] != "name 'undefined_name' is not defined" ||
			!strings.Contains(errs[0]["traceback"].(string), "undefined_name") {
			t.Errorf("error lines %v", errs)
		}
	})

	t.Run("env vars", func(t *testing.T) {
		h := h.with(t)
		code := "import os\nprint(os.environ.get('GLOBAL_VAR'), os.environ.get('PER_RUN'))"
		lines, _ := execute(h, sb, map[string]any{"code": code, "env_vars": map[string]string{"PER_RUN": "p"}})
		if out := ofType(lines, "stdout"); len(out) != 1 || out[0]["text"] != "g p\n" {
			t.Errorf("with env_vars: %v", out)
		}
		lines, _ = execute(h, sb, map[string]any{"code": code})
		if out := ofType(lines, "stdout"); len(out) != 1 || out[0]["text"] != "g None\n" {
			t.Errorf("env_vars must not outlive their execution: %v", out)
		}
	})

	t.Run("dataframe", func(t *testing.T) {
		h := h.with(t)
		lines, _ := execute(h, sb, map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"})
		res := ofType(lines, "result")
		if len(res) != 1 {
			t.Fatalf("results %v", res)
		}
		r := res[0]
		data, _ := json.Marshal(r["data"])
		if !strings.Contains(r["html"].(string), "<table") || !strings.Contains(r["text"].(string), "a  b") ||
			string(data) != `{"a":[1,2],"b":["x","y"]}` {
			t.Errorf("DataFrame result: html %v, text %q, data %s", r["html"] != nil, r["text"], data)
		}
	})

	t.Run("matplotlib", func(t *testing.T) {
		h := h.with(t)
		lines, _ := execute(h, sb, map[string]any{"code": "import matplotlib.pyplot as plt\n" +
			"plt.plot([1, 2, 3], [1, 4, 9], label='squares')\nplt.title('Squares')\nplt.xlabel('x [m]')\nplt.show()"})
		res := ofType(lines, "result")
		if len(res) != 1 {
			t.Fatalf("results %v", res)
		}
		r := res[0]
		png, err := base64.StdEncoding.DecodeString(r["png"].(string))
		if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) || r["is_main_result"] != false ||
			!strings.HasPrefix(r["text"].(string), "<Figure size") {
			t.Errorf("figure result: png %d bytes (%v), text %q, main %v", len(png), err, r["text"], r["is_main_result"])
		}
		chart, _ := r["chart"].(map[string]any)
		if chart["type"] != "line" || chart["title"] != "Squares" || chart["x_label"] != "x [m]" || chart["x_unit"] != "m" {
			t.Errorf("chart %v: want a line chart titled Squares, x unit m", chart)
		}
		els, _ := chart["elements"].([]any)
		if len(els) != 1 {
			t.Fatalf("chart elements %v", els)
		}
		el := els[0].(map[string]any)
		pts, _ := json.Marshal(el["points"])
		if el["label"] != "squares" || string(pts) != "[[1,1],[2,4],[3,9]]" {
			t.Errorf("line element %v", el)
		}
	})

	t.Run("charts", func(t *testing.T) {
		h := h.with(t)
		for _, tc := range []struct {
			name, code string
			want       string // the chart's type and elements, JSON
		}{
			{"bar", "plt.bar(['a', 'b'], [3, 5], label='sales')",
				`bar [{"group":"sales","label":"a","value":3},{"group":"sales","label":"b","value":5}]`},
			{"pie", "plt.pie([1, 1], labels=['x', 'y'])",
				`pie [{"angle":180,"label":"x","radius":1},{"angle":180,"label":"y","radius":1}]`},
			// matplotlib's wedges come out as 323.99999141693115 and
			// 36.0000005364418 degrees; float noise is rounded off.
			{"pie without float noise", "plt.pie([90, 10], labels=['big', 'small'])",
				`pie [{"angle":324,"label":"big","radius":1},{"angle":36,"label":"small","radius":1}]`},
			{"bar without float noise", "plt.bar(['a', 'b'], [0.1 + 0.2, 1.23456789])",
				`bar [{"group":"group 0","label":"a","value":0.3},{"group":"group 0","label":"b","value":1.23456789}]`},
			{"scatter", "plt.scatter([1, 2], [3, 4], label='pts')",
				`scatter [{"label":"pts","points":[[1,3],[2,4]]}]`},
			{"box and whisker", "plt.boxplot([[1, 2, 3, 4, 5, 20]], labels=['A'])",
				`box_and_whisker [{"first_quartile":2.25,"label":"A","max":5,"median":3.5,"min":1,"outliers":[20],"third_quartile":4.75}]`},
			{"superchart", "fig, (a, b) = plt.subplots(1, 2)\na.plot([1, 2], [3, 4])\nb.bar(['q'], [1])",
				`superchart [line bar]`},
			{"blank figure", "plt.figure()", `<none>`},
		} {
			lines, _ := execute(h, sb, map[string]any{"code": "import matplotlib.pyplot as plt\n" + tc.code + "\nplt.show()"})
			var got string
			for _, r := range ofType(lines, "result") {
				chart, _ := r["chart"].(map[string]any)
				switch {
				case len(chart) == 0:
					got = "<none>"
				case chart["type"] == "superchart":
					var types []string
					for _, el := range chart["elements"].([]any) {
						types = append(types, el.(map[string]any)["type"].(string))
					}
					got = "superchart [" + strings.Join(types, " ") + "]"
				default:
					els, _ := json.Marshal(chart["elements"])
					got = chart["type"].(string) + " " + string(els)
				}
			}
			if got != tc.want {
				t.Errorf("%s: chart %s, want %s", tc.name, got, tc.want)
			}
		}
	})

	t.Run("PIL images", func(t *testing.T) {
		h := h.with(t)
		lines, _ := execute(h, sb, map[string]any{"code": "from PIL import Image\nim = Image.new('RGB', (20, 10), 'red')\nim.show()\ndisplay(im)\nim"})
		var pngs int
		for _, r := range ofType(lines, "result") {
			b, err := base64.StdEncoding.DecodeString(fmt.Sprint(r["png"]))
			if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
				t.Errorf("result without a PNG: %v", r)
				continue
			}
			pngs++
		}
		if pngs != 3 { // show(), display() and the cell's value
			t.Errorf("%d PNG results, want 3: %v", pngs, lines)
		}
	})

	t.Run("default contexts", func(t *testing.T) {
		h := h.with(t)
		var cs []struct{ ID, Language, Cwd string }
		status, _, b := h.call("GET", "/contexts", nil, jupyter(sb, false)...)
		if status != 200 || json.Unmarshal(b, &cs) != nil {
			t.Fatalf("list contexts: %d %s", status, b)
		}
		langs := map[string]string{}
		for _, c := range cs {
			langs[c.Language] = c.ID
		}
		if langs["python"] == "" || langs["javascript"] == "" {
			t.Fatalf("contexts %s: want the default python and javascript contexts", b)
		}
		lines, _ := execute(h, sb, map[string]any{"code": "console.log(6 * 7)", "context_id": langs["javascript"]})
		if out := ofType(lines, "stdout"); len(out) != 1 || out[0]["text"] != "42\n" {
			t.Errorf("the listed javascript context: %v", lines)
		}
		lines, _ = execute(h, sb, map[string]any{"code": "'x' in globals()", "context_id": langs["python"]})
		if got := mainText(lines); got != "True" {
			t.Errorf("the listed python context is not the default one: %v", lines)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		h := h.with(t)
		var c struct{ ID, Language, Cwd string }
		status, _, b := h.call("POST", "/contexts", map[string]any{"language": "python", "cwd": "/tmp"}, jupyter(sb, false)...)
		if status != 200 || json.Unmarshal(b, &c) != nil || c.ID == "" || c.Language != "python" || c.Cwd != "/tmp" {
			t.Fatalf("create context: %d %s", status, b)
		}
		lines, _ := execute(h, sb, map[string]any{"code": "import os\ny = 5\nos.getcwd()", "context_id": c.ID})
		if got := mainText(lines); got != "/tmp" {
			t.Errorf("cwd in the context: %q", got)
		}
		lines, _ = execute(h, sb, map[string]any{"code": "'y' in globals()"})
		if got := mainText(lines); got != "False" {
			t.Errorf("the default context sees the new context's variables: %q", got)
		}
		var cs []struct{ ID string }
		status, _, b = h.call("GET", "/contexts", nil, jupyter(sb, false)...)
		if status != 200 || json.Unmarshal(b, &cs) != nil || !slices.ContainsFunc(cs, func(x struct{ ID string }) bool { return x.ID == c.ID }) {
			t.Errorf("list contexts: %d %s", status, b)
		}
		if status, _, b := h.call("POST", "/contexts/"+c.ID+"/restart", nil, jupyter(sb, false)...); status != 200 || string(b) != "null\n" {
			t.Errorf("restart: %d %q", status, b)
		}
		lines, _ = execute(h, sb, map[string]any{"code": "'y' in globals()", "context_id": c.ID})
		if got := mainText(lines); got != "False" {
			t.Errorf("after restart, y survived: %q", got)
		}
		if status, _, b := h.call("DELETE", "/contexts/"+c.ID, nil, jupyter(sb, false)...); status != 200 || string(b) != "null\n" {
			t.Errorf("delete: %d %q", status, b)
		}
		for _, tc := range []struct {
			name   string
			body   map[string]any
			hdr    []string
			status int
			text   string
		}{
			{"deleted context", map[string]any{"code": "1", "context_id": c.ID}, jupyter(sb, true), 404, "Context " + c.ID + " not found\n"},
			{"context and language", map[string]any{"code": "1", "context_id": c.ID, "language": "python"}, jupyter(sb, true), 400,
				"Only one of context_id or language can be provided\n"},
			{"no access token", map[string]any{"code": "1"}, jupyter(sb, false), 401, ""},
		} {
			status, _, b := h.call("POST", "/execute", tc.body, tc.hdr...)
			if status != tc.status || (tc.text != "" && string(b) != tc.text) {
				t.Errorf("%s: %d %q, want %d %q", tc.name, status, b, tc.status, tc.text)
			}
		}
		if status, _, b := h.call("DELETE", "/contexts/"+c.ID, nil, jupyter(sb, false)...); status != 404 {
			t.Errorf("deleting again: %d %q, want 404", status, b)
		}
	})

	t.Run("client disconnect interrupts", func(t *testing.T) {
		h := h.with(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		b, _ := json.Marshal(map[string]any{"code": "import time\nprint('started', flush=True)\ntime.sleep(600)"})
		req, _ := http.NewRequestWithContext(ctx, "POST", h.ts.URL+"/execute", bytes.NewReader(b))
		hdr := jupyter(sb, true)
		for i := 0; i < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := h.ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && !strings.Contains(sc.Text(), "started") {
		}
		cancel()
		resp.Body.Close()
		// The default context is free again: the sleep was interrupted.
		done := make(chan string, 1)
		go func() {
			lines, _ := execute(h, sb, map[string]any{"code": "'free'"})
			done <- mainText(lines)
		}()
		select {
		case got := <-done:
			if got != "free" {
				t.Errorf("after the disconnect: %q", got)
			}
		case <-time.After(2 * time.Minute):
			t.Fatal("the next execution still waits for the abandoned one")
		}
	})
}
