package e2b_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-sh/kiln/internal/e2b"
	"github.com/kiln-sh/kiln/internal/e2b/envd"
	"github.com/kiln-sh/kiln/internal/sandbox"
)

// listedJSON is E2B's ListedSandbox / SandboxDetail as the SDKs decode it.
type listedJSON struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias"`
	ClientID        string            `json:"clientID"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
	EnvdAccessToken string            `json:"envdAccessToken"`
	Lifecycle       *struct {
		OnTimeout string `json:"onTimeout"`
	} `json:"lifecycle"`
}

type errorJSON struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// sdkMetadata encodes a metadata filter as the SDKs do: each key and
// value URL-encoded, joined as a query string, and that encoded again as
// the value of ?metadata=.
func sdkMetadata(md map[string]string) string {
	inner := url.Values{}
	for k, v := range md {
		inner.Set(url.QueryEscape(k), url.QueryEscape(v))
	}
	return url.QueryEscape(inner.Encode())
}

func TestControlPlane(t *testing.T) {
	h := newHarness(t)
	start := time.Now().Add(-time.Second)

	// v2 and v1 creates: the exact Sandbox shape.
	sbA := h.create(h.a, map[string]any{"templateID": "base", "timeout": 120,
		"metadata": map[string]string{"app": "a b&c=d", "n": "1"}, "envVars": map[string]string{"GREETING": "hi"}})
	var sbV1 sandboxJSON
	h.api("POST", "/sandboxes", h.a, map[string]any{"templateID": "base", "timeout": 60, "secure": true, "autoPause": true,
		"allow_internet_access": true, "metadata": map[string]string{"n": "2"}}, http.StatusCreated, &sbV1)
	sbB := h.create(h.b, map[string]any{"templateID": "base"})
	for _, sb := range []sandboxJSON{sbA, sbV1, sbB} {
		if ok, _ := regexp.MatchString(`^[a-z0-9]{20}$`, sb.SandboxID); !ok || sb.TemplateID != "base" || sb.Alias != "base" ||
			sb.ClientID == "" || sb.EnvdVersion != envd.Version || sb.EnvdAccessToken != e2b.AccessToken(h.secret, sandbox.ID(sb.SandboxID)) ||
			sb.Domain != nil || sb.TrafficAccessToken == nil || *sb.TrafficAccessToken != e2b.TrafficToken(h.secret, sandbox.ID(sb.SandboxID)) {
			t.Errorf("created sandbox %+v: want a 20-character id, template base, envd %s, its access and traffic tokens, null domain", sb, envd.Version)
		}
	}

	t.Run("get", func(t *testing.T) {
		h := h.with(t)
		var d listedJSON
		h.api("GET", "/sandboxes/"+sbA.SandboxID, h.a, nil, http.StatusOK, &d)
		if d.SandboxID != sbA.SandboxID || d.TemplateID != "base" || d.State != "running" || d.CPUCount < 1 ||
			d.MemoryMB < 64 || d.DiskSizeMB < 64 || d.EnvdVersion != envd.Version || d.EnvdAccessToken != sbA.EnvdAccessToken ||
			d.Metadata["app"] != "a b&c=d" || d.StartedAt.Before(start) || d.EndAt.Sub(d.StartedAt) < 119*time.Second ||
			d.EndAt.Sub(d.StartedAt) > 130*time.Second || d.Lifecycle == nil || d.Lifecycle.OnTimeout != "kill" {
			t.Errorf("detail %+v: want the created sandbox, running, ending ~120s after it started", d)
		}
		// Another tenant's sandbox is not found, with E2B's error JSON.
		var e errorJSON
		h.api("GET", "/sandboxes/"+sbA.SandboxID, h.b, nil, http.StatusNotFound, &e)
		if e.Code != 404 || e.Message == "" {
			t.Errorf("other tenant's sandbox: %+v, want code 404", e)
		}
	})

	t.Run("list", func(t *testing.T) {
		h := h.with(t)
		ids := func(ls []listedJSON) []string {
			var out []string
			for _, l := range ls {
				out = append(out, l.SandboxID)
			}
			slices.Sort(out)
			return out
		}
		both := []string{sbA.SandboxID, sbV1.SandboxID}
		slices.Sort(both)
		for _, tc := range []struct {
			name, query string
			want        []string
		}{
			{"all of a tenant", "", both},
			{"running", "?state=running", both},
			{"running and paused", "?state=running,paused", both},
			{"paused", "?state=paused", nil},
			{"metadata with escapes", "?metadata=" + sdkMetadata(map[string]string{"app": "a b&c=d"}), []string{sbA.SandboxID}},
			{"metadata, two pairs", "?metadata=" + sdkMetadata(map[string]string{"app": "a b&c=d", "n": "1"}), []string{sbA.SandboxID}},
			{"metadata, no match", "?metadata=" + sdkMetadata(map[string]string{"n": "3"}), nil},
			{"template", "?template=base", both},
		} {
			var got []listedJSON
			h.api("GET", "/v2/sandboxes"+tc.query, h.a, nil, http.StatusOK, &got)
			if !slices.Equal(ids(got), tc.want) {
				t.Errorf("%s: listed %v, want %v", tc.name, ids(got), tc.want)
			}
		}
		// Pages of one, newest first, then oldest first.
		for _, order := range []string{"desc", "asc"} {
			var seen []listedJSON
			q := "?limit=1&order=" + order
			for range 3 {
				var page []listedJSON
				hdr := h.api("GET", "/v2/sandboxes"+q, h.a, nil, http.StatusOK, &page)
				seen = append(seen, page...)
				next := hdr.Get("X-Next-Token")
				if next == "" {
					break
				}
				q = "?limit=1&order=" + order + "&nextToken=" + url.QueryEscape(next)
			}
			if len(seen) != 2 || !slices.Equal(ids(seen), both) {
				t.Fatalf("order %s: pages gave %v, want each of %v once", order, ids(seen), both)
			}
			if newestFirst := seen[0].StartedAt.After(seen[1].StartedAt); newestFirst != (order == "desc") {
				t.Errorf("order %s: %v then %v", order, seen[0].StartedAt, seen[1].StartedAt)
			}
		}
		var v1 []listedJSON
		h.api("GET", "/sandboxes?metadata="+sdkMetadata(map[string]string{"n": "2"}), h.a, nil, http.StatusOK, &v1)
		if !slices.Equal(ids(v1), []string{sbV1.SandboxID}) || v1[0].State != "running" {
			t.Errorf("v1 list: %+v, want %s running", v1, sbV1.SandboxID)
		}
	})

	t.Run("connect and timeout", func(t *testing.T) {
		h := h.with(t)
		var d0, d1, d2 listedJSON
		h.api("GET", "/sandboxes/"+sbV1.SandboxID, h.a, nil, http.StatusOK, &d0)
		if d0.Lifecycle == nil || d0.Lifecycle.OnTimeout != "pause" {
			t.Errorf("created with autoPause: lifecycle %+v, want onTimeout pause", d0.Lifecycle)
		}
		// Connect only extends: 600s > 60s left.
		var c sandboxJSON
		h.api("POST", "/v2/sandboxes/"+sbV1.SandboxID+"/connect", h.a, map[string]any{"timeout": 600}, http.StatusOK, &c)
		if c.SandboxID != sbV1.SandboxID || c.EnvdAccessToken != sbV1.EnvdAccessToken {
			t.Errorf("connect: %+v", c)
		}
		h.api("GET", "/sandboxes/"+sbV1.SandboxID, h.a, nil, http.StatusOK, &d1)
		if d1.EndAt.Sub(d0.EndAt) < 500*time.Second {
			t.Errorf("connect with 600s: end %v → %v, want extended", d0.EndAt, d1.EndAt)
		}
		h.api("POST", "/sandboxes/"+sbV1.SandboxID+"/connect", h.a, map[string]any{"timeout": 10}, http.StatusOK, nil)
		h.api("GET", "/sandboxes/"+sbV1.SandboxID, h.a, nil, http.StatusOK, &d2)
		if !d2.EndAt.Equal(d1.EndAt) {
			t.Errorf("connect with 10s shortened the end from %v to %v", d1.EndAt, d2.EndAt)
		}
		// setTimeout overwrites, shortening too.
		h.api("POST", "/sandboxes/"+sbV1.SandboxID+"/timeout", h.a, map[string]any{"timeout": 30}, http.StatusNoContent, nil)
		h.api("GET", "/sandboxes/"+sbV1.SandboxID, h.a, nil, http.StatusOK, &d2)
		if left := time.Until(d2.EndAt); left > 31*time.Second || left < 20*time.Second {
			t.Errorf("after timeout 30s: %v left", left)
		}
		h.api("POST", "/sandboxes/"+sbV1.SandboxID+"/refreshes", h.a, map[string]any{"duration": 90}, http.StatusNoContent, nil)
		h.api("GET", "/sandboxes/"+sbV1.SandboxID, h.a, nil, http.StatusOK, &d2)
		if left := time.Until(d2.EndAt); left < 80*time.Second {
			t.Errorf("after a refresh of 90s: %v left", left)
		}
		var e errorJSON
		h.api("POST", "/v2/sandboxes/"+sbV1.SandboxID+"/connect", h.b, nil, http.StatusNotFound, &e)
		if e.Code != 404 {
			t.Errorf("connect to another tenant's sandbox: %+v", e)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		h := h.with(t)
		var ms []struct {
			TimestampUnix int64   `json:"timestampUnix"`
			CPUCount      int     `json:"cpuCount"`
			CPUUsedPct    float64 `json:"cpuUsedPct"`
			MemUsed       int64   `json:"memUsed"`
			MemTotal      int64   `json:"memTotal"`
			DiskTotal     int64   `json:"diskTotal"`
		}
		h.api("GET", "/sandboxes/"+sbA.SandboxID+"/metrics", h.a, nil, http.StatusOK, &ms)
		if len(ms) != 1 || ms[0].TimestampUnix < start.Unix() || ms[0].CPUCount < 1 || ms[0].MemUsed <= 0 ||
			ms[0].MemTotal < ms[0].MemUsed || ms[0].DiskTotal <= 0 || ms[0].CPUUsedPct < 0 || ms[0].CPUUsedPct > 100 {
			t.Errorf("metrics %+v: want one sample with memory used below the total", ms)
		}
		// start and end (unix seconds) bound the samples: Kiln's one
		// sample is now, so only a window holding now has it.
		now := time.Now().Unix()
		for _, tc := range []struct {
			query string
			want  int
		}{
			{fmt.Sprintf("?start=%d", now-60), 1},
			{fmt.Sprintf("?start=%d&end=%d", now-60, now+60), 1},
			{fmt.Sprintf("?start=%d&end=%d", now-3600, now-1800), 0},
			{fmt.Sprintf("?start=%d", now+1800), 0},
		} {
			var got []json.RawMessage
			h.api("GET", "/sandboxes/"+sbA.SandboxID+"/metrics"+tc.query, h.a, nil, http.StatusOK, &got)
			if len(got) != tc.want {
				t.Errorf("metrics%s: %d samples, want %d", tc.query, len(got), tc.want)
			}
		}
		h.api("GET", "/sandboxes/"+sbA.SandboxID+"/metrics?start=x", h.a, nil, http.StatusBadRequest, nil)
		h.api("GET", fmt.Sprintf("/sandboxes/%s/metrics?start=%d&end=%d", sbA.SandboxID, now, now-10), h.a, nil, http.StatusBadRequest, nil)
	})

	t.Run("timestamps and startedAfter", func(t *testing.T) {
		h := h.with(t)
		// Every time in a response has one precision: RFC 3339, UTC,
		// microseconds; a sandbox's startedAt is the same wherever it is
		// shown.
		stampRE := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$`)
		type times struct {
			SandboxID string `json:"sandboxID"`
			StartedAt string `json:"startedAt"`
			EndAt     string `json:"endAt"`
			Timestamp string `json:"timestamp"`
		}
		var got times
		h.api("GET", "/sandboxes/"+sbA.SandboxID, h.a, nil, http.StatusOK, &got)
		var listed []times
		h.api("GET", "/v2/sandboxes?metadata="+sdkMetadata(map[string]string{"n": "1"}), h.a, nil, http.StatusOK, &listed)
		var ms []times
		h.api("GET", "/sandboxes/"+sbA.SandboxID+"/metrics", h.a, nil, http.StatusOK, &ms)
		if len(listed) != 1 || len(ms) != 1 {
			t.Fatalf("listed %+v, metrics %+v: want one of each", listed, ms)
		}
		for _, s := range []string{got.StartedAt, got.EndAt, listed[0].StartedAt, listed[0].EndAt, ms[0].Timestamp} {
			if !stampRE.MatchString(s) {
				t.Errorf("time %q: want RFC 3339 in UTC with six fractional digits", s)
			}
		}
		if listed[0].StartedAt != got.StartedAt {
			t.Errorf("startedAt %q in the list, %q in getInfo: want one", listed[0].StartedAt, got.StartedAt)
		}
		// startedAfter includes a sandbox started at exactly that instant
		// (E2B's filter is inclusive), and not one started before it.
		started, err := time.Parse(time.RFC3339Nano, got.StartedAt)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			after time.Time
			want  bool
		}{
			{started, true},
			{started.Add(-time.Microsecond), true},
			{started.Truncate(time.Millisecond), true}, // a JS Date's precision
			{started.Add(time.Microsecond), false},
		} {
			q := url.Values{"startedAfter": {tc.after.Format(time.RFC3339Nano)}}
			var page []times
			h.api("GET", "/v2/sandboxes?"+q.Encode(), h.a, nil, http.StatusOK, &page)
			found := slices.ContainsFunc(page, func(s times) bool { return s.SandboxID == sbA.SandboxID })
			if found != tc.want {
				t.Errorf("startedAfter %s (started %s): listed %v, want %v", q.Get("startedAfter"), got.StartedAt, found, tc.want)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		h := h.with(t)
		for _, tc := range []struct {
			name, method, path, key string
			body                    any
			status                  int
			message                 string
		}{
			{"unknown template", "POST", "/v2/sandboxes", h.a, map[string]any{"templateID": "nope"}, 404, "template 'nope' not found"},
			{"bad template name", "POST", "/sandboxes", h.a, map[string]any{"templateID": "../x"}, 404, "template '../x' not found"},
			{"unknown tag", "POST", "/v2/sandboxes", h.a, map[string]any{"templateID": "base:v2"}, 404, "template 'base:v2' not found"},
			{"bad tag", "POST", "/v2/sandboxes", h.a, map[string]any{"templateID": "base:../x"}, 404, "template 'base:../x' not found"},
			{"no key", "POST", "/v2/sandboxes", "", map[string]any{"templateID": "base"}, 401, ""},
			{"unknown key", "GET", "/v2/sandboxes", "e2b_0000000000000000000000000000000000000000", nil, 401, ""},
			{"unknown sandbox", "GET", "/sandboxes/abcdefgh12345678", h.a, nil, 404, ""},
			{"malformed id", "DELETE", "/sandboxes/NOT-AN-ID", h.a, nil, 404, ""},
			{"bad state", "GET", "/v2/sandboxes?state=gone", h.a, nil, 400, ""},
			{"bad token", "GET", "/v2/sandboxes?nextToken=zzz", h.a, nil, 400, ""},
			{"timeout past the limit", "POST", "/sandboxes/" + sbA.SandboxID + "/timeout", h.a, map[string]any{"timeout": 1 << 30}, 400, ""},
			{"unknown route", "GET", "/templates/xyz/nothing/abc", h.a, nil, 404, ""},
			{"network of a sandbox without one", "PUT", "/sandboxes/" + sbA.SandboxID + "/network", h.a,
				map[string]any{"allow_internet_access": false}, 409, ""},
		} {
			status, _, b := h.call(tc.method, tc.path, tc.body, "X-API-KEY", tc.key)
			var e errorJSON
			if err := json.Unmarshal(b, &e); err != nil || status != tc.status || e.Code != tc.status || e.Message == "" ||
				(tc.message != "" && e.Message != tc.message) {
				t.Errorf("%s: %d %s, want %d with {code:%d, message:%q}", tc.name, status, b, tc.status, tc.status, tc.message)
			}
		}
	})

	// E2B's "name:tag" form: the tag names the build (a built-in has only
	// the default tag), and an unknown tag is not found (above).
	t.Run("name:tag", func(t *testing.T) {
		h := h.with(t)
		sb := h.create(h.b, map[string]any{"templateID": "base:default"})
		if sb.Alias != "base:default" || sb.SandboxID == "" {
			t.Errorf("created %+v from base:default, want alias base:default", sb)
		}
		h.api("DELETE", "/sandboxes/"+sb.SandboxID, h.b, nil, http.StatusNoContent, nil)
	})

	t.Run("auto resume", func(t *testing.T) {
		h := h.with(t)
		sb := h.create(h.b, map[string]any{"templateID": "base", "autoPause": true, "autoResume": map[string]any{"enabled": true}})
		var d struct {
			State     string `json:"state"`
			Lifecycle struct {
				AutoResume bool   `json:"autoResume"`
				OnTimeout  string `json:"onTimeout"`
			} `json:"lifecycle"`
		}
		h.api("GET", "/sandboxes/"+sb.SandboxID, h.b, nil, http.StatusOK, &d)
		if d.Lifecycle.OnTimeout != "pause" || !d.Lifecycle.AutoResume {
			t.Errorf("lifecycle %+v, want onTimeout pause with autoResume", d.Lifecycle)
		}
		h.api("POST", "/sandboxes/"+sb.SandboxID+"/pause", h.b, nil, http.StatusNoContent, nil)
		// autoResume is in the sandbox's record: a new server knows it.
		h.ts = h.serve()
		status, _, b := h.call("GET", "/health", nil, "E2b-Sandbox-Id", sb.SandboxID, "E2b-Sandbox-Port", "49999")
		h.api("GET", "/sandboxes/"+sb.SandboxID, h.b, nil, http.StatusOK, &d)
		if status != 200 || d.State != "running" {
			t.Errorf("a data-plane request to the paused sandbox: %d %s, then %s; want it resumed", status, b, d.State)
		}
		h.api("DELETE", "/sandboxes/"+sb.SandboxID, h.b, nil, http.StatusNoContent, nil)
	})

	t.Run("quota", func(t *testing.T) {
		h := h.with(t)
		first := h.create(h.one, map[string]any{"templateID": "base"})
		var e errorJSON
		h.api("POST", "/v2/sandboxes", h.one, map[string]any{"templateID": "base"}, http.StatusTooManyRequests, &e)
		if e.Code != 429 || !strings.Contains(e.Message, "quota") {
			t.Errorf("second sandbox of a key with a quota of one: %+v, want code 429 (the SDK's RateLimitError)", e)
		}
		h.api("DELETE", "/sandboxes/"+first.SandboxID, h.one, nil, http.StatusNoContent, nil)
	})

	t.Run("kill", func(t *testing.T) {
		h := h.with(t)
		h.api("DELETE", "/sandboxes/"+sbB.SandboxID, h.a, nil, http.StatusNotFound, nil) // not a's
		h.api("DELETE", "/sandboxes/"+sbB.SandboxID, h.b, nil, http.StatusNoContent, nil)
		var e errorJSON
		h.api("DELETE", "/sandboxes/"+sbB.SandboxID, h.b, nil, http.StatusNotFound, &e)
		if e.Code != 404 {
			t.Errorf("second kill: %+v, want code 404 (the SDK returns false)", e)
		}
		h.api("GET", "/sandboxes/"+sbB.SandboxID, h.b, nil, http.StatusNotFound, nil)
		var l []listedJSON
		h.api("GET", "/v2/sandboxes", h.b, nil, http.StatusOK, &l)
		if len(l) != 0 {
			t.Errorf("after kill, b lists %+v", l)
		}
	})
}
