package tools

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDefinitions checks the one list of definitions against what the
// function-calling APIs accept: names OpenAI and Anthropic allow, object
// schemas whose required fields exist, no unknown fields allowed, and the
// three shapes carrying the same schema.
func TestDefinitions(t *testing.T) {
	name := regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
	for _, tl := range All() {
		if !name.MatchString(tl.Name) || len(tl.Description) < 40 {
			t.Errorf("%s: bad name or short description %q", tl.Name, tl.Description)
		}
		props, _ := tl.Schema["properties"].(map[string]any)
		if tl.Schema["type"] != "object" || props == nil || tl.Schema["additionalProperties"] != false {
			t.Errorf("%s: schema %v", tl.Name, tl.Schema)
		}
		for _, r := range tl.Schema["required"].([]string) {
			if _, ok := props[r]; !ok {
				t.Errorf("%s: required %s is no property", tl.Name, r)
			}
		}
		for p, v := range props {
			if d, _ := v.(map[string]any)["description"].(string); d == "" {
				t.Errorf("%s.%s: no description", tl.Name, p)
			}
		}
	}
	want, _ := json.Marshal(tools[0].Schema)
	for _, tc := range []struct {
		format string
		schema func(map[string]any) any
	}{
		{"openai", func(d map[string]any) any { return d["function"].(map[string]any)["parameters"] }},
		{"anthropic", func(d map[string]any) any { return d["input_schema"] }},
		{"mcp", func(d map[string]any) any { return d["inputSchema"] }},
	} {
		defs, err := Definitions(tools[:1], tc.format)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(defs)
		var got []map[string]any
		json.Unmarshal(b, &got)
		if s, _ := json.Marshal(tc.schema(got[0])); string(s) != string(want) {
			t.Errorf("%s schema %s, want %s", tc.format, s, want)
		}
	}
	if _, err := Definitions(All(), "gemini"); err == nil {
		t.Error("unknown format accepted")
	}
	if slices.ContainsFunc(ForSandbox(), func(t Tool) bool { return t.session }) || len(ForSandbox()) != len(All())-2 {
		t.Errorf("ForSandbox: %v", ForSandbox())
	}
}

// TestDecode checks the argument errors a model gets to read.
func TestDecode(t *testing.T) {
	var a struct {
		Code    string  `json:"code"`
		Timeout float64 `json:"timeout"`
	}
	for _, tc := range []struct{ args, want string }{
		{`{"code":"1"}`, ""},
		{``, "code is required"},
		{`{"code":"  "}`, "code is required"},
		{`{"code":1}`, "code must be a string, not number"},
		{`{"code":"1","timeout":"5s"}`, "timeout must be a number, not string"},
		{`{"code":"1","lang":"py"}`, `unknown field "lang"`},
		{`["code"]`, "want a JSON object"},
		{`{"code":`, "want a JSON object"},
	} {
		res := decode(json.RawMessage(tc.args), &a, "code")
		switch {
		case tc.want == "" && res != nil:
			t.Errorf("%s: %+v", tc.args, res)
		case tc.want != "" && (res == nil || !res.IsError || !strings.Contains(res.Content[0].Text, tc.want)):
			t.Errorf("%s: %+v, want %q", tc.args, res, tc.want)
		}
	}
}

func TestClip(t *testing.T) {
	s := strings.Repeat("a", maxText) + strings.Repeat("b", 100)
	got := clip(s)
	if len(got) > maxText+64 || !strings.HasPrefix(got, "aaa") || !strings.HasSuffix(got, "bbb") || !strings.Contains(got, "100 bytes cut") {
		t.Errorf("clip: %d bytes, %q...%q", len(got), got[:10], got[len(got)-10:])
	}
	if clip("short") != "short" {
		t.Error("short text changed")
	}
}

// TestAdmit checks the bounds on live HTTP sessions: per user, then none
// after Close.
func TestAdmit(t *testing.T) {
	hh := NewHTTPHandler(nil, HTTPOptions{})
	for i := range maxUserSessions {
		if !hh.admit("key_a", NewSession(nil, Options{})) {
			t.Fatalf("session %d refused", i)
		}
	}
	if hh.admit("key_a", nil) || !hh.admit("key_b", NewSession(nil, Options{})) || !hh.admit("", nil) {
		t.Error("per-user bound wrong")
	}
	if hh.Sessions() != maxUserSessions+1 {
		t.Errorf("%d sessions", hh.Sessions())
	}
	hh.mu.Lock()
	clear(hh.live) // their sandboxes are imaginary: nothing for Close to kill
	hh.mu.Unlock()
	hh.Close()
	if hh.admit("key_b", nil) {
		t.Error("admitted after Close")
	}
}

func TestSessionNode(t *testing.T) {
	for _, tc := range []struct {
		id, node string
		ok       bool
	}{
		{"0123456789abcdef0123456789abcdef.node-a", "node-a", true},
		{"0123456789abcdef0123456789abcdef.host.example.com", "host.example.com", true},
		{"0123456789abcdef0123456789abcdef", "", false},
		{"0123456789abcdef.node-a", "", false},
		{"0123456789abcdef0123456789abcdeg.node-a", "", false},
		{"0123456789abcdef0123456789abcdef.-bad", "", false},
		{"", "", false},
	} {
		if node, ok := SessionNode(tc.id); node != tc.node || ok != tc.ok {
			t.Errorf("SessionNode(%q) = %q, %v; want %q, %v", tc.id, node, ok, tc.node, tc.ok)
		}
	}
	id := nodeSessionID("node-b")
	if node, ok := SessionNode(id); node != "node-b" || !ok || id == nodeSessionID("node-b") {
		t.Errorf("nodeSessionID: %q → %q, %v (or not random)", id, node, ok)
	}
}
