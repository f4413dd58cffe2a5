package tools

import (
	"context"
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

// TestComputerArgs checks the computer tool's argument errors, which all
// come before anything runs in a sandbox (the client is nil).
func TestComputerArgs(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{`{}`, "action is required"},
		{`{"action":"fly"}`, `action "fly": want one of`},
		{`{"action":"left_click","coordinate":[10]}`, "want [x, y]"},
		{`{"action":"left_click","coordinate":[10.5,3]}`, "whole pixels"},
		{`{"action":"left_click","coordinate":[-1,3]}`, "whole pixels"},
		{`{"action":"left_click","coordinate":[1,99999]}`, "whole pixels"},
		{`{"action":"left_click","coordinate":["1","2"]}`, "must be a number"},
		{`{"action":"mouse_move"}`, "mouse_move needs coordinate"},
		{`{"action":"left_click_drag","coordinate":[1,2]}`, "needs start_coordinate"},
		{`{"action":"screenshot","coordinate":[1,2]}`, "screenshot takes no coordinate"},
		{`{"action":"type"}`, "type needs text"},
		{`{"action":"type","text":""}`, "text is empty"},
		{`{"action":"type","text":"a\u0000b"}`, "control character"},
		{`{"action":"type","text":"\u001b[2J"}`, "control character"},
		{`{"action":"type","text":"` + strings.Repeat("a", maxTypeText+1) + `"}`, "at most 4096"},
		{`{"action":"key","text":""}`, "want 1 to 16"},
		{`{"action":"key","text":"ctrl+$(id)"}`, `key "$(id)"`},
		{`{"action":"key","text":"--window 1 a"}`, `key "--window"`},
		{`{"action":"key","text":"` + strings.Repeat("a ", maxKeys+1) + `"}`, "want 1 to 16"},
		{`{"action":"hold_key","text":"shift"}`, "hold_key needs duration"},
		{`{"action":"hold_key","text":"shift","duration":31}`, "duration 31"},
		{`{"action":"wait","duration":-1}`, "duration -1"},
		{`{"action":"scroll","coordinate":[1,2]}`, "scroll needs scroll_direction"},
		{`{"action":"scroll","scroll_direction":"sideways"}`, `scroll_direction "sideways"`},
		{`{"action":"scroll","scroll_direction":"up","scroll_amount":0}`, "scroll_amount 0"},
		{`{"action":"scroll","scroll_direction":"up","scroll_amount":2.5}`, "scroll_amount 2.5"},
		{`{"action":"open","text":"-e evil"}`, "may not start with -"},
		{`{"action":"open","text":"a\nb"}`, "control characters"},
		{`{"action":"wait","text":"x"}`, "wait takes no text"},
		{`{"action":"left_click","button":1}`, `unknown field "button"`},
	} {
		res := computer(context.Background(), nil, "sb", json.RawMessage(tc.args))
		if !res.IsError || !strings.Contains(res.Content[0].Text, tc.want) {
			t.Errorf("%.80s: %+v, want an error with %q", tc.args, res.Content, tc.want)
		}
	}
}

func TestKeyCombos(t *testing.T) {
	got, err := keyCombos(" ctrl+s  Enter alt+F4 cmd+shift+t Page_Down ")
	if want := "ctrl+s Return alt+F4 super+shift+t Page_Down"; err != nil || strings.Join(got, " ") != want {
		t.Errorf("keyCombos: %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"ctrl+", "+", "a+b+c+d+e+f+g", "é", "ctrl-s", "`"} {
		if _, err := keyCombos(bad); err == nil {
			t.Errorf("keyCombos(%q) accepted", bad)
		}
	}
	if m, err := modifiers("Shift+control"); err != nil || strings.Join(m, ",") != "shift,ctrl" {
		t.Errorf("modifiers: %q, %v", m, err)
	}
	if _, err := modifiers("ctrl+a"); err == nil {
		t.Error("modifiers accepted a letter")
	}
}
