package server_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/kiln-sh/kiln/api"
	"github.com/kiln-sh/kiln/internal/sandbox/sandboxtest"
)

// TestTemplateBuild builds a template through the API from JSON steps,
// follows its log to the end as NDJSON and over a WebSocket, makes a
// sandbox of it that sees what the steps did and gets the recipe's
// memory, then rebuilds it with every step cached.
func TestTemplateBuild(t *testing.T) {
	for _, rt := range sandboxtest.Runtimes {
		t.Run(rt, func(t *testing.T) {
			h, a, _, _ := templateHarness(t, rt, harnessOpts{})
			ctx := testCtx(t)
			spec := api.TemplateSpec{
				From: api.TemplateBase{Template: "base"},
				Steps: []api.TemplateStep{
					{Type: api.StepRun, Args: []string{"echo built-by-run > /opt/run.txt"}},
					{Type: api.StepEnv, Args: []string{"GREETING", "hi"}},
					{Type: api.StepWorkdir, Args: []string{"/opt"}},
				},
				MemoryMB: 256,
			}
			b, err := a.StartTemplateBuild(ctx, api.TemplateBuildRequest{Template: "tpl", Spec: spec})
			if err != nil {
				t.Fatal(err)
			}
			if b.Status != api.BuildBuilding || b.Tag != "default" || b.Steps != 3 {
				t.Errorf("started build: %+v", b)
			}
			logs := "/v1/templates/builds/" + b.ID + "/logs?follow=true"
			wsDone := make(chan []api.TemplateLogEntry, 1)
			go func() { wsDone <- followWS(t, h, logs) }()
			nd := followNDJSON(t, h, logs)
			ws := <-wsDone
			if len(nd) == 0 || !strings.Contains(nd[len(nd)-1].Message, "ready") {
				t.Fatalf("NDJSON log does not end with the build ready: %+v", nd)
			}
			if len(ws) != len(nd) {
				t.Errorf("WebSocket log has %d entries, NDJSON %d", len(ws), len(nd))
			}
			final, err := a.TemplateBuild(ctx, b.ID)
			if err != nil {
				t.Fatal(err)
			}
			if final.Status != api.BuildReady || final.FinishedAt == nil || final.Layers < 2 || final.CachedSteps != 0 {
				t.Fatalf("build after its log ended: %+v", final)
			}

			sb := h.create(h.a, api.CreateSandboxRequest{Template: "tpl", Runtime: rt})
			if sb.Limits.MemoryBytes != 256<<20 {
				t.Errorf("sandbox of the template has %d bytes of memory, want the recipe's 256 MiB", sb.Limits.MemoryBytes)
			}
			if got := sh(t, ctx, a, sb.ID, "cat run.txt; echo $GREETING; pwd"); got != "built-by-run\nhi\n/opt\n" {
				t.Errorf("sandbox of the template: %q", got)
			}

			timed := 0
			for _, e := range nd {
				timed += btoi(e.Event == api.LogDone && e.Step == 0 && e.ElapsedMs > 0)
			}
			if timed != 1 {
				t.Errorf("the first build's log has %d done lines of its RUN with the time it took, want 1", timed)
			}
			if final.StepsDone != 3 || final.StartedAt == nil || final.StartedAt.Before(final.CreatedAt) || final.FinishedAt.Before(*final.StartedAt) {
				t.Errorf("build: %d steps done, started %v (created %v, finished %v); want 3, in order", final.StepsDone, final.StartedAt, final.CreatedAt, final.FinishedAt)
			}

			again := build(t, ctx, a, "tpl", spec, api.BuildReady)
			if again.CachedSteps != 1 || again.StepsDone != 3 {
				t.Errorf("rebuild: %d steps done, %d cached, want 3 and 1 (the RUN)", again.StepsDone, again.CachedSteps)
			}
			// The counts are the build record's: reading the build (a
			// GET, a list row) reads no log.
			rec, err := h.store.GetBuild(ctx, again.ID)
			if err != nil || rec.CachedSteps != 1 || rec.StepsDone != 3 || !rec.StartedAt.Equal(*again.StartedAt) {
				t.Errorf("the rebuild's record: %d steps done, %d cached, started %v, %v", rec.StepsDone, rec.CachedSteps, rec.StartedAt, err)
			}
			rec.CachedSteps, rec.StepsDone = 2, 1
			if err := h.store.PutBuild(ctx, rec); err != nil {
				t.Fatal(err)
			}
			if got, err := a.TemplateBuild(ctx, again.ID); err != nil || got.CachedSteps != 2 || got.StepsDone != 1 {
				t.Errorf("GET of a build whose record says 1 done, 2 cached: %+v, %v", got, err)
			}
			// Log lines carry their stage, the recipe's size and events.
			var cached, done, ready int
			for _, e := range logOf(t, ctx, a, again.ID) {
				if e.Total != 3 || e.Stage == "" {
					t.Errorf("log line without its stage or the recipe's size: %+v", e)
				}
				cached += btoi(e.Cached && e.Step == 0 && e.Event == api.LogBegin)
				done += btoi(e.Event == api.LogDone)
				ready += btoi(e.Event == api.LogReady && e.Stage == "finalize")
			}
			if cached != 1 || done != 0 || ready != 1 {
				t.Errorf("rebuild's log: %d cached begin lines of step 0, %d done, %d ready; want 1, 0, 1", cached, done, ready)
			}
			for _, e := range logOf(t, ctx, a, again.ID) {
				if e.Step == 0 && !strings.HasSuffix(e.Message, "CACHED") || e.Output {
					t.Errorf("rebuild ran its RUN step: %+v", e)
				}
			}
			m := metricsText(t, h)
			for _, want := range []string{
				`kiln_template_builds_total{status="ready"} 2`,
				`kiln_template_build_steps_total{cached="false"} 1`,
				`kiln_template_build_steps_total{cached="true"} 1`,
				`kiln_template_build_seconds_count{result="ready"} 2`,
			} {
				if !strings.Contains(m, want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
		})
	}
}

// followNDJSON reads a build log stream to its end.
func followNDJSON(t *testing.T, h *harness, path string) []api.TemplateLogEntry {
	t.Helper()
	resp := h.request("GET", path, h.a, nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var es []api.TemplateLogEntry
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"type":"ping"`) {
			continue
		}
		var e api.TemplateLogEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Message == "" {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		es = append(es, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return es
}

// followWS reads a build log over a WebSocket until the server closes it
// normally.
func followWS(t *testing.T, h *harness, path string) []api.TemplateLogEntry {
	ctx := testCtx(t)
	url := "ws" + strings.TrimPrefix(h.ts.URL, "http") + path
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + h.a}}})
	if err != nil {
		t.Errorf("dialing %s: %v", path, err)
		return nil
	}
	defer c.CloseNow()
	var es []api.TemplateLogEntry
	for {
		_, b, err := c.Read(ctx)
		if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
			return es
		}
		if err != nil {
			t.Errorf("reading the log over a WebSocket after %d entries: %v", len(es), err)
			return es
		}
		if strings.Contains(string(b), `"type":"ping"`) {
			continue
		}
		var e api.TemplateLogEntry
		if err := json.Unmarshal(b, &e); err != nil {
			t.Errorf("WebSocket message %q: %v", b, err)
		}
		es = append(es, e)
	}
}

// metricValue is the value of one series in /metrics text (0 if absent).
func metricValue(text, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
